package beam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// Atoms (atom.h, index.h; internals.md §4). An atom term is its index in
// erts_atom_table shifted by 6 with the immediate tag 0xb. The table is an
// IndexTable: a Hash, then (measured on Debian's 27 and 29, amd64, where
// 27 exports erts_atom_table) int size at +0x6c, int limit at +0x70, int
// entries at +0x74 and the segment table at +0x78; entry i is
// seg_table[i >> 10][i & 0x3ff], an Atom with its byte length (u16) at
// +24 and its name at +32: a char * in 27, a heap binary term in 29 whose
// bytes start 16 bytes into the boxed object.
const (
	atomTagMask = 0x3f
	atomTag     = 0xb
	atomShift   = 6

	indexSize     = 0x6c
	indexLimit    = 0x70
	indexEntries  = 0x74
	indexSegTable = 0x78
	indexTabSize  = indexSegTable + 8
	indexPageBits = 10

	atomLen      = 24
	atomName     = 32
	atomHead     = atomName + 8
	heapBinBytes = 16
	boxedMask    = 3

	maxAtomBytes = 255 * 4 // MAX_ATOM_CHARACTERS, UTF-8
	maxAtoms     = 1 << 26
)

// atomScan bounds where the atom table is looked for: beam.smp's .bss
// after the ranges table (it lies 0x34f40-0x37f20 bytes after it in the
// four Debian builds; .bss is 0x3d428-0x40050 bytes).
const (
	atomScanBytes = 512 << 10
	atomScanChunk = 64 << 10
	atomRetry     = 30 * time.Second
)

var errNoAtomTable = errors.New("beam: atom table not found")

// atomTable is the address of erts_atom_table and its segment table.
type atomTable struct {
	addr, segTable uint64
}

func isAtom(term uint64) bool { return term&atomTagMask == atomTag }

// atomName returns the name of an atom term.
func (s *symbolizer) atomName(term uint64) (string, error) {
	if !isAtom(term) {
		return "", fmt.Errorf("%w: %#x is no atom", errBadObject, term)
	}
	return s.atoms.Get(term, func(string) bool { return true }, func() (string, error) {
		t, err := s.atomTable()
		if err != nil {
			return "", err
		}
		return s.readAtom(t, term>>atomShift)
	})
}

// atomTable finds erts_atom_table on first use. A failure is kept for
// atomRetry: the scan (about 0.5 ms) is too costly to repeat per frame,
// but a process caught early or a read that raced an exit must not lose
// its names for good.
func (s *symbolizer) atomTable() (atomTable, error) {
	s.atomsMu.Lock()
	defer s.atomsMu.Unlock()
	if s.atomTab.addr == 0 && (s.atomErr == nil || time.Since(s.atomFailed) >= atomRetry) {
		s.atomTab, s.atomErr = s.findAtomTable()
		s.atomFailed = time.Now()
	}
	return s.atomTab, s.atomErr
}

// readAtom reads the name of atom index i of the table t.
func (s *symbolizer) readAtom(t atomTable, i uint64) (string, error) {
	if i >= maxAtoms {
		return "", fmt.Errorf("%w: atom index %d", errBadObject, i)
	}
	seg, err := s.r.Ptr(t.segTable + 8*(i>>indexPageBits))
	if err != nil {
		return "", err
	}
	atom, err := s.r.Ptr(seg + 8*(i&(1<<indexPageBits-1)))
	if err != nil {
		return "", err
	}
	var head [atomHead]byte
	if err := s.r.Read(atom, head[:]); err != nil {
		return "", err
	}
	n := uint64(binary.LittleEndian.Uint16(head[atomLen:]))
	name := binary.LittleEndian.Uint64(head[atomName:])
	if n == 0 || n > maxAtomBytes {
		return "", fmt.Errorf("%w: atom %d of %d bytes", errBadObject, i, n)
	}
	if s.otp != 27 {
		// A boxed heap binary: the bytes follow its header and size.
		name = name&^boxedMask + heapBinBytes
	}
	b := make([]byte, n)
	if err := s.r.Read(name, b); err != nil {
		return "", err
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%w: atom %d is not UTF-8", errBadObject, i)
	}
	return string(b), nil
}

// findAtomTable scans the memory after the ranges table for an IndexTable
// whose counts are consistent and whose atoms 0 and 1 are false and true
// (the first atoms the emulator creates, atom.names). Exactly one must
// match.
func (s *symbolizer) findAtomTable() (atomTable, error) {
	base := s.tables.Ranges &^ 7
	var found []atomTable
	var prev []byte // the previous chunk's tail, for a table across chunks
	for off := uint64(0); off < atomScanBytes; off += atomScanChunk {
		chunk, err := s.r.ReadUpTo(base+off, atomScanChunk)
		if err != nil {
			break
		}
		buf := append(prev, chunk...)
		start := base + off - uint64(len(prev))
		for at := 0; at+indexTabSize <= len(buf); at += 8 {
			if t, ok := s.atomTableAt(start+uint64(at), buf[at:at+indexTabSize]); ok {
				found = append(found, t)
			}
		}
		if uint64(len(chunk)) < atomScanChunk {
			break
		}
		keep := min(len(buf), indexTabSize-8)
		prev = append([]byte(nil), buf[len(buf)-keep:]...)
	}
	if len(found) != 1 {
		return atomTable{}, fmt.Errorf("%w: %d candidates after %#x", errNoAtomTable, len(found), base)
	}
	return found[0], nil
}

// atomTableAt checks whether b, read at addr, is the atom table.
func (s *symbolizer) atomTableAt(addr uint64, b []byte) (atomTable, bool) {
	size := binary.LittleEndian.Uint32(b[indexSize:])
	limit := binary.LittleEndian.Uint32(b[indexLimit:])
	entries := binary.LittleEndian.Uint32(b[indexEntries:])
	seg := binary.LittleEndian.Uint64(b[indexSegTable:])
	if entries < 2 || entries > size || size > limit || limit > maxAtoms ||
		size%(1<<indexPageBits) != 0 || seg == 0 || seg%8 != 0 || seg >= procmem.MaxPointer {
		return atomTable{}, false
	}
	t := atomTable{addr: addr, segTable: seg}
	if f, err := s.readAtom(t, 0); err != nil || f != "false" {
		return atomTable{}, false
	}
	if tr, err := s.readAtom(t, 1); err != nil || tr != "true" {
		return atomTable{}, false
	}
	return t, true
}

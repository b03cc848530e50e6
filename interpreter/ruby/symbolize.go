package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strings"
)

// Bounds on what is read from a process, which may be hostile or change
// under the reader.
const (
	maxString    = 4096    // bytes of a label, path or name
	maxInsnInfos = 1 << 24 // entries of an instruction sequence's line table
)

// errBadObject says memory did not hold the object expected there: freed,
// moved by the garbage collector, or never one.
var errBadObject = errors.New("not the Ruby object expected")

// Frame is a Ruby frame as symbolized.
type Frame struct {
	// Function is a method's or block's label ("fib", "block in outer",
	// "<main>"), or a C function's method name, with its class where the
	// version keeps it readable ("Integer#times").
	Function string
	File     string
	Line     int
}

// Symbolizer names a process's frames from its memory.
type Symbolizer struct {
	mem io.ReaderAt
	l   *Layout
	// symbols is the process address of ruby_global_symbols.
	symbols uint64
}

// NewSymbolizer reads a process of version v through mem; symbols is the
// process address of ruby_global_symbols.
func NewSymbolizer(mem io.ReaderAt, v Version, symbols uint64) (*Symbolizer, error) {
	l, err := LayoutFor(v)
	if err != nil {
		return nil, err
	}
	return &Symbolizer{mem: mem, l: l, symbols: symbols}, nil
}

func (s *Symbolizer) word(addr uint64) (uint64, error) {
	var b [8]byte
	if _, err := s.mem.ReadAt(b[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("reading %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (s *Symbolizer) u32(addr uint64) (uint32, error) {
	var b [4]byte
	if _, err := s.mem.ReadAt(b[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("reading %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// ISeqFrame names the frame of instruction sequence iseq at pc (0: not
// started).
func (s *Symbolizer) ISeqFrame(iseq, pc uint64) (Frame, error) {
	if err := s.checkIMemo(iseq, imemoISeq); err != nil {
		return Frame{}, err
	}
	body, err := s.word(iseq + s.l.ISeqBody)
	if err != nil {
		return Frame{}, err
	}
	var f Frame
	if f.Function, err = s.stringAt(body + s.l.BodyLabel); err != nil {
		return Frame{}, fmt.Errorf("label: %w", err)
	}
	if f.File, err = s.path(body + s.l.BodyPathObj); err != nil {
		return Frame{}, fmt.Errorf("path: %w", err)
	}
	if f.Line, err = s.line(body, pc); err != nil {
		return Frame{}, fmt.Errorf("line: %w", err)
	}
	return f, nil
}

// CFuncFrame names a C function's frame by its method entry me.
func (s *Symbolizer) CFuncFrame(me uint64) (Frame, error) {
	if err := s.checkIMemo(me, imemoMEnt); err != nil {
		return Frame{}, err
	}
	def, err := s.word(me + s.l.MEDef)
	if err != nil {
		return Frame{}, err
	}
	id, err := s.word(def + s.l.DefOriginalID)
	if err != nil {
		return Frame{}, err
	}
	name, err := s.idName(id)
	if err != nil {
		return Frame{}, fmt.Errorf("method name: %w", err)
	}
	owner, err := s.word(me + s.l.MEOwner)
	if err != nil {
		return Frame{}, err
	}
	if class, sep := s.className(owner); class != "" {
		name = class + sep + name
	}
	return Frame{Function: name}, nil
}

// checkIMemo checks that addr holds an imemo of the type.
func (s *Symbolizer) checkIMemo(addr uint64, typ uint64) error {
	flags, err := s.word(addr)
	if err != nil {
		return err
	}
	if flags&typeMask != typeIMemo || flags>>imemoShift&imemoMask != typ {
		return fmt.Errorf("%w: flags %#x at %#x", errBadObject, flags, addr)
	}
	return nil
}

// line is the source line of pc in the body's line table: the entry of
// the instruction before pc (pc points past the one running), found
// through positions or, in release builds, the succinct index table
// (iseq.c's succ_index_lookup; internals.md §5).
func (s *Symbolizer) line(body, pc uint64) (int, error) {
	first, err := s.word(body + s.l.BodyFirstLine)
	if err != nil {
		return 0, err
	}
	firstLine := int(int32(first))
	if s.l.FirstLineFixnum {
		firstLine = int(int64(first) >> 1)
	}
	encoded, err := s.word(body + s.l.BodyEncoded)
	if err != nil {
		return 0, err
	}
	info := body + s.l.BodyInsnsInfo
	entries, err := s.word(info)
	if err != nil {
		return 0, err
	}
	positions, err := s.word(info + 8)
	if err != nil {
		return 0, err
	}
	n, err := s.u32(info + 16)
	if err != nil {
		return 0, err
	}
	table, err := s.word(info + 24)
	if err != nil {
		return 0, err
	}
	if pc == 0 || pc < encoded || n == 0 {
		return firstLine, nil
	}
	if n > maxInsnInfos {
		return 0, fmt.Errorf("%w: %d line table entries", errBadObject, n)
	}
	pos := (pc - encoded) / 8
	if pos > 0 {
		pos--
	}
	var idx uint64
	switch {
	case n == 1:
		idx = 0
	case positions != 0:
		// The last entry whose position is at or before pos.
		lo, hi := uint64(0), uint64(n)
		for lo+1 < hi {
			mid := (lo + hi) / 2
			p, err := s.u32(positions + 4*mid)
			if err != nil {
				return 0, err
			}
			if uint64(p) <= pos {
				lo = mid
			} else {
				hi = mid
			}
		}
		idx = lo
	default:
		rank, err := s.succRank(table, pos)
		if err != nil {
			return 0, err
		}
		if rank == 0 || rank > uint64(n) {
			return 0, fmt.Errorf("%w: line table rank %d of %d", errBadObject, rank, n)
		}
		idx = rank - 1
	}
	line, err := s.u32(entries + idx*s.l.InsnInfoSize)
	return int(int32(line)), err
}

// Succinct index table (iseq.c): the ranks of the first immediateSize
// positions packed 9 to a word, 7 bits each; the rest in blocks of 512
// positions: a base rank, the ranks of its 64-position small blocks (9
// bits each after the first), and the bits.
const (
	immediateSize  = 54
	succBlockStart = 48 // 6 words of immediate ranks
	succBlockSize  = 80 // u32 rank, pad, u64 small ranks, u64 bits[8]
)

func (s *Symbolizer) succRank(table, pos uint64) (uint64, error) {
	if table == 0 {
		return 0, fmt.Errorf("%w: no line table", errBadObject)
	}
	if pos < immediateSize {
		w, err := s.word(table + 8*(pos/9))
		return w >> (7 * (pos % 9)) & 0x7f, err
	}
	x := pos - immediateSize
	blk := table + succBlockStart + x/512*succBlockSize
	b := x % 512
	sb := b / 64
	base, err := s.u32(blk)
	if err != nil {
		return 0, err
	}
	small := uint64(0)
	if sb > 0 {
		ranks, err := s.word(blk + 8)
		if err != nil {
			return 0, err
		}
		small = ranks >> (9 * (sb - 1)) & 0x1ff
	}
	w, err := s.word(blk + 16 + 8*sb)
	if err != nil {
		return 0, err
	}
	return uint64(base) + small + uint64(bits.OnesCount64(w<<(63-b%64))), nil
}

// stringAt reads the String whose VALUE is at addr.
func (s *Symbolizer) stringAt(addr uint64) (string, error) {
	v, err := s.word(addr)
	if err != nil {
		return "", err
	}
	return s.str(v)
}

// str reads the String v.
func (s *Symbolizer) str(v uint64) (string, error) {
	if v == 0 || v&7 != 0 {
		return "", fmt.Errorf("%w: %#x is no String", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return "", err
	}
	if flags&typeMask != typeString {
		return "", fmt.Errorf("%w: %#x is no String (flags %#x)", errBadObject, v, flags)
	}
	var n, ptr uint64
	switch {
	case flags&strNoEmbed != 0:
		if n, err = s.word(v + s.l.StrLen); err != nil {
			return "", err
		}
		if ptr, err = s.word(v + s.l.StrPtr); err != nil {
			return "", err
		}
	case s.l.StrEmbedLenInFlags:
		n, ptr = flags>>14&0x1f, v+s.l.StrEmbedded
	default:
		if n, err = s.word(v + s.l.StrLen); err != nil {
			return "", err
		}
		ptr = v + s.l.StrEmbedded
	}
	if n > maxString {
		return "", fmt.Errorf("%w: String of %d bytes", errBadObject, n)
	}
	b := make([]byte, n)
	if _, err := s.mem.ReadAt(b, int64(ptr)); err != nil {
		return "", fmt.Errorf("reading a String at %#x: %w", ptr, err)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

// path reads the path of a pathobj: a String, or an Array [path, realpath]
// of which the first is the path backtraces show.
func (s *Symbolizer) path(addr uint64) (string, error) {
	v, err := s.word(addr)
	if err != nil {
		return "", err
	}
	if v == 0 || v&7 != 0 {
		return "", fmt.Errorf("%w: pathobj %#x", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return "", err
	}
	if flags&typeMask == typeArray {
		first, err := s.arrayEntry(v, flags, 0)
		if err != nil {
			return "", err
		}
		return s.str(first)
	}
	return s.str(v)
}

// arrayEntry reads element i of the Array v whose flags are given.
func (s *Symbolizer) arrayEntry(v, flags, i uint64) (uint64, error) {
	var n, elems uint64
	if flags&aryEmbedded != 0 {
		n, elems = flags&s.l.AryEmbedLenMask>>15, v+s.l.AryEmbedded
	} else {
		var err error
		if n, err = s.word(v + s.l.AryLen); err != nil {
			return 0, err
		}
		if elems, err = s.word(v + s.l.AryPtr); err != nil {
			return 0, err
		}
	}
	if i >= n {
		return 0, fmt.Errorf("%w: entry %d of an Array of %d", errBadObject, i, n)
	}
	return s.word(elems + 8*i)
}

// idName reads an ID's name from the global symbol table (symbol.c's
// get_id_serial_entry).
func (s *Symbolizer) idName(id uint64) (string, error) {
	serial := id
	if id > s.l.LastOpID {
		serial = id >> idScopeShift
	}
	last, err := s.u32(s.symbols)
	if err != nil {
		return "", err
	}
	if serial == 0 || serial > uint64(last) {
		return "", fmt.Errorf("%w: ID %#x (serial %d of %d)", errBadObject, id, serial, last)
	}
	ids, err := s.word(s.symbols + symbolsIDs)
	if err != nil {
		return "", err
	}
	chunk, err := s.arrayAt(ids, serial/idEntryUnit)
	if err != nil {
		return "", err
	}
	str, err := s.arrayAt(chunk, serial%idEntryUnit*idEntrySize)
	if err != nil {
		return "", err
	}
	return s.str(str)
}

// arrayAt reads element i of the Array v.
func (s *Symbolizer) arrayAt(v, i uint64) (uint64, error) {
	if v == 0 || v&7 != 0 {
		return 0, fmt.Errorf("%w: %#x is no Array", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return 0, err
	}
	if flags&typeMask != typeArray {
		return 0, fmt.Errorf("%w: %#x is no Array (flags %#x)", errBadObject, v, flags)
	}
	return s.arrayEntry(v, flags, i)
}

// className is a class's path and the separator of its methods: "#" for
// instance methods, "." for a singleton class's (the attached class's
// methods). Empty where the version keeps no readable path (before 3.3)
// or the class has none (anonymous).
func (s *Symbolizer) className(class uint64) (string, string) {
	if s.l.ClassPath == 0 || class == 0 || class&7 != 0 {
		return "", ""
	}
	flags, err := s.word(class)
	if err != nil {
		return "", ""
	}
	sep := "#"
	if flags&s.l.SingletonFlag != 0 {
		if class, err = s.word(class + s.l.SingletonAttached); err != nil || class == 0 || class&7 != 0 {
			return "", ""
		}
		sep = "."
	}
	path, err := s.word(class + s.l.ClassPath)
	if err != nil || path == 0 || path == s.l.Nil {
		return "", ""
	}
	name, err := s.str(path)
	if err != nil {
		return "", ""
	}
	return name, sep
}

package nativeunwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
)

// Finding the pclntab in an ELF file. The Go linker puts it in the
// .gopclntab section; external linkers keep that name for Go 1.18+ but
// older PIE builds merged it into .data.rel.ro, and files may have no
// section headers at all. Then the runtime.pclntab symbol or, failing
// that, a scan of the loaded segments for the header finds it.

// maxSegmentRead caps how much of one segment is read to scan it.
const maxSegmentRead = 1 << 30

// maxScanCandidates caps the header candidates tried per file.
const maxScanCandidates = 256

// elfImage reads an ELF file's loaded bytes by virtual address.
type elfImage struct {
	f *elf.File
	// mapped is the whole file in memory when the caller has it mapped:
	// reads are then slices of it, not copies.
	mapped []byte
}

// fileBytes returns n bytes at offset off of the mapped file, or false
// when the file is not mapped or they lie outside it.
func (m elfImage) fileBytes(off, n uint64) ([]byte, bool) {
	if m.mapped == nil || off > uint64(len(m.mapped)) || n > uint64(len(m.mapped))-off {
		return nil, false
	}
	return m.mapped[off : off+n : off+n], true
}

// sectionData returns an uncompressed section's bytes.
func (m elfImage) sectionData(s *elf.Section) ([]byte, error) {
	if s.Flags&elf.SHF_COMPRESSED == 0 {
		if b, ok := m.fileBytes(s.Offset, s.Size); ok {
			return b, nil
		}
	}
	return s.Data()
}

// segment returns the PT_LOAD segment whose file bytes contain
// [addr, addr+n).
func (m elfImage) segment(addr, n uint64) *elf.Prog {
	for _, p := range m.f.Progs {
		if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr-p.Vaddr > p.Filesz {
			continue
		}
		if n <= p.Filesz-(addr-p.Vaddr) {
			return p
		}
	}
	return nil
}

func (m elfImage) read(addr, n uint64) ([]byte, error) {
	p := m.segment(addr, n)
	if p == nil || n > maxSegmentRead {
		return nil, fmt.Errorf("%#x bytes at %#x are not in the file", n, addr)
	}
	if b, ok := m.fileBytes(p.Off+(addr-p.Vaddr), n); ok {
		return b, nil
	}
	b := make([]byte, n)
	if _, err := p.ReadAt(b, int64(addr-p.Vaddr)); err != nil {
		return nil, fmt.Errorf("reading %#x bytes at %#x: %w", n, addr, err)
	}
	return b, nil
}

// isCode says whether [addr, addr+n) lies in one executable segment. With
// no program headers there is nothing to check against.
func (m elfImage) isCode(addr, n uint64) bool {
	if len(m.f.Progs) == 0 {
		return true
	}
	p := m.segment(addr, n)
	return p != nil && p.Flags&elf.PF_X != 0
}

// openPclntab finds and parses the file's pclntab and resolves its text
// start.
func (m elfImage) openPclntab() (*pclntab, error) {
	f := m.f
	if s := f.Section(".gopclntab"); s != nil && s.Type == elf.SHT_PROGBITS {
		data, err := m.sectionData(s)
		if err != nil {
			return nil, fmt.Errorf("reading .gopclntab: %w", err)
		}
		t, err := parsePclntab(data, s.Addr, f.ByteOrder)
		if err != nil {
			return nil, fmt.Errorf(".gopclntab at %#x: %w", s.Addr, err)
		}
		return t, m.resolveText(t)
	}
	if !isGoFile(f) {
		return nil, ErrNoGoPclntab
	}
	if t, err := m.pclntabBySymbol(); t != nil || err != nil {
		return t, err
	}
	return m.scanPclntab()
}

// isGoFile says whether f carries a mark of the Go linker: one of its
// sections, or the Go build ID note, which stays in the program headers
// when the section headers are gone. It saves scanning other files.
func isGoFile(f *elf.File) bool {
	for _, name := range []string{".note.go.buildid", ".go.buildinfo", ".go.module", ".gosymtab"} {
		if f.Section(name) != nil {
			return true
		}
	}
	m := elfImage{f: f}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<16 {
			continue
		}
		b, err := m.readProg(p)
		if err == nil && hasGoNote(b, f.ByteOrder) {
			return true
		}
	}
	return false
}

func (m elfImage) readProg(p *elf.Prog) ([]byte, error) {
	if p.Filesz > maxSegmentRead {
		return nil, fmt.Errorf("segment at %#x: %#x bytes is too large to read", p.Vaddr, p.Filesz)
	}
	if b, ok := m.fileBytes(p.Off, p.Filesz); ok {
		return b, nil
	}
	b := make([]byte, p.Filesz)
	if _, err := p.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("reading segment at %#x: %w", p.Vaddr, err)
	}
	return b, nil
}

// hasGoNote looks for an ELF note named "Go" (the linker's build ID note,
// cmd/link/internal/ld/elf.go) in a PT_NOTE segment's bytes.
func hasGoNote(b []byte, order binary.ByteOrder) bool {
	for len(b) >= 12 {
		namesz, descsz := uint64(order.Uint32(b)), uint64(order.Uint32(b[4:]))
		name := (namesz + 3) &^ 3
		desc := (descsz + 3) &^ 3
		if 12+name+desc > uint64(len(b)) {
			return false
		}
		if namesz >= 2 && string(b[12:14]) == "Go" && (namesz == 2 || b[14] == 0) {
			return true
		}
		b = b[12+name+desc:]
	}
	return false
}

// pclntabBySymbol uses the runtime.pclntab and runtime.epclntab symbols.
// It returns nil, nil when they are missing.
func (m elfImage) pclntabBySymbol() (*pclntab, error) {
	syms, err := ReadSymbols(m.f, elf.SHT_SYMTAB)
	if err != nil {
		return nil, nil
	}
	var start, end uint64
	for _, s := range syms {
		switch s.Name {
		case "runtime.pclntab":
			start = s.Value
		case "runtime.epclntab":
			end = s.Value
		}
	}
	if start == 0 || end <= start {
		return nil, nil
	}
	data, err := m.read(start, end-start)
	if err != nil {
		return nil, fmt.Errorf("runtime.pclntab: %w", err)
	}
	t, err := parsePclntab(data, start, m.f.ByteOrder)
	if err != nil {
		return nil, fmt.Errorf("runtime.pclntab at %#x: %w", start, err)
	}
	return t, m.resolveText(t)
}

// scanPclntab looks for a header in every loaded segment and takes the
// first candidate whose function table holds up.
func (m elfImage) scanPclntab() (*pclntab, error) {
	tried := 0
	var lastErr error
	for _, p := range m.f.Progs {
		if p.Type != elf.PT_LOAD || p.Filesz < 8 {
			continue
		}
		data, err := m.readProg(p)
		if err != nil {
			return nil, err
		}
		for _, off := range headerCandidates(data, m.f.ByteOrder) {
			if tried++; tried > maxScanCandidates {
				return nil, fmt.Errorf("%w: no valid header among the first %d candidates (last: %v)", ErrNoGoPclntab, maxScanCandidates, lastErr)
			}
			t, err := parsePclntab(data[off:], p.Vaddr+uint64(off), m.f.ByteOrder)
			if err == nil {
				err = m.resolveText(t)
			}
			if err == nil {
				err = t.spotCheck()
			}
			if err == nil {
				return t, nil
			}
			lastErr = fmt.Errorf("candidate at %#x: %w", p.Vaddr+uint64(off), err)
		}
	}
	if lastErr != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoGoPclntab, lastErr)
	}
	return nil, ErrNoGoPclntab
}

// headerCandidates returns the offsets in b that start like a header:
// a known magic, two zero bytes, a plausible quantum and pointer size.
func headerCandidates(b []byte, order binary.ByteOrder) []int {
	var offs []int
	for _, magic := range []uint32{magic12, magic116, magic118, magic120} {
		var pat [6]byte
		order.PutUint32(pat[:], magic)
		for at := 0; len(offs) <= maxScanCandidates; {
			i := bytes.Index(b[at:], pat[:])
			if i < 0 {
				break
			}
			at += i
			if at+8 <= len(b) && (b[at+6] == 1 || b[at+6] == 2 || b[at+6] == 4) && (b[at+7] == 4 || b[at+7] == 8) {
				offs = append(offs, at)
			}
			at++
		}
	}
	return offs
}

// spotCheck reads the first and last functions and their names, and
// checks that the function table lies in code: enough to tell a real
// header from bytes that happen to look like one.
func (t *pclntab) spotCheck() error {
	if t.nfunc == 0 {
		return errors.New("no functions")
	}
	for _, i := range []int{0, t.nfunc - 1} {
		f, err := t.fn(i)
		if err != nil {
			return err
		}
		if f.end <= f.entry {
			return fmt.Errorf("function %d: end %#x not after entry %#x", i, f.end, f.entry)
		}
		if _, err := t.funcName(f); err != nil {
			return fmt.Errorf("function %d: %w", i, err)
		}
	}
	return nil
}

// resolveText sets the base of Go 1.18+ entry offsets when the header
// does not hold it (Go 1.2x writes zero there: runtime/symtab.go,
// pcHeader): from moduledata.text, else the runtime.text symbol. Either
// way the functions must then lie in an executable segment.
func (m elfImage) resolveText(t *pclntab) error {
	if t.version >= pcln118 && t.textStart == 0 {
		text, ok := m.moduledataText(t)
		if !ok {
			text, ok = m.symbol("runtime.text")
		}
		if !ok {
			return errors.New("pclntab: text start is not in the header and neither moduledata nor runtime.text was found")
		}
		t.textStart = text
	}
	if t.nfunc == 0 {
		return nil
	}
	lo, hi := t.entry(0), t.entry(t.nfunc)
	if hi < lo || !m.isCode(lo, hi-lo) {
		return fmt.Errorf("pclntab: functions [%#x,%#x) are not in an executable segment", lo, hi)
	}
	return nil
}

func (m elfImage) symbol(name string) (uint64, bool) {
	syms, err := ReadSymbols(m.f, elf.SHT_SYMTAB)
	if err != nil {
		return 0, false
	}
	for _, s := range syms {
		if s.Name == name {
			return s.Value, true
		}
	}
	return 0, false
}

// moduledata field indexes, in words (runtime/symtab.go, moduledata):
// pcHeader, then six slices of three words (funcnametab, cutab, filetab,
// pctab, pclntable, ftab), findfunctab, minpc, maxpc, text. The layout is
// the same from Go 1.16 on.
const (
	mdFuncnametab = 1
	mdText        = 22
)

// moduledataText finds the runtime's moduledata and returns its text field.
func (m elfImage) moduledataText(t *pclntab) (uint64, bool) {
	return m.moduledataWord(t, mdText)
}

// moduledataWord finds the runtime's moduledata by its first two words,
// which point at the pclntab header and its function name table, and
// returns its word at index idx.
func (m elfImage) moduledataWord(t *pclntab, idx int) (uint64, bool) {
	ps := t.ptrSize
	pat := make([]byte, 2*ps)
	put := func(b []byte, v uint64) {
		if ps == 4 {
			t.order.PutUint32(b, uint32(v))
		} else {
			t.order.PutUint64(b, v)
		}
	}
	put(pat, t.addr)
	put(pat[mdFuncnametab*ps:], t.addr+uint64(len(t.data)-len(t.funcnames)))
	for _, p := range m.f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_W == 0 {
			continue
		}
		data, err := m.readProg(p)
		if err != nil {
			continue
		}
		for at := 0; ; {
			i := bytes.Index(data[at:], pat)
			if i < 0 {
				break
			}
			at += i
			end := at + (idx+1)*ps
			if at%ps == 0 && end <= len(data) {
				w := data[at+idx*ps:]
				if ps == 4 {
					return uint64(t.order.Uint32(w)), true
				}
				return t.order.Uint64(w), true
			}
			at++
		}
	}
	return 0, false
}

package nativeunwind

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
)

// cfiSectionOf reads a CFI section, or returns nil if the file has none.
// Pointer bases it cannot find (.text and .got without section headers)
// stay 0: x86_64 and arm64 compilers do not use those encodings.
func cfiSectionOf(img elfImage, name string, arch *archInfo) (*cfiSection, error) {
	f := img.f
	s := f.Section(name)
	if s == nil && name == ".eh_frame" {
		// Without section headers, or with ones that leave .eh_frame out.
		// A NOBITS .eh_frame (a separate debug file) does not come here:
		// its program headers describe another file's contents.
		return ehFrameFromSegments(f, arch)
	}
	if s == nil || s.Type == elf.SHT_NOBITS || s.Size == 0 {
		return nil, nil
	}
	if s.Size > maxCFISectionSize {
		return nil, &FormatError{Section: name, Problem: fmt.Sprintf("size %d exceeds %d", s.Size, maxCFISectionSize)}
	}
	data, err := img.sectionData(s)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	sec := newCFISection(name, data, f.ByteOrder, arch)
	if sec.isEH {
		sec.bases = pointerBases{section: s.Addr, deref: derefFunc(f)}
		if t := f.Section(".text"); t != nil {
			sec.bases.text = t.Addr
		}
		if g := f.Section(".got"); g != nil {
			sec.bases.data = g.Addr
		}
	}
	return sec, nil
}

func newCFISection(name string, data []byte, order binary.ByteOrder, arch *archInfo) *cfiSection {
	return &cfiSection{
		name:    name,
		data:    data,
		isEH:    name == ".eh_frame",
		order:   order,
		ptrSize: 8,
		arch:    arch,
		cies:    map[int]*cie{},
	}
}

// sectionDeltas returns the deltas of one CFI section at address addr,
// without an ELF file around it (for tests and fuzzing).
func sectionDeltas(name string, data []byte, addr uint64, arch *archInfo) (Deltas, Stats, error) {
	st := Stats{Unsupported: map[string]int{}}
	sec := newCFISection(name, data, binary.LittleEndian, arch)
	if sec.isEH {
		sec.bases.section = addr
	}
	l, err := sec.layer(&st, nil)
	if err != nil {
		return nil, st, err
	}
	d, err := mergeLayers([]layer{l}, &st)
	return d, st, err
}

// derefFunc reads 8-byte words at virtual addresses of f's loaded data.
func derefFunc(f *elf.File) func(uint64) (uint64, bool) {
	return func(addr uint64) (uint64, bool) {
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr-p.Vaddr+8 > p.Filesz {
				continue
			}
			var b [8]byte
			if _, err := p.ReadAt(b[:], int64(addr-p.Vaddr)); err != nil {
				return 0, false
			}
			return f.ByteOrder.Uint64(b[:]), true
		}
		return 0, false
	}
}

// layer parses the section into a layer. FDEs that do not start in the
// file's code are skipped, the others cut where their code ends.
func (s *cfiSection) layer(st *Stats, code []addrRange) (layer, error) {
	// Compilers' CFI takes about six bytes per row and 50 per FDE; growing
	// the slices from nothing would copy them many times over.
	n := min(len(s.data), 64<<20)
	l := layer{rows: make([]Delta, 0, n/5+1), spans: make([]span, 0, n/48+1)}
	var cur *fde
	var reasons [numUnknownReasons]int
	row := func(loc uint64, fs *frameState) error {
		r, why := s.arch.rule(cur.cie, fs)
		reasons[why]++
		st.Rows++
		if n := len(l.rows); n > 0 && l.spans[len(l.spans)-1].first < n && l.rows[n-1].Rule == r {
			return nil
		}
		if len(l.rows) >= maxRows {
			return &FormatError{Section: s.name, Offset: cur.offset, Problem: fmt.Sprintf("more than %d rows", maxRows)}
		}
		l.rows = append(l.rows, Delta{Address: loc, Rule: r})
		return nil
	}
	var p program
	p.sec = s
	err := s.forEachFDE(st, func(f *fde) error {
		end, ok := clipToCode(code, f.start, f.end)
		if !ok {
			st.SkippedFDEs++
			return nil
		}
		st.FDEs++
		cur = f
		clipped := *f
		clipped.end = end
		l.spans = append(l.spans, span{start: f.start, end: end, first: len(l.rows)})
		// runFDE emits at least the row at f.start, which cut relies on.
		if err := p.runFDE(&clipped, row); err != nil {
			return err
		}
		l.spans[len(l.spans)-1].last = len(l.rows)
		return nil
	})
	for why, n := range reasons {
		if why != int(knownRule) && n > 0 {
			st.Unsupported[unknownReasonNames[why]] += n
		}
	}
	if err != nil {
		return layer{}, err
	}
	l.removeOverlaps(st)
	return l, nil
}

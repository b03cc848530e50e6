package nativeunwind

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
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

// fdeRange is an FDE found by the first pass of layer: where it is and the
// code it describes, [start, end).
type fdeRange struct {
	cie                      *cie
	start, end               uint64
	offset, insnsAt, insnsTo int
}

// layer parses the section into a layer. FDEs that do not start in the
// file's code are skipped, the others cut where their code ends.
//
// The FDEs are run in address order, not in the section's (which is the
// order of the linked objects, seldom the addresses'): each is cut to
// start where the previous one ended (linkers emit overlapping FDEs only
// for discarded code, so the choice of winner hardly matters; address
// order keeps it deterministic), and each gap between them gets a
// CFAUnknown row. The rows are then the layer's deltas as they are
// (layer.alone): merging a file's only layer copied them, a second 25 MiB
// for libLLVM's million deltas.
func (s *cfiSection) layer(st *Stats, code []addrRange) (layer, error) {
	// Compilers' CFI takes about six bytes per row and 50 per FDE; growing
	// the slices from nothing would copy them many times over.
	n := min(len(s.data), 64<<20)
	fdes := make([]fdeRange, 0, n/48+1)
	err := s.forEachFDE(st, func(f *fde) error {
		end, ok := clipToCode(code, f.start, f.end)
		if !ok {
			st.SkippedFDEs++
			return nil
		}
		st.FDEs++
		fdes = append(fdes, fdeRange{cie: f.cie, start: f.start, end: end,
			offset: f.offset, insnsAt: f.insnsAt, insnsTo: f.insnsAt + len(f.insns)})
		return nil
	})
	if err != nil {
		return layer{}, err
	}
	slices.SortStableFunc(fdes, func(a, b fdeRange) int { return cmpUint(a.start, b.start) })

	l := layer{rows: make([]Delta, 0, n/5+1), spans: make([]span, 0, len(fdes))}
	var cur *fdeRange
	var sp span
	// inForce is the rule of the FDE's last row before sp.start, where
	// the FDE was cut.
	var inForce Rule
	var reasons [numUnknownReasons]int
	emit := func(d Delta) error {
		if n := len(l.rows); n > sp.first && l.rows[n-1].Rule == d.Rule {
			return nil
		}
		if len(l.rows) >= maxRows {
			return &FormatError{Section: s.name, Offset: cur.offset, Problem: fmt.Sprintf("more than %d rows", maxRows)}
		}
		l.rows = append(l.rows, d)
		return nil
	}
	row := func(loc uint64, fs *frameState) error {
		r, why := s.arch.rule(cur.cie, fs)
		reasons[why]++
		st.Rows++
		switch {
		case loc < sp.start:
			inForce = r
			return nil
		case loc >= sp.end:
			return nil
		case len(l.rows) == sp.first && loc > sp.start:
			if err := emit(Delta{Address: sp.start, Rule: inForce}); err != nil {
				return err
			}
		}
		return emit(Delta{Address: loc, Rule: r})
	}
	var p program
	p.sec = s
	var prevEnd uint64
	for i := range fdes {
		cur = &fdes[i]
		start := cur.start
		if len(l.spans) > 0 {
			switch {
			case start < prevEnd:
				st.Overlaps++
				if cur.end <= prevEnd {
					continue
				}
				start = prevEnd
			case start > prevEnd:
				l.rows = append(l.rows, Delta{Address: prevEnd})
			}
		}
		sp, inForce = span{start: start, end: cur.end, first: len(l.rows)}, Rule{}
		f := fde{offset: cur.offset, cie: cur.cie, start: cur.start, end: cur.end,
			insns: s.data[cur.insnsAt:cur.insnsTo], insnsAt: cur.insnsAt}
		// runFDE emits at least the row at f.start, so that the span
		// has its row at sp.start: the one in force there where cut.
		if err := p.runFDE(&f, row); err != nil {
			return layer{}, err
		}
		if len(l.rows) == sp.first {
			if err := emit(Delta{Address: sp.start, Rule: inForce}); err != nil {
				return layer{}, err
			}
		}
		sp.last = len(l.rows)
		l.spans = append(l.spans, sp)
		prevEnd = sp.end
	}
	for why, n := range reasons {
		if why != int(knownRule) && n > 0 {
			st.Unsupported[unknownReasonNames[why]] += n
		}
	}
	if len(l.spans) > 0 {
		l.rows = append(l.rows, Delta{Address: prevEnd})
		l.alone = l.rows
	}
	return l, nil
}

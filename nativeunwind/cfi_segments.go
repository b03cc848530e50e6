package nativeunwind

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
)

// Files without section headers (stripped with sstrip or objcopy
// --strip-section-headers, packed, or read from memory) keep what the
// runtime unwinder itself relies on: PT_GNU_EH_FRAME locates
// .eh_frame_hdr, whose eh_frame_ptr locates .eh_frame. The size of
// .eh_frame is nowhere; its zero terminator ends it.

// ehFrameFromSegments finds .eh_frame through PT_GNU_EH_FRAME, or returns
// nil if the file has no such program header.
func ehFrameFromSegments(f *elf.File, arch *archInfo) (*cfiSection, error) {
	var hdr *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_GNU_EH_FRAME {
			hdr = p
			break
		}
	}
	if hdr == nil || hdr.Filesz == 0 {
		return nil, nil
	}
	// The binary search table is not needed, only the fields before it.
	head := make([]byte, min(hdr.Filesz, ehFrameHdrHeadSize))
	if _, err := hdr.ReadAt(head, 0); err != nil {
		return nil, fmt.Errorf("reading %s at file offset %#x (PT_GNU_EH_FRAME): %w", ehFrameHdrName, hdr.Off, err)
	}
	addr, err := ehFramePtr(head, hdr.Vaddr, f.ByteOrder)
	if err != nil {
		return nil, err
	}
	data, err := loadedBytes(f, addr, maxCFISectionSize)
	if err != nil {
		return nil, fmt.Errorf("reading .eh_frame at eh_frame_ptr %#x of %s: %w", addr, ehFrameHdrName, err)
	}
	sec := newCFISection(".eh_frame", data, f.ByteOrder, arch)
	// What follows the terminator in the segment (.gcc_except_table, say)
	// is not CFI.
	sec.data = data[:sec.terminatorEnd()]
	sec.bases = pointerBases{section: addr, deref: derefFunc(f)}
	return sec, nil
}

// loadedBytes returns the file bytes of the PT_LOAD segment holding
// address addr, from addr to the segment's end but at most limit of them.
func loadedBytes(f *elf.File, addr, limit uint64) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr-p.Vaddr >= p.Filesz {
			continue
		}
		// debug/elf has checked that Filesz fits an int64, and so does
		// off < Filesz. ReadAll allocates as the bytes come: a segment
		// size beyond the file's end costs no large allocation.
		off, n := addr-p.Vaddr, min(p.Filesz-(addr-p.Vaddr), limit)
		data, err := io.ReadAll(io.NewSectionReader(p, int64(off), int64(n)))
		if err != nil {
			return nil, err
		}
		if uint64(len(data)) < n {
			return nil, fmt.Errorf("segment at %#x: the file holds %d of its %d bytes from there", p.Vaddr, len(data), n)
		}
		return data, nil
	}
	return nil, errors.New("not in the file bytes of a loaded segment")
}

// terminatorEnd returns where the section's entries end: after the first
// zero length field (libgcc's end mark), or at the end of the data if
// there is none or an entry is malformed (for the parser to report).
func (s *cfiSection) terminatorEnd() int {
	r := &reader{data: s.data, end: len(s.data), order: s.order}
	for r.remaining() >= 4 {
		at := r.pos
		if r.u32("entry length") == 0 {
			return r.pos
		}
		r.pos = at
		end, _, _, _ := s.entryHeader(r)
		if !r.ok() {
			return len(s.data)
		}
		r.pos = end
	}
	return len(s.data)
}

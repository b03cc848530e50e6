package debuginfo

import (
	"errors"
	"fmt"
)

// A DWARF 5 line table header lists its directories and files as a count
// followed by entries in a format it describes. debug/dwarf allocates the
// count's worth up front and reads entry after entry: with a format whose
// entries take no bytes (no forms, or only DW_FORM_flag_present) a 60 KB
// file made it allocate millions of entries on every lookup, a minute of
// CPU for one fuzzed input, and a large count could exhaust memory.
// checkLineHeader refuses such a header before debug/dwarf reads it.

var errLineHeader = errors.New("line table header")

// checkLineHeader checks that the directory and file counts of the DWARF 5
// line table header at off in line fit in the header's bytes. Older
// versions end their lists with a terminator, which bounds them already.
// A form it does not know ends the check: debug/dwarf refuses those.
func checkLineHeader(line []byte, off uint64) error {
	if off >= uint64(len(line)) {
		return fmt.Errorf("%w at %#x: past the end of .debug_line", errLineHeader, off)
	}
	h := dwarfReader{b: line, pos: int(off)}
	offSize := 4
	if h.u32() == 0xffffffff {
		offSize = 8
		h.skip(8)
	}
	version := h.u16()
	if h.err || version < 5 {
		return nil
	}
	h.skip(2) // address and segment selector sizes
	headerLength := h.offset(offSize)
	headerEnd := uint64(h.pos) + headerLength
	if h.err || headerEnd > uint64(len(line)) || headerEnd < uint64(h.pos) {
		return fmt.Errorf("%w at %#x: longer than .debug_line", errLineHeader, off)
	}
	h.b = line[:headerEnd]
	h.skip(5) // instruction length, ops per instruction, default_is_stmt, line base, line range
	opcodeBase := h.u8()
	h.skip(int(opcodeBase) - 1)
	for _, what := range []string{"directories", "files"} {
		forms, minSize := h.formats(offSize)
		count := h.uleb()
		if h.err {
			return nil // debug/dwarf reports the short header
		}
		left := uint64(len(h.b) - h.pos)
		switch {
		case count > 0 && minSize == 0:
			return fmt.Errorf("%w at %#x: %d %s whose entries take no bytes", errLineHeader, off, count, what)
		case minSize > 0 && count > left/minSize:
			return fmt.Errorf("%w at %#x: %d %s in %d bytes", errLineHeader, off, count, what, left)
		}
		for range count {
			for _, form := range forms {
				if !h.skipForm(form, offSize) {
					return nil
				}
			}
		}
	}
	return nil
}

// formats reads an entry format description: its forms and the fewest
// bytes an entry in it takes.
func (h *dwarfReader) formats(offSize int) (forms []uint64, minSize uint64) {
	n := h.u8()
	for range n {
		h.uleb() // content type
		form := h.uleb()
		forms = append(forms, form)
		minSize += formMinSize(form, offSize)
	}
	return forms, minSize
}

// formMinSize is the fewest bytes a value of form takes; 0 for forms that
// take none and for forms it does not know.
func formMinSize(form uint64, offSize int) uint64 {
	switch form {
	case formString, formBlock, formSdata, formUdata, formStrx, formData1, formFlag, formStrx1, formBlock1:
		return 1
	case formData2, formStrx2, formBlock2:
		return 2
	case formStrx3:
		return 3
	case formData4, formStrx4, formBlock4:
		return 4
	case formData8:
		return 8
	case formData16:
		return 16
	case formStrp, formLineStrp, formStrpSup, formSecOffset:
		return uint64(offSize)
	}
	return 0
}

// skipForm skips a value of form; false for a form it does not know or a
// value past the header's end.
func (h *dwarfReader) skipForm(form uint64, offSize int) bool {
	switch form {
	case formString:
		for h.u8() != 0 && !h.err {
		}
	case formSdata, formUdata, formStrx:
		h.uleb()
	case formBlock:
		h.skip(int(min(h.uleb(), uint64(len(h.b)))))
	case formBlock1:
		h.skip(int(h.u8()))
	case formBlock2:
		h.skip(int(h.u16()))
	case formBlock4:
		h.skip(int(min(uint64(h.u32()), uint64(len(h.b)))))
	case formFlagPresent:
	default:
		n := formMinSize(form, offSize)
		if n == 0 {
			return false
		}
		h.skip(int(n))
	}
	return !h.err
}

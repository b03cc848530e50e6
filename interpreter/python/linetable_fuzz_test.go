package python

import (
	"errors"
	"math"
	"testing"
)

// FuzzLineTable decodes arbitrary tables in every format: the decoder must
// answer with a line, no line or an error, never panic or hang, and reading
// a table up to an offset must not fail where reading it up to a larger
// offset did not.
func FuzzLineTable(f *testing.F) {
	seeds := []struct {
		format LineTableFormat
		table  []byte
	}{
		{LineTableLnotab, []byte{6, 1, 44, 5, 255, 0, 45, 127, 0, 73, 11, 1}},
		{LineTableLnotab, []byte{0, 0x80, 4, 0x81, 2, 0x7f}},
		{LineTableRanges, []byte{0, 127, 0, 127, 254, 6, 254, 0, 10, 0x81}},
		{LineTableRanges, []byte{2, 1, 4, 0x80, 2, 1}},
		{LineTableLocations, []byte{0x80, 0x00, 0xd8, 0x09, 0x0a, 0xd8, 0x09, 0x0a, 0xf1, 0x03, 0x01, 0x0a, 0x0b, 0x80, 0x41, 0xe0, 0x0b, 0x0c, 0x80, 0x48}},
		{LineTableLocations, ltCat(ltEntry(14, 3, 0x50, 0x1f, 0x00, 0x01, 0x05), ltEntry(15, 2), ltEntry(13, 8, 0x07))},
	}
	for _, s := range seeds {
		f.Add(uint8(s.format), s.table, int32(100), uint32(6))
	}
	f.Fuzz(func(t *testing.T, format uint8, table []byte, first int32, offset uint32) {
		line, ok, err := LineForOffset(LineTableFormat(format), table, int(first), offset)
		switch {
		case err != nil && (ok || line != 0):
			t.Fatalf("error %v with line %d ok %v", err, line, ok)
		case err != nil && !errors.Is(err, ErrLineTableMalformed) && !errors.Is(err, ErrLineTableVersion):
			t.Fatalf("unexpected error %v", err)
		case ok && (line < 0 || line > math.MaxInt32):
			t.Fatalf("line %d out of range", line)
		case !ok && line != 0:
			t.Fatalf("line %d without ok", line)
		}
		if err == nil {
			if _, _, err := LineForOffset(LineTableFormat(format), table, int(first), offset/2); err != nil {
				t.Fatalf("offset %d decodes but offset %d fails: %v", offset, offset/2, err)
			}
		}
	})
}

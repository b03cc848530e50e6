package python

import (
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzSymbolizeFrame symbolizes a frame whose code object lies in a fake
// process memory of arbitrary contents, under any layout of the table. The
// symbolizer must answer with a frame or one of its errors, never panic,
// never read more than its caps, and answer a second lookup (from its
// cache) as it did the first.
func FuzzSymbolizeFrame(f *testing.F) {
	layouts := symAllOffsets(f)
	for i, off := range layouts {
		format, err := LineTableFormatFor(off.Version)
		if err != nil {
			f.Fatal(err)
		}
		m := newSymImage(off)
		c := &symCode{name: "naïve", qualname: "类.naïve", file: "/srv/𠀀/mod.py", first: 10, table: symTestTable[format]}
		m.code(c)
		f.Add(uint8(i), m.data, uint32(c.addr-symImageBase), uint32(4))
		f.Add(uint8(i), m.data, uint32(c.addr-symImageBase), uint32(OffsetNotStarted))
	}
	f.Fuzz(func(t *testing.T, layout uint8, image []byte, codeOffset, offset uint32) {
		off := layouts[int(layout)%len(layouts)]
		mem := &symCapMem{symMem: symMem{regions: []symRegion{{symImageBase, image}}}}
		s, err := NewSymbolizer(mem, off)
		if err != nil {
			t.Fatal(err)
		}
		addr := symImageBase + uint64(codeOffset)
		got, err := s.Frame(addr, offset)
		switch {
		case err != nil && got != (Frame{}):
			t.Fatalf("error %v with frame %+v", err, got)
		case err != nil && !errors.Is(err, ErrNotCode) && !errors.Is(err, ErrBadObject) &&
			!errors.Is(err, ErrUnreadable) && !errors.Is(err, ErrLineTableMalformed):
			t.Fatalf("unexpected error %v", err)
		case !utf8.ValidString(got.FunctionName) || !utf8.ValidString(got.FileName):
			t.Fatalf("invalid UTF-8 in %+v", got)
		case len(got.FunctionName) > 4*symMaxStringChars || len(got.FileName) > 4*symMaxStringChars:
			t.Fatalf("names of %d and %d bytes", len(got.FunctionName), len(got.FileName))
		case got.Line < 0:
			t.Fatalf("line %d", got.Line)
		case mem.largest > symMaxTableBytes:
			t.Fatalf("read %d bytes at once", mem.largest)
		}
		again, err2 := s.Frame(addr, offset)
		if again != got || (err == nil) != (err2 == nil) {
			t.Fatalf("first %+v, %v; then %+v, %v", got, err, again, err2)
		}
	})
}

// symCapMem records the largest read asked of it.
type symCapMem struct {
	symMem
	largest int
}

func (m *symCapMem) ReadAt(p []byte, off int64) (int, error) {
	m.largest = max(m.largest, len(p))
	return m.symMem.ReadAt(p, off)
}

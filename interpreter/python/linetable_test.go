package python

import (
	"errors"
	"math"
	"testing"
)

// ltNone is the expected line of an offset the table gives no line.
const ltNone = -1

// ltWant is the expected line of one bytecode offset.
type ltWant struct {
	offset uint32
	line   int
}

// ltEntry builds a 3.11+ location entry covering units code units.
func ltEntry(code, units byte, rest ...byte) []byte {
	return append([]byte{0x80 | code<<3 | (units - 1)}, rest...)
}

func ltCat(entries ...[]byte) []byte {
	var b []byte
	for _, e := range entries {
		b = append(b, e...)
	}
	return b
}

func TestLineForOffset(t *testing.T) {
	tests := []struct {
		name   string
		format LineTableFormat
		table  []byte
		first  int
		want   []ltWant
	}{
		{"lnotab empty", LineTableLnotab, nil, 7, []ltWant{{0, 7}, {100, 7}}},
		{
			// The example of lnotab_notes.txt: offsets 0, 6, 50, 350, 361
			// start lines 1, 2, 7, 207, 208; the jump of 300 bytes and 200
			// lines is split into (255, 0), (45, 127), (0, 73).
			"lnotab notes example", LineTableLnotab,
			[]byte{6, 1, 44, 5, 255, 0, 45, 127, 0, 73, 11, 1}, 1,
			[]ltWant{{0, 1}, {4, 1}, {6, 2}, {49, 2}, {50, 7}, {300, 7}, {349, 7}, {350, 207}, {360, 207}, {361, 208}, {1000, 208}},
		},
		{
			"lnotab negative deltas", LineTableLnotab,
			[]byte{0, 0x80, 4, 0x81, 2, 0x7f}, 300,
			[]ltWant{{0, 172}, {2, 172}, {4, 45}, {5, 45}, {6, 172}, {100, 172}},
		},
		{"lnotab negative line", LineTableLnotab, []byte{0, 0xfe}, 1, []ltWant{{0, ltNone}}},

		{"3.10 empty", LineTableRanges, nil, 7, []ltWant{{0, ltNone}}},
		{
			// def f():\n    x = 1\n    return x on line 2, by 3.10.13.
			"3.10 compiler output", LineTableRanges, []byte{4, 1, 4, 1}, 2,
			[]ltWant{{0, 3}, {2, 3}, {4, 4}, {6, 4}, {8, ltNone}},
		},
		{
			// -128 marks a range without a line and leaves the line as is.
			"3.10 no line", LineTableRanges, []byte{2, 1, 4, 0x80, 2, 1}, 10,
			[]ltWant{{0, 11}, {2, ltNone}, {5, ltNone}, {6, 12}, {8, ltNone}},
		},
		{
			// Empty (0, 127) ranges move the line; (254, 0) continues a range.
			"3.10 extensions", LineTableRanges, []byte{0, 127, 0, 127, 254, 6, 254, 0, 10, 0x81}, 1,
			[]ltWant{{0, 261}, {253, 261}, {254, 261}, {507, 261}, {508, 134}, {517, 134}, {518, ltNone}},
		},
		{"3.10 negative extension", LineTableRanges, []byte{0, 0x81, 2, 0x81}, 300, []ltWant{{0, 46}, {2, ltNone}}},
		{"3.10 length 255", LineTableRanges, []byte{255, 1, 1, 1}, 0, []ltWant{{254, 1}, {255, 2}, {256, ltNone}}},
		{"3.10 trailing empty range", LineTableRanges, []byte{4, 1, 0, 5}, 0, []ltWant{{2, 1}, {4, ltNone}}},

		{"3.11 empty", LineTableLocations, nil, 7, []ltWant{{0, ltNone}}},
		{
			// def f(a):\n    x = (a +\n         1)\n    return x by 3.11.7:
			// short, one-line +1, one-line +1, long -1, short, one-line +2,
			// short; co_lines() gives the expected lines.
			"3.11 compiler output", LineTableLocations,
			[]byte{0x80, 0x00, 0xd8, 0x09, 0x0a, 0xd8, 0x09, 0x0a, 0xf1, 0x03, 0x01, 0x0a, 0x0b, 0x80, 0x41, 0xe0, 0x0b, 0x0c, 0x80, 0x48}, 1,
			[]ltWant{{0, 1}, {2, 2}, {4, 3}, {6, 2}, {8, 2}, {10, 2}, {12, 4}, {14, 4}, {16, ltNone}},
		},
		{
			"3.11 short forms", LineTableLocations, ltCat(ltEntry(0, 1, 0x00), ltEntry(9, 2, 0x7f)), 5,
			[]ltWant{{0, 5}, {1, 5}, {2, 5}, {5, 5}, {6, ltNone}},
		},
		{
			"3.11 one-line forms", LineTableLocations,
			ltCat(ltEntry(10, 1, 0, 1), ltEntry(11, 1, 0, 1), ltEntry(12, 1, 0, 1)), 5,
			[]ltWant{{0, 5}, {2, 6}, {4, 8}},
		},
		{"3.11 no columns, negative", LineTableLocations, ltEntry(13, 1, 0x07), 10, []ltWant{{0, 7}}},
		{
			// Line delta 1000: svarint 2000 = 16 | 31<<6.
			"3.11 long form", LineTableLocations, ltEntry(14, 3, 0x50, 0x1f, 0x00, 0x01, 0x05), 1,
			[]ltWant{{0, 1001}, {5, 1001}, {6, ltNone}},
		},
		{
			"3.11 no location", LineTableLocations,
			ltCat(ltEntry(11, 1, 0, 1), ltEntry(15, 2), ltEntry(0, 1, 0)), 5,
			[]ltWant{{0, 6}, {2, ltNone}, {5, ltNone}, {6, 6}},
		},
		{"3.11 eight units", LineTableLocations, ltEntry(10, 8, 0, 1), 3, []ltWant{{15, 3}, {16, ltNone}}},
		{
			// CPython skips whatever follows an entry's line delta up to
			// the next byte with bit 7 set.
			"3.11 extra bytes", LineTableLocations,
			ltCat(ltEntry(0, 1, 0, 0, 0), ltEntry(11, 1, 0, 0)), 3,
			[]ltWant{{0, 3}, {2, 4}},
		},
		{
			// The table is read only up to the offset's entry.
			"3.11 malformed after the offset", LineTableLocations, ltCat(ltEntry(0, 1, 0), ltEntry(13, 1)), 3,
			[]ltWant{{0, 3}},
		},
		{"3.11 negative line", LineTableLocations, ltEntry(13, 1, 0x05), 1, []ltWant{{0, ltNone}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, w := range tt.want {
				line, ok, err := LineForOffset(tt.format, tt.table, tt.first, w.offset)
				if err != nil {
					t.Fatalf("offset %d: %v", w.offset, err)
				}
				if (w.line == ltNone) == ok || (ok && line != w.line) {
					t.Errorf("offset %d: got line %d ok %v, want %d", w.offset, line, ok, w.line)
				}
			}
		})
	}
}

func TestLineForOffsetMalformed(t *testing.T) {
	tests := []struct {
		name   string
		format LineTableFormat
		table  []byte
		first  int
		offset uint32
		want   error
	}{
		{"unknown format", 0, nil, 1, 0, ErrLineTableVersion},
		{"lnotab odd length", LineTableLnotab, []byte{2, 1, 2}, 1, 0, ErrLineTableMalformed},
		{"3.10 odd length", LineTableRanges, []byte{2}, 1, 0, ErrLineTableMalformed},
		{"3.11 no entry start", LineTableLocations, []byte{0x01}, 1, 0, ErrLineTableMalformed},
		{"3.11 truncated varint", LineTableLocations, ltEntry(13, 1), 1, 0, ErrLineTableMalformed},
		{"3.11 varint into next entry", LineTableLocations, ltCat(ltEntry(13, 1, 0x40), ltEntry(0, 1, 0)), 1, 0, ErrLineTableMalformed},
		{"3.11 varint too long", LineTableLocations, ltEntry(14, 1, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0), 1, 0, ErrLineTableMalformed},
		{"3.11 varint over 32 bits", LineTableLocations, ltEntry(13, 1, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x3f), 1, 0, ErrLineTableMalformed},
		{"3.11 line overflow", LineTableLocations, ltEntry(11, 1, 0, 0), math.MaxInt32, 0, ErrLineTableMalformed},
		{"3.11 malformed before the offset", LineTableLocations, ltCat(ltEntry(0, 1, 0), ltEntry(13, 1)), 3, 2, ErrLineTableMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, ok, err := LineForOffset(tt.format, tt.table, tt.first, tt.offset)
			if !errors.Is(err, tt.want) || ok || line != 0 {
				t.Errorf("got line %d ok %v err %v, want %v", line, ok, err, tt.want)
			}
		})
	}
}

func TestLineTableFormatFor(t *testing.T) {
	tests := []struct {
		major, minor int
		want         LineTableFormat
	}{
		{2, 7, 0}, {3, 5, 0},
		{3, 6, LineTableLnotab}, {3, 9, LineTableLnotab},
		{3, 10, LineTableRanges},
		{3, 11, LineTableLocations}, {3, 13, LineTableLocations}, {3, 14, LineTableLocations},
		{3, 15, LineTableLocations}, {3, 16, 0}, {4, 0, 0},
	}
	for _, tt := range tests {
		got, err := LineTableFormatFor(Version{Major: tt.major, Minor: tt.minor})
		if got != tt.want || (tt.want == 0) != errors.Is(err, ErrLineTableVersion) {
			t.Errorf("%d.%d: got %v, %v, want %v", tt.major, tt.minor, got, err, tt.want)
		}
	}
}

package v8

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

// appendVLQ appends v as V8 writes it (internals.md §4.2): zig-zag, then 7
// bits a byte, least significant first, the high bit set on all but the
// last byte.
func appendVLQ(b []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// testRow is a position table row as V8's builder is handed it.
type testRow struct {
	codeOffset int64
	position   uint64
	statement  bool
}

// appendUVLQ appends v unsigned, 7 bits a byte, least significant first.
func appendUVLQ(b []byte, u uint64) []byte {
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// encodePositions writes rows as V8 does: deltas from code offset -1 and
// position 0; V8 10.2-13.6 write a non-statement's code delta d as -d-1,
// V8 14 writes d<<2 with is_statement in bit 0 and its second flag (set
// here on every other row) in bit 1.
func encodePositions(rows []testRow) []byte { return encodePositionsIn(rows, positionsSigned) }

func encodePositionsIn(rows []testRow, f positionFormat) []byte {
	var b []byte
	code, pos := int64(-1), int64(0)
	for i, r := range rows {
		d := r.codeOffset - code
		switch {
		case f == positionsFlagged:
			u := uint64(d) << 2
			if r.statement {
				u |= 1
			}
			if i%2 == 1 {
				u |= 2
			}
			b = appendUVLQ(b, u)
		case !r.statement:
			b = appendVLQ(b, -d-1)
		default:
			b = appendVLQ(b, d)
		}
		b = appendVLQ(b, int64(r.position)-pos)
		code, pos = r.codeOffset, int64(r.position)
	}
	return b
}

// decode is decodePositions of the format V8 10.2-13.6 write.
func decode(b []byte) ([]posEntry, error) { return decodePositions(b, positionsSigned) }

// sourcePosition builds SourcePosition's value (internals.md §4.1); -1
// stands for no offset and not inlined.
func sourcePosition(scriptOffset, inliningID int64) uint64 {
	return uint64(scriptOffset+1)<<1 | uint64(inliningID+1)<<31
}

func TestReadVLQ(t *testing.T) {
	for _, v := range []int64{
		0, 1, -1, 2, -2, 63, -64, 64, -65, 127, 128, -128, 8191, -8192, 8192,
		1 << 20, -(1 << 20), 1<<31 - 1, -(1 << 31), 1 << 35, -(1 << 40),
		1<<56 + 12345, math.MaxInt64, math.MinInt64, math.MinInt64 + 1,
	} {
		enc := appendVLQ(nil, v)
		got, n := readVLQ(append(enc, 0x55, 0x80)) // bytes after the value are not read
		if got != v || n != len(enc) {
			t.Errorf("readVLQ(% x) = %d, %d; want %d, %d", enc, got, n, v, len(enc))
		}
		for i := range len(enc) {
			if got, n := readVLQ(enc[:i]); n != 0 {
				t.Errorf("readVLQ(% x) (%d truncated) = %d, %d; want n 0", enc[:i], v, got, n)
			}
		}
	}
	// Byte-level checks of the encoding, so that the encoder above is not
	// only checked against the decoder.
	for _, c := range []struct {
		in   []byte
		want int64
	}{
		{[]byte{0x00}, 0},
		{[]byte{0x01}, -1},
		{[]byte{0x02}, 1},
		{[]byte{0x7e}, 63},
		{[]byte{0x7f}, -64},
		{[]byte{0x80, 0x01}, 64},
		{[]byte{0x81, 0x01}, -65},
		{[]byte{0x80, 0x80, 0x01}, 8192},
		{[]byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, math.MaxInt64},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, math.MinInt64},
	} {
		if got, n := readVLQ(c.in); got != c.want || n != len(c.in) {
			t.Errorf("readVLQ(% x) = %d, %d; want %d, %d", c.in, got, n, c.want, len(c.in))
		}
		if enc := appendVLQ(nil, c.want); !bytes.Equal(enc, c.in) {
			t.Errorf("appendVLQ(%d) = % x, want % x", c.want, enc, c.in)
		}
	}
	for _, in := range [][]byte{
		nil,
		{0x80},
		{0xff, 0xff},
		// Longer than any 64-bit value.
		bytes.Repeat([]byte{0x80}, 10),
		append(bytes.Repeat([]byte{0x80}, 10), 0x00),
	} {
		if got, n := readVLQ(in); n != 0 {
			t.Errorf("readVLQ(% x) = %d, %d; want n 0", in, got, n)
		}
	}
}

func TestDecodePositions(t *testing.T) {
	rows := []testRow{
		{0, sourcePosition(10, -1), true},
		{0, sourcePosition(12, -1), false}, // a second row at the same offset
		{5, sourcePosition(40, -1), true},
		{9, sourcePosition(33, 0), false}, // the position goes back, into an inlined function
		{200, sourcePosition(1<<20, 3), true},
		{70000, sourcePosition(7, -1), false},
	}
	want := make([]posEntry, len(rows))
	for i, r := range rows {
		want[i] = posEntry{codeOffset: r.codeOffset, position: r.position}
	}
	for _, f := range []positionFormat{positionsSigned, positionsFlagged} {
		got, err := decodePositions(encodePositionsIn(rows, f), f)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("format %d: decodePositions = %+v, %v; want %+v", f, got, err, want)
		}
	}
	got, _ := decode(encodePositions(rows))
	// The formats differ: a V8 14 table read the old way is wrong.
	if other, err := decode(encodePositionsIn(rows, positionsFlagged)); err == nil && slices.Equal(other, want) {
		t.Errorf("a V8 14 table decodes as an older one's")
	}
	// The first rows of a table Node 26 (V8 14.6) wrote for top's
	// TurboFan code in bench_test's liveScript: top at offset 135 from
	// code offset 11 (V8's --print-opt-code lists 0xb), leaf inlined
	// (inlining id 1) at offset 49 from 25 (0x19).
	v14 := []byte{0x32, 0xa0, 0x04, 0x3a, 0xa8, 0xfd, 0xff, 0xff, 0x1f}
	wantV14 := []posEntry{{11, sourcePosition(135, -1)}, {25, sourcePosition(49, 1)}}
	if rows, err := decodePositions(v14, positionsFlagged); err != nil || !slices.Equal(rows, wantV14) {
		t.Errorf("decodePositions(% x) = %+v, %v; want %+v", v14, rows, err, wantV14)
	}

	// The function entry row V8 writes at offset -1, and an empty table.
	entry := []testRow{{-1, sourcePosition(0, -1), true}, {3, sourcePosition(4, -1), true}}
	if got, err := decode(encodePositions(entry)); err != nil || len(got) != 2 || got[0].codeOffset != -1 {
		t.Errorf("decodePositions(entry row) = %+v, %v; want first row at -1", got, err)
	}
	if got, err := decode(nil); err != nil || len(got) != 0 {
		t.Errorf("decodePositions(nil) = %+v, %v; want no rows", got, err)
	}

	for _, c := range []struct {
		offset int64
		want   uint64
		ok     bool
	}{
		{-1, 0, false},
		{0, sourcePosition(12, -1), true}, // the last of the rows at 0
		{4, sourcePosition(12, -1), true},
		{5, sourcePosition(40, -1), true},
		{8, sourcePosition(40, -1), true},
		{9, sourcePosition(33, 0), true},
		{199, sourcePosition(33, 0), true},
		{200, sourcePosition(1<<20, 3), true},
		{70000, sourcePosition(7, -1), true},
		{math.MaxInt64, sourcePosition(7, -1), true},
	} {
		if p, ok := positionAt(got, c.offset); p != c.want || ok != c.ok {
			t.Errorf("positionAt(%d) = %#x, %v; want %#x, %v", c.offset, p, ok, c.want, c.ok)
		}
	}
	if p, ok := positionAt(nil, 0); ok {
		t.Errorf("positionAt(no rows, 0) = %#x, true; want false", p)
	}

	for _, c := range []struct {
		p                  uint64
		offset, inliningID int64
	}{
		{0, -1, -1},
		{sourcePosition(0, -1), 0, -1},
		{sourcePosition(42, -1), 42, -1},
		{sourcePosition(42, 0), 42, 0},
		{sourcePosition(-1, 5), -1, 5},
		{sourcePosition(0x3fffffff-1, 0xffff-1), 0x3fffffff - 1, 0xffff - 1},
		// is_external (bit 0) and bits above the inlining id are not part
		// of either.
		{sourcePosition(42, 7) | 1 | 1<<47 | 1<<63, 42, 7},
	} {
		if got := scriptOffset(c.p); got != c.offset {
			t.Errorf("scriptOffset(%#x) = %d, want %d", c.p, got, c.offset)
		}
		if got := inliningID(c.p); got != c.inliningID {
			t.Errorf("inliningID(%#x) = %d, want %d", c.p, got, c.inliningID)
		}
	}
}

func TestDecodePositionsMalformed(t *testing.T) {
	rows := []testRow{{0, sourcePosition(10, -1), true}, {300, sourcePosition(5000, 2), false}}
	valid := encodePositions(rows)
	between := map[int]bool{len(encodePositions(rows[:1])): true}
	cases := map[string][]byte{
		"code delta alone":       appendVLQ(nil, 4),
		"code delta unfinished":  {0x80},
		"position unfinished":    {0x02, 0x80, 0x80},
		"value too long":         append(bytes.Repeat([]byte{0xff}, 10), 0x01),
		"position too long":      append([]byte{0x02}, bytes.Repeat([]byte{0x80}, 11)...),
		"more rows than allowed": make([]byte, 2*(maxPositions+1)),
	}
	for i := 1; i < len(valid); i++ {
		if !between[i] { // cut between rows, it is a shorter table
			cases[fmt.Sprintf("table cut after %d bytes", i)] = valid[:i]
		}
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := decode(in)
			if !errors.Is(err, ErrTable) || got != nil {
				t.Errorf("decodePositions = %d rows, %v; want nil, %v", len(got), err, ErrTable)
			}
		})
	}
	// A V8 14 code delta beyond an int32 (V8 reads it into one).
	if got, err := decodePositions(append(appendUVLQ(nil, 1<<34), 0), positionsFlagged); !errors.Is(err, ErrTable) {
		t.Errorf("decodePositions(delta 1<<32) = %+v, %v; want %v", got, err, ErrTable)
	}
	// maxPositions rows exactly still decode.
	if got, err := decode(make([]byte, 2*maxPositions)); err != nil || len(got) != maxPositions {
		t.Errorf("decodePositions(%d rows) = %d rows, %v; want all", maxPositions, len(got), err)
	}
}

// FuzzDecodePositions decodes arbitrary tables: the decoder must answer
// with at most maxPositions rows or ErrTable, never panic, and looking
// rows up must not panic either.
func FuzzDecodePositions(f *testing.F) {
	f.Add(encodePositions([]testRow{{0, sourcePosition(10, -1), true}, {5, sourcePosition(3, 1), false}}), int64(3), false)
	f.Add(encodePositions([]testRow{{-1, sourcePosition(0, -1), true}, {1 << 40, sourcePosition(1<<29, 0xfffe), true}}), int64(-1), false)
	f.Add(encodePositionsIn([]testRow{{0, sourcePosition(10, -1), true}, {5, sourcePosition(3, 1), false}}, positionsFlagged), int64(3), true)
	f.Add([]byte{0x80, 0x80, 0x01, 0x7f}, int64(1<<20), true)
	f.Add(append(bytes.Repeat([]byte{0xff}, 9), 0x01, 0x01), int64(math.MaxInt64), false)
	f.Fuzz(func(t *testing.T, table []byte, offset int64, flagged bool) {
		format := positionsSigned
		if flagged {
			format = positionsFlagged
		}
		rows, err := decodePositions(table, format)
		if err != nil {
			if !errors.Is(err, ErrTable) || rows != nil {
				t.Fatalf("decodePositions = %d rows, %v; want nil, %v", len(rows), err, ErrTable)
			}
			return
		}
		if len(rows) > maxPositions {
			t.Fatalf("decodePositions = %d rows, more than %d", len(rows), maxPositions)
		}
		p, ok := positionAt(rows, offset)
		if !ok && p != 0 {
			t.Fatalf("positionAt(%d) = %#x without ok", offset, p)
		}
		_, _ = scriptOffset(p), inliningID(p)
		for _, r := range rows {
			positionAt(rows, r.codeOffset)
		}
	})
}

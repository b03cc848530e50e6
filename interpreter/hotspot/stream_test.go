package hotspot

import (
	"errors"
	"slices"
	"testing"
)

// encodeUint is HotSpot's UNSIGNED5 writer (unsigned5.hpp), written from
// its description: bytes from the high range carry 6 bits each.
func encodeUint(v uint32, bias uint8) []byte {
	low := uint32(192) - uint32(bias)
	var out []byte
	for i := 0; i < 4 && v >= low; i++ {
		v -= low
		out = append(out, byte(low+v%64)+bias)
		v >>= 6
	}
	return append(out, byte(v)+bias)
}

func encodeInt(v int32, bias uint8) []byte {
	return encodeUint(uint32(v<<1)^uint32(v>>31), bias)
}

func TestStreamRoundTrip(t *testing.T) {
	for _, bias := range []uint8{0, 1} {
		for _, v := range []uint32{0, 1, 190, 191, 192, 255, 1000, 1 << 20, 1<<32 - 1} {
			b := encodeUint(v, bias)
			if bias == 1 && slices.Contains(b, 0) {
				t.Errorf("bias 1: %d encodes with a 0 byte: %x", v, b)
			}
			st := &stream{b: b, bias: bias}
			got, err := st.uint()
			if err != nil || got != v || st.pos != len(b) {
				t.Errorf("bias %d: %d encoded as %x decodes to %d (%d bytes), %v", bias, v, b, got, st.pos, err)
			}
		}
		for _, v := range []int32{0, -1, 1, -1000, 1 << 30, -1 << 31} {
			st := &stream{b: encodeInt(v, bias), bias: bias}
			if got, err := st.int(); err != nil || got != v {
				t.Errorf("bias %d: signed %d decodes to %d, %v", bias, v, got, err)
			}
		}
	}
	if _, err := (&stream{b: []byte{0xff}, bias: 0}).uint(); !errors.Is(err, errStreamEnd) {
		t.Errorf("truncated value: %v", err)
	}
	if _, err := (&stream{b: []byte{0}, bias: 1}).uint(); err == nil {
		t.Error("a 0 byte decoded in a biased stream")
	}
}

func TestParseLineTable(t *testing.T) {
	for _, bias := range []uint8{0, 1} {
		// (0, 10) needs the escape (line delta 10 > 7); (5, 12) fits a
		// byte; (2, 56) goes back in bci.
		var b []byte
		b = append(b, 0xff)
		b = append(b, encodeInt(0, bias)...)
		b = append(b, encodeInt(10, bias)...)
		b = append(b, 5<<3|2)
		b = append(b, 0xff)
		b = append(b, encodeInt(-3, bias)...)
		b = append(b, encodeInt(44, bias)...)
		b = append(b, 0, 0x42) // the end, then other data
		got, err := parseLineTable(b, bias)
		want := [][2]uint32{{0, 10}, {5, 12}, {2, 56}}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("bias %d: %v, %v; want %v", bias, got, err, want)
		}
		if _, err := parseLineTable(b[:3], bias); !errors.Is(err, errStreamEnd) {
			t.Errorf("bias %d: a table without its end: %v", bias, err)
		}
	}
	m := &method{lines: [][2]uint32{{0, 10}, {5, 12}, {2, 56}}}
	for bci, line := range map[int64]uint32{-1: 10, 0: 10, 1: 10, 2: 56, 4: 56, 5: 12, 100: 12} {
		if got := m.line(bci); got != line {
			t.Errorf("bci %d: line %d, want %d", bci, got, line)
		}
	}
}

func FuzzParseLineTable(f *testing.F) {
	f.Add([]byte{0xff, 0, 20, 0x2a, 0}, uint8(0))
	f.Add([]byte{0xff, 1, 21, 0x2a, 0}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, bias uint8) {
		lines, err := parseLineTable(b, bias&1)
		if err == nil && len(lines) > len(b) {
			t.Fatalf("%d lines from %d bytes", len(lines), len(b))
		}
	})
}

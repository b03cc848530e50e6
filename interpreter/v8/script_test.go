package v8

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

func TestComputeLineEnds(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []int64
	}{
		{"empty", "", []int64{0}},
		{"one line", "abc", []int64{3}},
		{"newline", "ab\ncd", []int64{2, 5}},
		{"trailing newline", "ab\n", []int64{2, 3}},
		{"blank lines", "\n\n", []int64{0, 1, 2}},
		{"crlf is one terminator", "ab\r\ncd", []int64{3, 6}},
		{"lone cr", "ab\rcd", []int64{2, 5}},
		{"cr at the end", "ab\r", []int64{2, 3}},
		{"cr cr lf", "\r\r\n", []int64{0, 2, 3}},
		{"lf cr", "\n\r", []int64{0, 1, 2}},
		{"line separator", "a\u2028b", []int64{1, 3}},
		{"paragraph separator", "a\u2029b", []int64{1, 3}},
		{"next line is not one", "a\u0085b\vc\fd", []int64{7}},
		// Offsets count UTF-16 units: a character outside the BMP is two.
		{"surrogate pair", "\U0001F600\nx", []int64{2, 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := computeLineEnds(utf16.Encode([]rune(c.src))); !slices.Equal(got, c.want) {
				t.Errorf("computeLineEnds(%q) = %v, want %v", c.src, got, c.want)
			}
		})
	}
}

func TestScriptPosition(t *testing.T) {
	// "ab\ncd\r\nef": lines end at 2, 6 and the length 9.
	plain := &script{lineEnds: computeLineEnds(utf16.Encode([]rune("ab\ncd\r\nef")))}
	shifted := &script{lineEnds: plain.lineEnds, lineOffset: 10, columnOffset: 4}
	empty := &script{lineEnds: []int64{0}}
	unknown := &script{}
	for _, c := range []struct {
		name      string
		sc        *script
		offset    int64
		line, col int64
		ok        bool
	}{
		{"first character", plain, 0, 1, 1, true},
		{"line 1", plain, 1, 1, 2, true},
		{"the terminator is on its line", plain, 2, 1, 3, true},
		{"line 2 start", plain, 3, 2, 1, true},
		{"cr of crlf", plain, 5, 2, 3, true},
		{"lf of crlf", plain, 6, 2, 4, true},
		{"line 3 start", plain, 7, 3, 1, true},
		{"the end", plain, 9, 3, 3, true},
		{"past the end", plain, 10, 0, 0, false},
		{"negative", plain, -1, 0, 0, false},
		{"column offset on line 0", shifted, 1, 11, 6, true},
		{"no column offset after line 0", shifted, 3, 12, 1, true},
		{"line offset on the last line", shifted, 8, 13, 2, true},
		{"shifted past the end", shifted, 10, 0, 0, false},
		{"empty source", empty, 0, 1, 1, true},
		{"past an empty source", empty, 1, 0, 0, false},
		{"no line ends", unknown, 0, 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			line, col, ok := c.sc.position(c.offset)
			if line != c.line || col != c.col || ok != c.ok {
				t.Errorf("position(%d) = %d, %d, %v; want %d, %d, %v", c.offset, line, col, ok, c.line, c.col, c.ok)
			}
		})
	}
}

func TestClaimCodeRanges(t *testing.T) {
	const mib = 1 << 20
	jit := func(start, end uint64) interpreter.Region {
		return interpreter.Region{Start: start, End: end, Unwind: true}
	}
	// An isolate's code range as V8 reserves it: JIT pages from its
	// start, the builtins' copy at its end.
	const base = 0x7f00_0000_0000
	copyAt := uint64(base + 512*mib)
	for _, c := range []struct {
		name   string
		jit    []interpreter.Region
		copies []uint64
		want   []interpreter.Region
	}{
		{
			name: "no JIT",
			want: nil,
		},
		{
			name: "no copy",
			jit:  []interpreter.Region{jit(base, base+mib), jit(base+8*mib, base+9*mib)},
			want: []interpreter.Region{jit(base, base+mib), jit(base+8*mib, base+9*mib)},
		},
		{
			name:   "joined up to the copy",
			jit:    []interpreter.Region{jit(base, base+mib), jit(base+8*mib, base+9*mib), jit(base+300*mib, base+301*mib)},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{jit(base, copyAt)},
		},
		{
			name:   "a whole code range away",
			jit:    []interpreter.Region{jit(copyAt-maxCodeRange, copyAt-maxCodeRange+mib)},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{jit(copyAt-maxCodeRange, copyAt)},
		},
		{
			name:   "beyond a code range stays alone",
			jit:    []interpreter.Region{jit(copyAt-maxCodeRange-mib, copyAt-maxCodeRange), jit(base, base+mib)},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{jit(copyAt-maxCodeRange-mib, copyAt-maxCodeRange), jit(base, copyAt)},
		},
		{
			name:   "above the copy stays as it is",
			jit:    []interpreter.Region{jit(base, base+mib), jit(copyAt+4*mib, copyAt+5*mib)},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{jit(base, copyAt), jit(copyAt+4*mib, copyAt+5*mib)},
		},
		{
			name:   "a mapping over the copy keeps its end",
			jit:    []interpreter.Region{jit(base, copyAt+mib)},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{jit(base, copyAt+mib)},
		},
		{
			name:   "Unwind is kept as it is",
			jit:    []interpreter.Region{{Start: base, End: base + mib}},
			copies: []uint64{copyAt},
			want:   []interpreter.Region{{Start: base, End: copyAt}},
		},
		{
			// A worker's isolate reserves its code range below the main
			// one; a library mapped between the two is not V8's.
			name: "two isolates end at their own copies",
			jit: []interpreter.Region{
				jit(base-300*mib, base-299*mib), jit(base, base+mib),
			},
			copies: []uint64{copyAt, base - 100*mib},
			want: []interpreter.Region{
				jit(base-300*mib, base-100*mib), jit(base, copyAt),
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := claimCodeRanges(c.jit, c.copies); !slices.Equal(got, c.want) {
				t.Errorf("claimCodeRanges(%s, %#x) = %s, want %s", regionsString(c.jit), c.copies, regionsString(got), regionsString(c.want))
			}
		})
	}
}

func regionsString(rs []interpreter.Region) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("[%#x, %#x) unwind %v", r.Start, r.End, r.Unwind)
	}
	return "{" + strings.Join(s, "; ") + "}"
}

package perfmap

import (
	"strings"
	"testing"
)

func TestTableParse(t *testing.T) {
	for _, c := range []struct {
		name     string
		data     string
		consumed int // -1: all of data
		entries  int
		bad      uint64
	}{
		{"lines", "1000 10 a\n2000 20 b c\n", -1, 2, 0},
		{"0x prefixes and CRLF", "0x1000 0X10 a\r\n", -1, 1, 0},
		{"incomplete last line", "1000 10 a\n2000 2", 10, 1, 0},
		{"no name", "1000 10\n1000 10 \n", -1, 0, 2},
		{"not hex", "10g0 10 a\n1000 1z a\n", -1, 0, 2},
		{"empty size", "1000 0 a\n", -1, 0, 1},
		{"wraps around", "ffffffffffffff00 1000 a\n", -1, 0, 1},
		{"size over 32 bits", "1000 100000000 a\n", -1, 0, 1},
		{"empty lines", "\n\n1000 10 a\n", -1, 1, 2},
		{"too long", "1000 10 " + strings.Repeat("x", maxLineBytes) + "\n2000 10 b\n", -1, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tb table
			consumed, full := tb.parse([]byte(c.data), 100, 1<<20)
			want := c.consumed
			if want < 0 {
				want = len(c.data)
			}
			if consumed != want || full || len(tb.entries) != c.entries || tb.badLines != c.bad {
				t.Errorf("consumed %d full %v entries %d bad %d, want %d false %d %d",
					consumed, full, len(tb.entries), tb.badLines, want, c.entries, c.bad)
			}
		})
	}
}

// A line longer than any kept, split over reads, is skipped; the line
// after it is not.
func TestTableLongLineAcrossReads(t *testing.T) {
	var tb table
	first := "1000 10 " + strings.Repeat("x", maxLineBytes+10)
	if consumed, _ := tb.parse([]byte(first), 100, 1<<20); consumed != len(first) {
		t.Fatalf("consumed %d of the long line's start, want all %d", consumed, len(first))
	}
	// The rest of the long line and a good one: the rest parses as a bad
	// line of its own, the good one stays.
	rest := "xxxx\n2000 10 good\n"
	tb.parse([]byte(rest), 100, 1<<20)
	if name, ok := tb.lookup(0x2004); !ok || name != "good" {
		t.Errorf("lookup after the long line: %q %v", name, ok)
	}
	if tb.badLines != 2 {
		t.Errorf("bad lines %d, want 2 (the long line's two parts)", tb.badLines)
	}
}

func TestTableLookup(t *testing.T) {
	var tb table
	data := "3000 100 third\n1000 100 first\n2000 10 old\n2000 20 new\n1050 10 inner\n"
	if consumed, _ := tb.parse([]byte(data), 100, 1<<20); consumed != len(data) {
		t.Fatalf("consumed %d of %d", consumed, len(data))
	}
	for _, c := range []struct {
		addr uint64
		want string
	}{
		{0xfff, ""},
		{0x1000, "first"},
		{0x104f, "first"},
		{0x1050, "inner"}, // overlapping entries: the one starting nearest below
		{0x1060, ""},      // past inner's end, though inside first's: perf's rule too
		{0x10ff, ""},
		{0x2000, "new"}, // the later line for one start wins
		{0x2015, "new"},
		{0x2020, ""},
		{0x30ff, "third"},
		{0x3100, ""},
	} {
		if got, _ := tb.lookup(c.addr); got != c.want {
			t.Errorf("lookup(%#x) = %q, want %q", c.addr, got, c.want)
		}
	}
	// More lines after sorting: the newest still wins.
	tb.parse([]byte("2000 40 newest\n"), 100, 1<<20)
	if got, _ := tb.lookup(0x2030); got != "newest" {
		t.Errorf("after another line for 0x2000: %q", got)
	}
}

func TestTableFull(t *testing.T) {
	var tb table
	data := "1000 10 a\n2000 10 b\n3000 10 c\n"
	consumed, full := tb.parse([]byte(data), 2, 1<<20)
	if !full || consumed != 20 || len(tb.entries) != 2 {
		t.Errorf("at 2 entries: consumed %d full %v entries %d", consumed, full, len(tb.entries))
	}
	tb = table{}
	// The bound counts a whole line, name or not: it is checked before
	// the line is parsed.
	consumed, full = tb.parse([]byte(data), 100, 10)
	if !full || consumed != 20 || string(tb.names) != "ab" {
		t.Errorf("at 10 bytes of names: consumed %d full %v names %q", consumed, full, tb.names)
	}
}

// FuzzPerfMap feeds arbitrary bytes, split in two reads, to the parser:
// it must not panic, must consume what it was given at most, and leave a
// table whose lookups find the entries it holds.
func FuzzPerfMap(f *testing.F) {
	f.Add([]byte("1000 10 a\n2000 20 b c\n"), uint16(5))
	f.Add([]byte("0x1000 0x10 a\r\n3000 0 z\nffffffffffffffff 1 x\n"), uint16(0))
	f.Add([]byte("1000 10 "+strings.Repeat("y", maxLineBytes+1)+"\n2000 1 b"), uint16(100))
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		var tb table
		at := min(int(split), len(data))
		consumed, _ := tb.parse(data[:at], 1000, 1<<16)
		if consumed > at {
			t.Fatalf("consumed %d of %d", consumed, at)
		}
		rest := append(append([]byte(nil), data[consumed:at]...), data[at:]...)
		if n, _ := tb.parse(rest, 1000, 1<<16); n > len(rest) {
			t.Fatalf("consumed %d of %d", n, len(rest))
		}
		for _, e := range tb.entries {
			if int(e.nameOff)+int(e.nameLen) > len(tb.names) || e.nameLen == 0 || e.size == 0 {
				t.Fatalf("entry %+v, %d bytes of names", e, len(tb.names))
			}
		}
		tb.sort()
		for i := range tb.entries {
			e := tb.entries[i]
			if i > 0 && tb.entries[i-1].start >= e.start {
				t.Fatalf("entries not strictly sorted at %d", i)
			}
			if _, ok := tb.lookup(e.start); !ok {
				t.Fatalf("lookup(%#x) found nothing", e.start)
			}
		}
	})
}

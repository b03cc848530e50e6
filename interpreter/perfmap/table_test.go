package perfmap

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// dump lists a table's entries as "start+size name", sorted, the later
// line of one start only.
func dump(tb *table) []string {
	tb.sort()
	var out []string
	for _, e := range tb.entries {
		out = append(out, fmt.Sprintf("%x+%x %s", e.start, e.size, tb.names[e.nameOff:e.nameOff+uint32(e.nameLen)]))
	}
	return out
}

// feed parses chunks as the reader does: what a parse left of a line is
// read again in front of the next chunk. It returns what is left over.
func feed(tb *table, chunks []string) (left string) {
	for _, c := range chunks {
		data := left + c
		consumed, full := tb.parse([]byte(data), 100, 1<<20)
		if full {
			panic("full")
		}
		left = data[consumed:]
	}
	return left
}

var long = strings.Repeat("x", maxLineBytes)

func TestTableParse(t *testing.T) {
	for _, c := range []struct {
		name     string
		data     string
		consumed int // -1: all of data
		want     []string
		bad      uint64
	}{
		{"lines", "2000 20 b\n1000 10 a\n", -1, []string{"1000+10 a", "2000+20 b"}, 0},
		{"name with spaces", "1000 10 LazyCompile:*f /srv/a b.js:12\n", -1, []string{"1000+10 LazyCompile:*f /srv/a b.js:12"}, 0},
		{"name with more spaces", "1000 10 a  b \n", -1, []string{"1000+10 a  b "}, 0},
		{"0x prefixes", "0x1000 0X10 a\n0X2000 0x10 b\n", -1, []string{"1000+10 a", "2000+10 b"}, 0},
		{"upper case hex", "ABCDEF 1F a\n", -1, []string{"abcdef+1f a"}, 0},
		{"CRLF", "1000 10 a\r\n2000 10 b\r\n", -1, []string{"1000+10 a", "2000+10 b"}, 0},
		{"CR inside a name", "1000 10 a\rb\r\n", -1, []string{"1000+10 a\rb"}, 0},
		{"last line incomplete", "1000 10 a\n2000 2", 10, []string{"1000+10 a"}, 0},
		{"only an incomplete line", "1000 10 a", 0, nil, 0},
		{"empty lines", "\n\n1000 10 a\n\r\n", -1, []string{"1000+10 a"}, 3},
		{"no fields", "garbage\n", -1, nil, 1},
		{"no size", "1000\n1000 \n", -1, nil, 2},
		{"no name", "1000 10\n1000 10 \n1000 10 \r\n", -1, nil, 3},
		{"leading space", " 1000 10 a\n", -1, nil, 1},
		{"two spaces", "1000  10 a\n", -1, nil, 1},
		{"tab", "1000\t10 a\n", -1, nil, 1},
		{"not hex", "10g0 10 a\n1000 1z a\n", -1, nil, 2},
		{"0x alone", "0x 10 a\n1000 0x a\n", -1, nil, 2},
		{"signs", "+1000 10 a\n-1000 10 a\n1000 -1 a\n", -1, nil, 3},
		{"size 0", "1000 0 a\n1000 0x0 a\n", -1, nil, 2},
		{"start over 64 bits", "10000000000000000 10 a\n", -1, nil, 1},
		{"start+size wraps", "ffffffffffffff00 100 a\nffffffffffffffff 2 b\n", -1, nil, 2},
		{"start+size ends at the top", "ffffffffffffff00 ff a\n", -1, []string{"ffffffffffffff00+ff a"}, 0},
		{"size over 32 bits", "1000 100000000 a\n", -1, nil, 1},
		{"size of 32 bits", "1000 ffffffff a\n", -1, []string{"1000+ffffffff a"}, 0},
		{"NULs", "\x00\x00\x00\n1000 10 a\x00b\n", -1, []string{"1000+10 a\x00b"}, 1},
		{"line of maxLineBytes", "1000 10 " + long[8:] + "\n", -1, []string{"1000+10 " + long[8:]}, 0},
		{"line over maxLineBytes", "1000 10 " + long[7:] + "\n2000 10 b\n", -1, []string{"2000+10 b"}, 1},
		{"unterminated line of maxLineBytes", "1000 10 a\n" + long, 10, []string{"1000+10 a"}, 0},
		{"unterminated line over maxLineBytes", "1000 10 a\n" + long + "x", -1, []string{"1000+10 a"}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tb table
			consumed, full := tb.parse([]byte(c.data), 100, 1<<20)
			want := c.consumed
			if want < 0 {
				want = len(c.data)
			}
			if consumed != want || full {
				t.Errorf("consumed %d full %v, want %d false", consumed, full, want)
			}
			if got := dump(&tb); !slices.Equal(got, c.want) {
				t.Errorf("entries %q, want %q", got, c.want)
			}
			if tb.badLines != c.bad {
				t.Errorf("bad lines %d, want %d", tb.badLines, c.bad)
			}
		})
	}
}

// Lines come in parts when the runtime writes while the file is read or
// a line straddles two read chunks: the table is the one the whole text
// makes, and a line too long to keep is skipped to its end, its rest no
// line of its own.
func TestTableParseInParts(t *testing.T) {
	for _, c := range []struct {
		name   string
		chunks []string
		want   []string
		bad    uint64
		left   string
	}{
		{"line completed by the next read", []string{"1000 10 a\n2000 1", "0 b\n3000 ", "10 c\n"},
			[]string{"1000+10 a", "2000+10 b", "3000+10 c"}, 0, ""},
		{"CRLF split", []string{"1000 10 a\r", "\n"}, []string{"1000+10 a"}, 0, ""},
		{"still incomplete", []string{"1000 10 a\n2000", " 10 b"}, []string{"1000+10 a"}, 0, "2000 10 b"},
		{"long line in two reads", []string{"1000 10 " + long, "xx\n2000 10 good\n"},
			[]string{"2000+10 good"}, 1, ""},
		{"long line whose rest looks like a line", []string{"3000 10 " + long, "2000 10 injected\n1000 10 good\n"},
			[]string{"1000+10 good"}, 1, ""},
		{"long line in three reads", []string{"3000 10 " + long, long, "2000 10 injected\n1000 10 good\n"},
			[]string{"1000+10 good"}, 1, ""},
		{"long line, its newline alone in the next read", []string{"3000 10 " + long, "\n1000 10 good\n"},
			[]string{"1000+10 good"}, 1, ""},
		{"long line not yet ended", []string{"1000 10 a\n3000 10 " + long, "2000 10 b"},
			[]string{"1000+10 a"}, 1, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tb table
			left := feed(&tb, c.chunks)
			if got := dump(&tb); !slices.Equal(got, c.want) {
				t.Errorf("entries %q, want %q", got, c.want)
			}
			if tb.badLines != c.bad || left != c.left {
				t.Errorf("bad lines %d, left %q; want %d, %q", tb.badLines, left, c.bad, c.left)
			}
			// The whole text in one read makes the same table.
			var whole table
			feed(&whole, []string{strings.Join(c.chunks, "")})
			if got := dump(&whole); !slices.Equal(got, c.want) || whole.badLines != c.bad {
				t.Errorf("in one read: entries %q, bad lines %d", got, whole.badLines)
			}
		})
	}
}

// A name longer than an entry holds is no symbol (parse never gets
// there: such a line is longer than maxLineBytes).
func TestTableAddNameLength(t *testing.T) {
	var tb table
	if tb.add([]byte("1000 10 " + strings.Repeat("n", maxNameLen+1))) {
		t.Error("added a name of maxNameLen+1 bytes")
	}
	if !tb.add([]byte("1000 10 " + strings.Repeat("n", maxNameLen))) {
		t.Error("did not add a name of maxNameLen bytes")
	}
	if name, ok := tb.lookup(0x1000); !ok || len(name) != maxNameLen {
		t.Errorf("lookup: %d bytes, %v", len(name), ok)
	}
}

func TestTableLookup(t *testing.T) {
	var empty table
	if name, ok := empty.lookup(0x1000); ok {
		t.Errorf("empty table named %q", name)
	}
	var tb table
	feed(&tb, []string{
		"3000 100 third\n1000 100 outer\n2000 10 old\n2000 20 new\n1050 10 inner\n",
		"ffffffffffffff00 ff top\n",
	})
	for _, c := range []struct {
		addr uint64
		want string
	}{
		{0, ""}, // below the first entry
		{0xfff, ""},
		{0x1000, "outer"}, // at its start
		{0x104f, "outer"}, // inside
		{0x1050, "inner"}, // overlapping entries: the one starting nearest below
		{0x105f, "inner"},
		{0x1060, ""}, // past inner's end, though inside outer's: no guess
		{0x10ff, ""},
		{0x1100, ""},    // at outer's end
		{0x1800, ""},    // a gap
		{0x2000, "new"}, // the later line for one start wins
		{0x2015, "new"},
		{0x2020, ""},
		{0x3000, "third"},
		{0x30ff, "third"},
		{0x3100, ""},
		{0xffffffffffffff00, "top"},
		{0xfffffffffffffffe, "top"},
		{0xffffffffffffffff, ""},
	} {
		if got, _ := tb.lookup(c.addr); got != c.want {
			t.Errorf("lookup(%#x) = %q, want %q", c.addr, got, c.want)
		}
	}
	// Lines after a lookup sorted the table: the latest still wins, for
	// one start, both when longer and when shorter than before.
	feed(&tb, []string{"2000 40 newer\n3000 10 short\n"})
	for addr, want := range map[uint64]string{0x2030: "newer", 0x3005: "short", 0x3050: ""} {
		if got, _ := tb.lookup(addr); got != want {
			t.Errorf("after more lines: lookup(%#x) = %q, want %q", addr, got, want)
		}
	}
	feed(&tb, []string{"2000 40 newest\n"})
	if got, _ := tb.lookup(0x2000); got != "newest" {
		t.Errorf("after a third line for 0x2000: %q", got)
	}
}

func TestTableFull(t *testing.T) {
	const data = "1000 10 a\n2000 10 b\n3000 10 c\n"
	for _, c := range []struct {
		name                 string
		data                 string
		maxEntries, maxNames int
		consumed             int
		full                 bool
		want                 []string
	}{
		{"at maxEntries", data, 2, 1 << 20, 20, true, []string{"1000+10 a", "2000+10 b"}},
		{"maxEntries reached by the last line", data, 3, 1 << 20, len(data), false, []string{"1000+10 a", "2000+10 b", "3000+10 c"}},
		// The bound counts a whole line, name or not: it is checked
		// before the line is parsed.
		{"at maxNames", data, 100, 10, 20, true, []string{"1000+10 a", "2000+10 b"}},
		{"maxNames fits", data, 100, 30, len(data), false, []string{"1000+10 a", "2000+10 b", "3000+10 c"}},
		{"bad lines are no entries", "bad\n1000 10 a\n", 1, 1 << 20, 14, false, []string{"1000+10 a"}},
		{"a line too long is skipped, full or not", "1000 10 a\n" + long + "x\n", 1, 1 << 20, 10 + len(long) + 2, false, []string{"1000+10 a"}},
		{"an incomplete line does not fill", "1000 10 a\n2000 10", 1, 1 << 20, 10, false, []string{"1000+10 a"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var tb table
			consumed, full := tb.parse([]byte(c.data), c.maxEntries, c.maxNames)
			if consumed != c.consumed || full != c.full {
				t.Errorf("consumed %d full %v, want %d %v", consumed, full, c.consumed, c.full)
			}
			if got := dump(&tb); !slices.Equal(got, c.want) {
				t.Errorf("entries %q, want %q", got, c.want)
			}
			if full {
				// Full stays full: the rest is not read.
				if consumed, full := tb.parse([]byte(c.data[consumed:]), c.maxEntries, c.maxNames); consumed != 0 || !full {
					t.Errorf("parse again: consumed %d full %v", consumed, full)
				}
			}
		})
	}
}

// benchMap is a perf map of n entries as Node writes them with
// --perf-basic-prof: in compile order, not address order.
func benchMap(n int) []byte {
	funcs := []string{"handleRequest", "parseHeaders", "emit", "processTicksAndRejections", "Module._compile", "JSON.parse", "serialize", "onread"}
	files := []string{"/srv/app/lib/server.js", "/srv/app/node_modules/express/lib/router/index.js", "node:internal/process/task_queues", "node:events"}
	var b []byte
	for i := range n {
		slot := uint64(i*7919%n) * 0x200 // 7919 is prime to n
		kind := "LazyCompile:*"
		if i%3 == 0 {
			kind = "LazyCompile:~"
		}
		b = fmt.Appendf(b, "%x %x %s%s %s:%d\n", 0x7f0000000000+slot, 0x40+i%0x1c0,
			kind, funcs[i%len(funcs)], files[i%len(files)], i%5000+1)
	}
	return b
}

// BenchmarkParse reads 100,000 entries in readChunk reads and sorts them
// for lookup: the reader's throughput, and what it holds for them.
func BenchmarkParse(b *testing.B) {
	const n = 100_000
	data := benchMap(n)
	var held int
	for b.Loop() {
		var tb table
		for off := 0; off < len(data); {
			consumed, _ := tb.parse(data[off:min(off+readChunk, len(data))], maxEntries, maxNameBytes)
			off += consumed
		}
		tb.sort()
		if len(tb.entries) != n {
			b.Fatalf("%d entries, want %d", len(tb.entries), n)
		}
		held = cap(tb.entries)*int(unsafe.Sizeof(entry{})) + cap(tb.names)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(held), "bytes/100k-entries")
	b.SetBytes(int64(len(data)))
}

// BenchmarkLookup names addresses in a table of 100,000 entries, in no
// order (the cache sees a profile's spread of addresses).
func BenchmarkLookup(b *testing.B) {
	const n = 100_000
	var tb table
	tb.parse(benchMap(n), maxEntries, maxNameBytes)
	tb.sort()
	i := uint64(0)
	for b.Loop() {
		i = (i + 7919) % n
		if _, ok := tb.lookup(0x7f0000000000 + i*0x200 + 0x10); !ok {
			b.Fatal("miss")
		}
	}
}

package perfmap

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// Small bounds, so that inputs reach them.
const (
	fuzzMaxEntries = 16
	fuzzMaxNames   = 1 << 10
)

// FuzzPerfMap feeds arbitrary bytes to the parser in one read and in two
// (split where the input says, the second read starting where the first
// stopped, as the reader does). Neither may panic or consume more than it
// was given; both make the same table; the table is well formed and its
// lookups find the latest line of each start.
func FuzzPerfMap(f *testing.F) {
	for _, s := range []string{
		"1000 10 a\n2000 20 b c\n",
		"0x1000 0X10 a\r\n3000 0 z\nffffffffffffffff 1 x\n10000000000000000 1 y\n",
		"1000 10 a\n1000 20 b\n1008 4 c\n1000 8 d\n",
		"1000 100000000 a\n1000  10 b\n 1000 10 c\n1000 10\n\n\r\n",
		"1000 10 " + strings.Repeat("y", maxLineBytes+1) + "\n2000 1 b",
		"3000 10 " + strings.Repeat("y", maxLineBytes) + "2000 10 injected\n1000 10 good\n",
		strings.Repeat("1 1 a\n", fuzzMaxEntries+2),
		"\x00\xff\x10 \x01 \x02\n\xfe",
	} {
		f.Add([]byte(s), uint16(len(s)/2))
		f.Add([]byte(s), uint16(0))
	}
	// Split inside a line too long to keep, after more of it than is kept.
	f.Add([]byte("3000 10 "+strings.Repeat("y", maxLineBytes+100)+"\n1000 10 good\n"), uint16(maxLineBytes+50))
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		var whole table
		consumed, full := whole.parse(data, fuzzMaxEntries, fuzzMaxNames)
		checkParsed(t, &whole, data, consumed, full)

		var parts table
		at := int(split) % (len(data) + 1)
		c1, partsFull := parts.parse(data[:at], fuzzMaxEntries, fuzzMaxNames)
		checkParsed(t, &parts, data[:at], c1, partsFull)
		partsConsumed := c1
		if !partsFull {
			c2, f2 := parts.parse(data[c1:], fuzzMaxEntries, fuzzMaxNames)
			checkParsed(t, &parts, data[c1:], c2, f2)
			partsConsumed, partsFull = c1+c2, f2
		}
		if partsConsumed != consumed || partsFull != full || !reflect.DeepEqual(parts, whole) {
			t.Fatalf("split at %d: consumed %d full %v %+v; in one read %d %v %+v",
				at, partsConsumed, partsFull, parts, consumed, full, whole)
		}

		checkSorted(t, &whole)
	})
}

// checkParsed checks what one parse of data returned and left.
func checkParsed(t *testing.T, tb *table, data []byte, consumed int, full bool) {
	t.Helper()
	if consumed < 0 || consumed > len(data) {
		t.Fatalf("consumed %d of %d", consumed, len(data))
	}
	if rest := data[consumed:]; !full && (bytes.IndexByte(rest, '\n') >= 0 || len(rest) > maxLineBytes) {
		t.Fatalf("not full, and left a complete or overlong line: %q", rest)
	}
	if len(tb.entries) > fuzzMaxEntries || len(tb.names) > fuzzMaxNames {
		t.Fatalf("%d entries, %d bytes of names: over the bounds", len(tb.entries), len(tb.names))
	}
	for _, e := range tb.entries {
		if e.nameLen == 0 || int(e.nameOff)+int(e.nameLen) > len(tb.names) {
			t.Fatalf("entry %+v, %d bytes of names", e, len(tb.names))
		}
		if e.size == 0 || e.start+uint64(e.size) < e.start {
			t.Fatalf("entry %+v: empty or wraps", e)
		}
		name := tb.names[e.nameOff : e.nameOff+uint32(e.nameLen)]
		if bytes.IndexByte(name, '\n') >= 0 || bytes.HasSuffix(name, []byte("\r")) {
			t.Fatalf("name %q", name)
		}
	}
}

// checkSorted sorts the table: one entry per start, the latest line's,
// strictly increasing; a lookup of each start finds it.
func checkSorted(t *testing.T, tb *table) {
	t.Helper()
	latest := map[uint64]entry{}
	for _, e := range tb.entries {
		if l, ok := latest[e.start]; !ok || e.seq > l.seq {
			latest[e.start] = e
		}
	}
	tb.sort()
	if len(tb.entries) != len(latest) {
		t.Fatalf("%d entries after sort, %d starts", len(tb.entries), len(latest))
	}
	for i, e := range tb.entries {
		if i > 0 && tb.entries[i-1].start >= e.start {
			t.Fatalf("entries not strictly increasing at %d: %#x, %#x", i, tb.entries[i-1].start, e.start)
		}
		if e != latest[e.start] {
			t.Fatalf("entry %+v for %#x, want the latest line's %+v", e, e.start, latest[e.start])
		}
		name, ok := tb.lookup(e.start)
		if want := string(tb.names[e.nameOff : e.nameOff+uint32(e.nameLen)]); !ok || name != want {
			t.Fatalf("lookup(%#x) = %q %v, want %q", e.start, name, ok, want)
		}
		if last := e.start + uint64(e.size) - 1; !lookupIsNearest(tb, last) {
			t.Fatalf("lookup(%#x), the last byte of %+v: not the nearest entry below", last, e)
		}
	}
}

// lookupIsNearest says lookup(addr) finds the entry starting nearest
// below addr if that covers addr, and nothing otherwise.
func lookupIsNearest(tb *table, addr uint64) bool {
	name, ok := tb.lookup(addr)
	var near *entry
	for i := range tb.entries {
		if tb.entries[i].start <= addr {
			near = &tb.entries[i]
		}
	}
	if near == nil || addr-near.start >= uint64(near.size) {
		return !ok
	}
	return ok && name == string(tb.names[near.nameOff:near.nameOff+uint32(near.nameLen)])
}

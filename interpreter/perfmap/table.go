package perfmap

import (
	"bytes"
	"slices"
	"strconv"
)

// A perf map is text, one symbol per line: "START SIZE name", START and
// SIZE in hex without 0x (some writers add it), name the rest of the line
// (Linux tools/perf/Documentation/jit-interface.txt). Runtimes append as
// they compile; an address compiled again later names new code, so later
// lines win.

// Limits that bound what one process's perf map costs.
const (
	// maxLineBytes: longer lines are skipped (counted) rather than held.
	maxLineBytes = 4 << 10
	// maxNameLen keeps a name's length in an entry small.
	maxNameLen = 1<<16 - 1
)

// entry is one symbol: [start, start+size) is name, held in the table's
// name arena at [nameOff, nameOff+nameLen).
type entry struct {
	start   uint64
	size    uint32
	nameOff uint32
	nameLen uint16
	// seq orders entries by line, so that the later of two for one
	// address wins.
	seq uint32
}

// table is a process's perf map as read so far.
type table struct {
	entries []entry
	names   []byte
	// sorted says entries are sorted by start with no two alike; new
	// lines append unsorted.
	sorted bool
	seq    uint32
	// badLines counts lines that did not parse or were too long.
	badLines uint64
	// skipping says the last parse dropped the start of a line longer
	// than any kept: the rest of it, up to its newline, is no line of
	// its own.
	skipping bool
}

// parse adds the complete lines of data and returns how many bytes it
// consumed (a last line without its newline is left for the next read).
// It stops at maxEntries or maxNames bytes of names, reporting full.
func (t *table) parse(data []byte, maxEntries, maxNames int) (consumed int, full bool) {
	if t.skipping {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			return len(data), false
		}
		consumed, t.skipping = nl+1, false
	}
	for {
		nl := bytes.IndexByte(data[consumed:], '\n')
		if nl < 0 {
			if len(data)-consumed > maxLineBytes {
				// A line longer than any we keep: drop what we have of
				// it, and its rest when it comes.
				t.badLines++
				t.skipping = true
				return len(data), false
			}
			return consumed, false
		}
		line := data[consumed : consumed+nl]
		if len(line) > maxLineBytes {
			// Skipped whether or not the table is full, as it is when
			// it comes in parts.
			consumed += nl + 1
			t.badLines++
			continue
		}
		if len(t.entries) >= maxEntries || len(t.names)+len(line) > maxNames {
			return consumed, true
		}
		consumed += nl + 1
		if !t.add(line) {
			t.badLines++
		}
	}
}

// add parses one line; false if it is no symbol.
func (t *table) add(line []byte) bool {
	startField, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return false
	}
	sizeField, name, ok := bytes.Cut(rest, []byte{' '})
	name = bytes.TrimRight(name, "\r")
	if !ok || len(name) == 0 || len(name) > maxNameLen {
		return false
	}
	start, err := parseHex(startField)
	if err != nil {
		return false
	}
	size, err := parseHex(sizeField)
	if err != nil || size == 0 || size > 1<<32-1 || start+size < start {
		return false
	}
	t.seq++
	t.entries = append(t.entries, entry{
		start: start, size: uint32(size), nameOff: uint32(len(t.names)), nameLen: uint16(len(name)), seq: t.seq,
	})
	t.names = append(t.names, name...)
	t.sorted = false
	return true
}

func parseHex(b []byte) (uint64, error) {
	b = bytes.TrimPrefix(bytes.TrimPrefix(b, []byte("0x")), []byte("0X"))
	return strconv.ParseUint(string(b), 16, 64)
}

// sort orders the entries by start; of entries with one start, the latest
// line stays.
func (t *table) sort() {
	if t.sorted {
		return
	}
	slices.SortFunc(t.entries, func(a, b entry) int {
		if a.start != b.start {
			if a.start < b.start {
				return -1
			}
			return 1
		}
		return int(int64(b.seq) - int64(a.seq)) // latest first
	})
	t.entries = slices.CompactFunc(t.entries, func(a, b entry) bool { return a.start == b.start })
	t.sorted = true
}

// lookup names the code at addr: the entry with the highest start at or
// below addr that covers it. Where entries overlap, the later line wins
// only if it starts at the same address; perf does the same.
func (t *table) lookup(addr uint64) (string, bool) {
	t.sort()
	i, found := slices.BinarySearchFunc(t.entries, addr, func(e entry, a uint64) int {
		switch {
		case e.start < a:
			return -1
		case e.start > a:
			return 1
		}
		return 0
	})
	if !found {
		i--
	}
	if i < 0 {
		return "", false
	}
	e := &t.entries[i]
	if addr-e.start >= uint64(e.size) {
		return "", false
	}
	return string(t.names[e.nameOff : e.nameOff+uint32(e.nameLen)]), true
}

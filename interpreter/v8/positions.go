package v8

import (
	"errors"
	"sort"
)

// Source position tables map code offsets (bytecode offsets, or machine
// code offsets from the instruction start) to source positions: pairs of
// VLQ deltas from code offset -1 and position 0, the first carrying
// is_statement in its sign (internals.md §4.2, the same in V8 10.2-13.6).
// A position is SourcePosition's 64-bit value: bits 1-30 the script
// offset + 1, bits 31-46 the inlining id + 1 (§4.1).

// ErrTable says a position table does not decode.
var ErrTable = errors.New("malformed V8 position table")

// posEntry is one row of a position table.
type posEntry struct {
	codeOffset int64
	position   uint64
}

// maxPositions bounds the rows decoded of one table.
const maxPositions = 1 << 18

// decodePositions decodes a source position table.
func decodePositions(b []byte) ([]posEntry, error) {
	var out []posEntry
	code, pos := int64(-1), int64(0)
	for i := 0; i < len(b); {
		d, n := readVLQ(b[i:])
		if n == 0 {
			return nil, ErrTable
		}
		i += n
		if d < 0 {
			d = -(d + 1) // not a statement
		}
		p, n := readVLQ(b[i:])
		if n == 0 {
			return nil, ErrTable
		}
		i += n
		code += d
		pos += p
		if len(out) >= maxPositions {
			return nil, ErrTable
		}
		out = append(out, posEntry{codeOffset: code, position: uint64(pos)})
	}
	return out, nil
}

// readVLQ reads a zig-zag encoded VLQ: 7 bits a byte, least significant
// first, the high bit set on all but the last. n is 0 when b ends first or
// the value is too long.
func readVLQ(b []byte) (v int64, n int) {
	var u uint64
	for shift := uint(0); n < len(b) && shift < 64; shift += 7 {
		c := b[n]
		n++
		u |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return int64(u>>1) ^ -int64(u&1), n
		}
	}
	return 0, 0
}

// positionAt finds the position of a code offset: the last row at or
// before it.
func positionAt(rows []posEntry, offset int64) (uint64, bool) {
	i := sort.Search(len(rows), func(i int) bool { return rows[i].codeOffset > offset }) - 1
	if i < 0 {
		return 0, false
	}
	return rows[i].position, true
}

// scriptOffset and inliningID split a position; -1 when it has none.
func scriptOffset(p uint64) int64 { return int64((p>>1)&0x3fffffff) - 1 }
func inliningID(p uint64) int64   { return int64((p>>31)&0xffff) - 1 }

// readUVLQ reads an unsigned VLQ (the baseline bytecode offset table).
func readUVLQ(b []byte) (v uint64, n int) {
	for shift := uint(0); n < len(b) && shift < 64; shift += 7 {
		c := b[n]
		n++
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, n
		}
	}
	return 0, 0
}

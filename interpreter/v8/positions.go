package v8

import (
	"errors"
	"math"
	"sort"
)

// Source position tables map code offsets (bytecode offsets, or machine
// code offsets from the instruction start) to source positions: pairs of
// VLQ deltas from code offset -1 and position 0 (internals.md §4.2). The
// position delta is zig-zag encoded in every version; the code offset
// delta's encoding is the table's positionFormat. A position is
// SourcePosition's 64-bit value: bits 1-30 the script offset + 1, bits
// 31-46 the inlining id + 1 (§4.1, the same in V8 10.2-14.6).

// positionFormat is how a position table writes its code offset deltas.
type positionFormat uint8

const (
	// positionsSigned: zig-zag, a delta d of a row that is not a
	// statement written as -d-1 (V8 10.2-13.6).
	positionsSigned positionFormat = iota
	// positionsFlagged: unsigned, the delta shifted left by two above two
	// flags, is_statement in bit 0 (V8 14.1 and 14.6: [N25], [N26] dis
	// SourcePositionTableIterator::Advance takes the delta as the VLQ
	// shifted right by 2, is_statement as bit 0 and a second flag as
	// bit 1, and decodes the position delta as before; internals.md
	// §4.2). A later V8 uses three flag bits ([15.0]): another format.
	positionsFlagged
)

// ErrTable says a position table does not decode.
var ErrTable = errors.New("malformed V8 position table")

// posEntry is one row of a position table.
type posEntry struct {
	codeOffset int64
	position   uint64
}

// maxPositions bounds the rows decoded of one table.
const maxPositions = 1 << 18

// decodePositions decodes a source position table written in format f.
func decodePositions(b []byte, f positionFormat) ([]posEntry, error) {
	var out []posEntry
	code, pos := int64(-1), int64(0)
	for i := 0; i < len(b); {
		d, n := readCodeDelta(b[i:], f)
		if n == 0 {
			return nil, ErrTable
		}
		i += n
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

// readCodeDelta reads a row's code offset delta written in format f.
func readCodeDelta(b []byte, f positionFormat) (d int64, n int) {
	if f == positionsFlagged {
		u, n := readUVLQ(b)
		if n == 0 || u>>2 > math.MaxInt32 {
			return 0, 0
		}
		return int64(u >> 2), n
	}
	d, n = readVLQ(b)
	if d < 0 {
		d = -(d + 1) // not a statement
	}
	return d, n
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

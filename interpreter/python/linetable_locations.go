package python

import (
	"fmt"
	"math"
)

// The location table of CPython 3.11+ (Objects/locations.md, later
// InternalDocs/locations.md) is a sequence of entries. An entry's first
// byte has bit 7 set, a code in bits 3-6 and the number of 2-byte code
// units it covers, minus one, in bits 0-2; the bytes that follow have bit 7
// clear. Only the start line matters here; it is a delta from the previous
// entry's start line, or from co_firstlineno for the first entry.
const (
	ltEntryStart = 0x80
	// Codes 0-9 are the short forms: same line, columns in one more byte.
	// Codes 10-12 are one-line forms: line delta code-10, two column bytes.
	ltCodeOneLine0 = 10
	ltCodeOneLine2 = 12
	// ltCodeNoColumns holds a signed varint line delta and no columns.
	ltCodeNoColumns = 13
	// ltCodeLong holds a signed varint line delta, then varints for the end
	// line delta and both columns.
	ltCodeLong = 14
	// ltCodeNone is an entry without a location; the line stays as it was.
	ltCodeNone = 15

	ltCodeUnitBytes = 2
)

// ltLocationsLine walks the entries up to the one covering offset, as
// advance() in 3.11-3.14's Objects/codeobject.c does: it reads only the
// line delta of an entry and then skips to the next byte with bit 7 set.
// Unlike CPython it stops with an error where the table cannot be read:
// a first byte without bit 7, or a varint running into the next entry or
// off the end.
func ltLocationsLine(table []byte, line int64, offset uint32) (int64, bool, error) {
	var end uint64
	for i := 0; i < len(table); {
		first := table[i]
		if first&ltEntryStart == 0 {
			return 0, false, fmt.Errorf("%w: location entry at %d starts with %#x", ErrLineTableMalformed, i, first)
		}
		code := first >> 3 & 0xf
		end += uint64(first&7+1) * ltCodeUnitBytes
		switch {
		case code == ltCodeNoColumns || code == ltCodeLong:
			delta, err := ltSignedVarint(table, i+1)
			if err != nil {
				return 0, false, err
			}
			line += delta
		case code >= ltCodeOneLine0 && code <= ltCodeOneLine2:
			line += int64(code - ltCodeOneLine0)
		}
		if err := ltCheckLine(line); err != nil {
			return 0, false, err
		}
		if uint64(offset) < end {
			return line, code != ltCodeNone, nil
		}
		for i++; i < len(table) && table[i]&ltEntryStart == 0; i++ {
		}
	}
	return 0, false, nil
}

// ltMaxVarintBytes bounds a varint to 36 bits: CPython decodes into a
// 32-bit unsigned int.
const ltMaxVarintBytes = 6

// ltVarint reads the unsigned varint at table[i:]: 6-bit chunks, least
// significant first, bit 6 set on every chunk but the last.
func ltVarint(table []byte, i int) (uint32, error) {
	var v uint64
	for n := 0; ; n++ {
		if n == ltMaxVarintBytes {
			return 0, fmt.Errorf("%w: varint at %d is longer than %d bytes", ErrLineTableMalformed, i, ltMaxVarintBytes)
		}
		if i+n >= len(table) || table[i+n]&ltEntryStart != 0 {
			return 0, fmt.Errorf("%w: varint at %d is truncated", ErrLineTableMalformed, i)
		}
		b := table[i+n]
		v |= uint64(b&0x3f) << (6 * n)
		if b&0x40 == 0 {
			break
		}
	}
	if v > math.MaxUint32 {
		return 0, fmt.Errorf("%w: varint at %d exceeds 32 bits", ErrLineTableMalformed, i)
	}
	return uint32(v), nil
}

// ltSignedVarint reads a signed varint: the magnitude shifted left by one,
// with the sign in bit 0.
func ltSignedVarint(table []byte, i int) (int64, error) {
	u, err := ltVarint(table, i)
	if err != nil {
		return 0, err
	}
	if u&1 != 0 {
		return -int64(u >> 1), nil
	}
	return int64(u >> 1), nil
}

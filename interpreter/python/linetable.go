package python

// The line table of a code object maps an instruction's offset in the
// bytecode to its source line. CPython changed its encoding twice between
// 3.6 and 3.11; each decoder below follows what the interpreter's own
// PyCode_Addr2Line computes for that version (Objects/codeobject.c), so a
// profile shows the line a traceback would.

import (
	"errors"
	"fmt"
	"math"
)

// LineTableFormat is the encoding of a code object's line table.
type LineTableFormat uint8

const (
	// LineTableLnotab is co_lnotab of CPython 3.6 to 3.9: pairs of an
	// unsigned byte-offset increment and a line increment, signed since 3.6
	// (Objects/lnotab_notes.txt of those versions).
	LineTableLnotab LineTableFormat = iota + 1
	// LineTableRanges is co_linetable of CPython 3.10 (PEP 626): pairs of an
	// unsigned range length in bytes and a signed line delta, -128 marking a
	// range without a line (advance() in 3.10's Objects/codeobject.c).
	LineTableRanges
	// LineTableLocations is co_linetable of CPython 3.11 to 3.15: the
	// location table, entries of one to eight 2-byte code units with
	// variable-length line and column deltas (Objects/locations.md in 3.11
	// and 3.12, InternalDocs/locations.md since).
	LineTableLocations
)

func (f LineTableFormat) String() string {
	switch f {
	case LineTableLnotab:
		return "co_lnotab (3.6-3.9)"
	case LineTableRanges:
		return "co_linetable (3.10)"
	case LineTableLocations:
		return "location table (3.11+)"
	}
	return fmt.Sprintf("LineTableFormat(%d)", uint8(f))
}

var (
	// ErrLineTableVersion is returned for a CPython version without a known
	// line table format.
	ErrLineTableVersion = errors.New("no line table decoder for this python version")
	// ErrLineTableMalformed is returned for a table that does not decode,
	// as a torn read of another process's memory or a hostile table can be.
	ErrLineTableMalformed = errors.New("malformed python line table")
)

// LineTableFormatFor returns the line table format of a CPython version.
func LineTableFormatFor(v Version) (LineTableFormat, error) {
	if v.Major == 3 {
		switch {
		case v.Minor >= 6 && v.Minor <= 9:
			return LineTableLnotab, nil
		case v.Minor == 10:
			return LineTableRanges, nil
		case v.Minor >= 11 && v.Minor <= 15:
			return LineTableLocations, nil
		}
	}
	return 0, fmt.Errorf("python %v (3.6 to 3.15 are known): %w", v.MajorMinor(), ErrLineTableVersion)
}

// LineForOffset returns the source line of the instruction offset bytes
// into a code object's bytecode. table is the code object's co_lnotab
// (3.6-3.9) or co_linetable (3.10+) and firstLine its co_firstlineno.
//
// offset is in bytes for every format, the unit PyCode_Addr2Line takes in
// every version. From what a frame holds:
//   - 3.6-3.9: PyFrameObject.f_lasti is a byte offset: pass it as is.
//   - 3.10: PyFrameObject.f_lasti counts 2-byte code units: pass 2*f_lasti
//     (the Python-level frame.f_lasti is already doubled).
//   - 3.11, 3.12: _PyInterpreterFrame.prev_instr, and 3.13:
//     _PyInterpreterFrame.instr_ptr, point at a code unit: pass the pointer
//     minus the address of the code object's first code unit, in bytes.
//
// A frame that has not started (f_lasti -1, or prev_instr one unit before
// the code) is not an offset: CPython reports co_firstlineno for it.
//
// ok is false when the table gives the offset no line: a 3.10+ range marked
// as having none, an offset past the table's last range, or a negative line
// (CPython's -1 means "none"). err wraps ErrLineTableMalformed when the
// table does not decode up to the offset. The work is linear in the table's
// length whatever the table holds.
func LineForOffset(format LineTableFormat, table []byte, firstLine int, offset uint32) (line int, ok bool, err error) {
	if firstLine < math.MinInt32 || firstLine > math.MaxInt32 {
		return 0, false, fmt.Errorf("%w: first line %d out of range", ErrLineTableMalformed, firstLine)
	}
	var l int64
	switch format {
	case LineTableLnotab:
		l, ok, err = ltLnotabLine(table, int64(firstLine), offset)
	case LineTableRanges:
		l, ok, err = ltRangesLine(table, int64(firstLine), offset)
	case LineTableLocations:
		l, ok, err = ltLocationsLine(table, int64(firstLine), offset)
	default:
		return 0, false, fmt.Errorf("line table format %v: %w", format, ErrLineTableVersion)
	}
	if err != nil || !ok || l < 0 {
		return 0, false, err
	}
	return int(l), true, nil
}

// ltCheckLine fails for a line outside a C int, where CPython keeps lines:
// the compiler did not write a table that leads there.
func ltCheckLine(line int64) error {
	if line < math.MinInt32 || line > math.MaxInt32 {
		return fmt.Errorf("%w: line %d out of range", ErrLineTableMalformed, line)
	}
	return nil
}

// ltLnotabLine decodes a 3.6-3.9 co_lnotab. The line of an offset is
// firstLine plus the line increments of every pair whose cumulative
// byte offset is at or before it; the compiler splits a byte jump over
// 255 as (255, 0) pairs and a line jump outside [-128, 127] as (0, ±n)
// pairs, which this sum needs no special case for (lnotab_notes.txt).
// Past the last pair the last line holds, as in PyCode_Addr2Line.
func ltLnotabLine(table []byte, line int64, offset uint32) (int64, bool, error) {
	if len(table)%2 != 0 {
		return 0, false, fmt.Errorf("%w: co_lnotab of odd length %d", ErrLineTableMalformed, len(table))
	}
	var addr uint64
	for i := 0; i < len(table); i += 2 {
		addr += uint64(table[i])
		if addr > uint64(offset) {
			break
		}
		line += int64(int8(table[i+1]))
		if err := ltCheckLine(line); err != nil {
			return 0, false, err
		}
	}
	return line, true, nil
}

// ltNoLine310 is the line delta of a 3.10 range that has no line; it
// leaves the running line as it was.
const ltNoLine310 = -128

// ltRangesLine decodes a 3.10 co_linetable: consecutive ranges starting at
// offset 0, each pair adding its length to the end of the previous range
// and its delta to the running line. The compiler splits a range over 254
// bytes into (254, delta), (254, 0)... and a delta outside [-127, 127] into
// empty (0, ±127) ranges first; empty ranges hold no offset but still move
// the line, as PyLineTable_NextAddressRange skips them after advance().
func ltRangesLine(table []byte, line int64, offset uint32) (int64, bool, error) {
	if len(table)%2 != 0 {
		return 0, false, fmt.Errorf("%w: co_linetable of odd length %d", ErrLineTableMalformed, len(table))
	}
	var end uint64
	for i := 0; i < len(table); i += 2 {
		end += uint64(table[i])
		delta := int8(table[i+1])
		if delta != ltNoLine310 {
			line += int64(delta)
			if err := ltCheckLine(line); err != nil {
				return 0, false, err
			}
		}
		if uint64(offset) < end {
			return line, delta != ltNoLine310, nil
		}
	}
	return 0, false, nil
}

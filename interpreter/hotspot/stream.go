package hotspot

import (
	"errors"
	"fmt"
)

// HotSpot's compressed integers (CompressedReadStream, UNSIGNED5): a value
// below the low-byte count is one byte; otherwise each byte from the high
// range adds the next 6 bits, up to 5 bytes. From JDK 20 every byte is
// biased by one so that 0 never appears (src/hotspot/share/utilities/
// unsigned5.hpp; before, code/compressedStream.hpp): bias 1 with 191 low
// codes, else bias 0 with 192.

var errStreamEnd = errors.New("compressed stream ends inside a value")

// stream reads compressed integers from b.
type stream struct {
	b    []byte
	pos  int
	bias uint8
}

func (s *stream) byte() (uint8, error) {
	if s.pos >= len(s.b) {
		return 0, errStreamEnd
	}
	c := s.b[s.pos]
	s.pos++
	return c, nil
}

// uint reads an unsigned value.
func (s *stream) uint() (uint32, error) {
	low := uint32(192) - uint32(s.bias)
	c, err := s.byte()
	if err != nil {
		return 0, err
	}
	if c < s.bias {
		return 0, fmt.Errorf("byte %#x in a biased stream", c)
	}
	sum := uint32(c - s.bias)
	if sum < low {
		return sum, nil
	}
	for shift := uint(6); shift <= 24; shift += 6 {
		if c, err = s.byte(); err != nil {
			return 0, err
		}
		if c < s.bias {
			return 0, fmt.Errorf("byte %#x in a biased stream", c)
		}
		b := uint32(c - s.bias)
		sum += b << shift
		if b < low {
			break
		}
	}
	return sum, nil
}

// int reads a signed value (zigzag coded).
func (s *stream) int() (int32, error) {
	v, err := s.uint()
	return int32(v>>1) ^ -int32(v&1), err
}

// lineTable reads a compressed line number table at addr: (bci, line)
// pairs as deltas, one byte (bci delta << 3 | line delta) where both fit,
// else 0xff and two signed compressed values; a 0 byte ends it
// (src/hotspot/share/oops/method.cpp, CompressedLineNumberReadStream).
// Its length is not stored: a first read takes what most tables fit in.
func (s *symbolizer) lineTable(addr uint64) ([][2]uint32, error) {
	for _, n := range []uint64{1024, maxLineTable} {
		b, err := s.r.ReadUpTo(addr, n)
		if err != nil {
			return nil, err
		}
		lines, err := parseLineTable(b, s.l.Unsigned5Bias)
		if errors.Is(err, errStreamEnd) && uint64(len(b)) == n {
			continue // longer than read
		}
		return lines, err
	}
	return nil, fmt.Errorf("line number table longer than %d bytes", maxLineTable)
}

// parseLineTable decodes a line number table from b, which holds it and
// its terminating 0 byte.
func parseLineTable(b []byte, bias uint8) ([][2]uint32, error) {
	var out [][2]uint32
	var bci, line int32
	st := &stream{b: b, bias: bias}
	for {
		c, err := st.byte()
		if err != nil {
			return nil, err
		}
		switch c {
		case 0:
			return out, nil
		case 0xff:
			db, err := st.int()
			if err != nil {
				return nil, err
			}
			dl, err := st.int()
			if err != nil {
				return nil, err
			}
			bci += db
			line += dl
		default:
			bci += int32(c >> 3)
			line += int32(c & 7)
		}
		if bci >= 0 && line > 0 {
			out = append(out, [2]uint32{uint32(bci), uint32(line)})
		}
	}
}

// Package procmem reads another process's memory as runtimes need it:
// pointers, integers and strings at addresses that the target may change
// or free at any time, so that every read is bounded and every failure an
// error, never a panic. Only 64-bit little-endian targets (amd64, arm64)
// are handled.
package procmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxPointer bounds the addresses read: user-space addresses are below
// 2^56 on every Linux architecture, and the bound keeps an address plus an
// offset or a length from overflowing.
const MaxPointer = 1 << 56

// ErrBadAddress says an address cannot be read: null or outside user
// space.
var ErrBadAddress = errors.New("bad address")

// ErrUnreadable says memory at an address could not be read (unmapped, or
// the process exited).
var ErrUnreadable = errors.New("unreadable memory")

// Reader reads a process's memory.
type Reader struct {
	mem io.ReaderAt
}

// New returns a Reader of mem, which reads at process addresses
// (/proc/PID/mem).
func New(mem io.ReaderAt) *Reader { return &Reader{mem: mem} }

// Read fills buf from addr.
func (r *Reader) Read(addr uint64, buf []byte) error {
	if addr == 0 || addr >= MaxPointer || addr+uint64(len(buf)) >= MaxPointer {
		return fmt.Errorf("%w: %#x", ErrBadAddress, addr)
	}
	n, err := r.mem.ReadAt(buf, int64(addr))
	if n == len(buf) {
		// io.ReaderAt may report io.EOF along with a full read.
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %d bytes at %#x: %w", ErrUnreadable, len(buf), addr, err)
}

// U64 reads a little-endian uint64.
func (r *Reader) U64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := r.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// U32 reads a little-endian uint32.
func (r *Reader) U32(addr uint64) (uint32, error) {
	var b [4]byte
	if err := r.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// U16 reads a little-endian uint16.
func (r *Reader) U16(addr uint64) (uint16, error) {
	var b [2]byte
	if err := r.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b[:]), nil
}

// U8 reads a byte.
func (r *Reader) U8(addr uint64) (uint8, error) {
	var b [1]byte
	if err := r.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// Ptr reads a pointer: a uint64 that must be a user-space address or 0.
func (r *Reader) Ptr(addr uint64) (uint64, error) {
	p, err := r.U64(addr)
	if err != nil {
		return 0, err
	}
	if p >= MaxPointer {
		return 0, fmt.Errorf("%w: %#x read at %#x", ErrBadAddress, p, addr)
	}
	return p, nil
}

// stringChunk is read per step of CString: most strings are short, and a
// string near the end of a mapping must not make a longer read fail.
const stringChunk = 64

// CString reads a NUL-terminated string of at most max bytes (NUL
// excluded).
func (r *Reader) CString(addr uint64, max int) (string, error) {
	start := addr
	var out []byte
	var buf [stringChunk]byte
	for len(out) <= max {
		// Read up to the end of the chunk's page only, so a string that
		// ends just before an unmapped page reads.
		n := min(stringChunk, 4096-int(addr%4096))
		if err := r.Read(addr, buf[:n]); err != nil {
			return "", err
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			out = append(out, buf[:i]...)
			if len(out) > max {
				break
			}
			return string(out), nil
		}
		out = append(out, buf[:n]...)
		addr += uint64(n)
	}
	return "", fmt.Errorf("string at %#x longer than %d bytes", start, max)
}

// ReadUpTo reads n bytes from addr, or as many as can be read before an
// unreadable page: for data whose end is not known, bounded by n. It
// fails only when nothing can be read.
func (r *Reader) ReadUpTo(addr, n uint64) ([]byte, error) {
	whole := make([]byte, n)
	if r.Read(addr, whole) == nil {
		return whole, nil
	}
	out := whole[:0]
	for uint64(len(out)) < n {
		at := addr + uint64(len(out))
		chunk := min(n-uint64(len(out)), 4096-at%4096)
		buf := make([]byte, chunk)
		if err := r.Read(at, buf); err != nil {
			if len(out) == 0 {
				return nil, err
			}
			break
		}
		out = append(out, buf...)
	}
	return out, nil
}

// PageCache reads strings through a bounded cache of whole pages: where
// many small strings lie close together (the names in a runtime's type
// tables), one read per page instead of one per string.
type PageCache struct {
	r     *Reader
	pages map[uint64][]byte
	max   int
}

// PageCache returns a cache of at most maxPages pages over r; it is
// meant for one burst of reads, then dropped.
func (r *Reader) PageCache(maxPages int) *PageCache {
	return &PageCache{r: r, pages: map[uint64][]byte{}, max: maxPages}
}

// CString reads a NUL-terminated string as Reader.CString does.
func (c *PageCache) CString(addr uint64, max int) (string, error) {
	var out []byte
	for a := addr; len(out) <= max; {
		base := a &^ 4095
		page, ok := c.pages[base]
		if !ok {
			page = make([]byte, 4096)
			if err := c.r.Read(base, page); err != nil {
				// Part of the page is unmapped: read the string on its own.
				return c.r.CString(addr, max)
			}
			if len(c.pages) >= c.max {
				clear(c.pages)
			}
			c.pages[base] = page
		}
		rest := page[a-base:]
		if i := bytes.IndexByte(rest, 0); i >= 0 {
			out = append(out, rest[:i]...)
			if len(out) > max {
				break
			}
			return string(out), nil
		}
		out = append(out, rest...)
		a = base + 4096
	}
	return "", fmt.Errorf("string at %#x longer than %d bytes", addr, max)
}

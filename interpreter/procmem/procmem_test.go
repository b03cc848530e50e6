package procmem

import (
	"errors"
	"io"
	"testing"
)

// pages is a memory of readable bytes at [base, base+len(data)); reads
// outside fail as /proc/PID/mem's do on unmapped pages.
type pages struct {
	base uint64
	data []byte
}

func (p pages) ReadAt(b []byte, off int64) (int, error) {
	a := uint64(off)
	if a < p.base || a >= p.base+uint64(len(p.data)) {
		return 0, io.EOF
	}
	n := copy(b, p.data[a-p.base:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func TestReader(t *testing.T) {
	data := make([]byte, 8192)
	copy(data[4096-3:], "ab\x00") // a string ending at the last page's end
	copy(data[8192-2:], "xy")     // one running off it
	data[16] = 0x2a
	copy(data[200:], "zzzzzzzzzzzzzzzzzzzz")
	r := New(pages{base: 0x10000, data: data})
	if v, err := r.U64(0x10000 + 16); err != nil || v != 0x2a {
		t.Errorf("U64: %#x, %v", v, err)
	}
	if s, err := r.CString(0x10000+4096-3, 16); err != nil || s != "ab" {
		t.Errorf("CString at a page's end: %q, %v", s, err)
	}
	if _, err := r.CString(0x10000+8192-2, 16); !errors.Is(err, ErrUnreadable) {
		t.Errorf("CString off the mapping: %v", err)
	}
	if _, err := r.CString(0x10000+200, 8); err == nil {
		t.Error("CString longer than its bound read")
	}
	if _, err := r.U64(0); !errors.Is(err, ErrBadAddress) {
		t.Errorf("null: %v", err)
	}
	if _, err := r.U64(MaxPointer - 4); !errors.Is(err, ErrBadAddress) {
		t.Errorf("past user space: %v", err)
	}
	if b, err := r.ReadUpTo(0x10000+8000, 1000); err != nil || len(b) != 192 {
		t.Errorf("ReadUpTo at the end: %d bytes, %v", len(b), err)
	}
	if _, err := r.ReadUpTo(0x9000, 10); !errors.Is(err, ErrUnreadable) {
		t.Errorf("ReadUpTo of nothing readable: %v", err)
	}
}

// TestPageCache: strings read through the cache are those read without
// it, across page ends and at the end of the readable memory, and the
// cache holds no more pages than asked.
func TestPageCache(t *testing.T) {
	data := make([]byte, 3*4096)
	copy(data[4096-3:], "abcdef\x00") // across a page boundary
	copy(data[100:], "first\x00")
	copy(data[len(data)-4:], "end\x00") // ends with the memory
	copy(data[2*4096+10:], "zzzzzzzzzzzzzzzzzzzz\x00")
	r := New(pages{base: 0x10000, data: data})
	c := r.PageCache(2)
	for _, tc := range []struct {
		addr uint64
		max  int
		want string
		err  bool
	}{
		{0x10000 + 4096 - 3, 16, "abcdef", false},
		{0x10000 + 100, 16, "first", false},
		{0x10000 + uint64(len(data)) - 4, 16, "end", false},
		{0x10000 + 2*4096 + 10, 5, "", true},
		{0x10000 + uint64(len(data)) + 8, 16, "", true},
		{0x10000 + 4096 - 3, 16, "abcdef", false}, // again, after the cache was cleared
	} {
		got, err := c.CString(tc.addr, tc.max)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("CString(%#x, %d) = %q, %v; want %q (error %v)", tc.addr, tc.max, got, err, tc.want, tc.err)
		}
		if len(c.pages) > 2 {
			t.Errorf("%d pages cached, want <= 2", len(c.pages))
		}
	}
}

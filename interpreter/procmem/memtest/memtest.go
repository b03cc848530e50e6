// Package memtest has fake process memories for the runtimes' symbolizer
// tests: reused addresses and garbage.
package memtest

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Patched reads a process's memory with some words replaced: an object
// freed and its address reused by another.
type Patched struct {
	io.ReaderAt
	Words map[uint64]uint64
}

func (m Patched) ReadAt(b []byte, off int64) (int, error) {
	n, err := m.ReaderAt.ReadAt(b, off)
	for addr, w := range m.Words {
		if i := int64(addr) - off; i >= 0 && i+8 <= int64(n) {
			binary.LittleEndian.PutUint64(b[i:], w)
		}
	}
	return n, err
}

// Random is a process whose every byte is random but the same on every
// read: whatever a symbolizer reads there, it must end with an error or a
// frame, never a panic or an unbounded read (a read of over 64 KiB fails).
type Random struct{ Seed uint64 }

func (m Random) ReadAt(b []byte, off int64) (int, error) {
	if len(b) > 1<<16 {
		return 0, fmt.Errorf("read of %d bytes", len(b))
	}
	x := uint64(off) ^ m.Seed
	for i := range b {
		// splitmix64 of the address.
		z := x + uint64(i)*0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		b[i] = byte(z ^ z>>31)
	}
	return len(b), nil
}

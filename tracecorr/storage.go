package tracecorr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// ProcessStorage is the agent's process storage (spec: "process storage
// layout"), layout-minor-version 1 and later.
type ProcessStorage struct {
	// Addr is where the storage was read: the pointer's value. The agent
	// publishes a new storage by pointing elsewhere.
	Addr         uint64
	MinorVersion uint16
	ServiceName  string
	Environment  string
	// SocketPath is the agent's socket as the process sees it (inside its
	// container).
	SocketPath string
}

// ErrNotPublished says the agent has not published its process storage yet
// (the pointer is still 0): read it again later.
var ErrNotPublished = errors.New("process storage not published yet")

// ErrBadStorage says the process storage does not follow the layout: a
// string longer than the bound, not UTF-8, or an unknown major layout.
var ErrBadStorage = errors.New("malformed APM process storage")

// Bounds on the strings of the process storage: a service name or an
// environment is short; a socket path fits in sockaddr_un's 108 bytes,
// with room for a path seen through /proc/PID/root.
const (
	maxNameBytes = 1024
	maxPathBytes = 4096
)

// ReadProcessStorage reads the process storage that the pointer at ptrAddr
// (the library's ProcessStorage plus its load bias) points to. It never
// allocates more than the bounds above, whatever the lengths say.
func ReadProcessStorage(mem io.ReaderAt, ptrAddr uint64) (*ProcessStorage, error) {
	addr, err := ReadStoragePointer(mem, ptrAddr)
	if err != nil {
		return nil, err
	}
	var minor [2]byte
	if _, err := mem.ReadAt(minor[:], int64(addr)); err != nil {
		return nil, fmt.Errorf("reading the process storage at %#x: %w", addr, err)
	}
	st := &ProcessStorage{Addr: addr, MinorVersion: binary.LittleEndian.Uint16(minor[:])}
	if st.MinorVersion < 1 {
		return nil, fmt.Errorf("%w: layout minor version %d", ErrBadStorage, st.MinorVersion)
	}
	pos := addr + 2
	for _, f := range []struct {
		dst *string
		max uint32
	}{{&st.ServiceName, maxNameBytes}, {&st.Environment, maxNameBytes}, {&st.SocketPath, maxPathBytes}} {
		if *f.dst, pos, err = readString(mem, pos, f.max); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// ReadStoragePointer reads the process storage pointer at ptrAddr; 0 is
// ErrNotPublished.
func ReadStoragePointer(mem io.ReaderAt, ptrAddr uint64) (uint64, error) {
	var word [8]byte
	if _, err := mem.ReadAt(word[:], int64(ptrAddr)); err != nil {
		return 0, fmt.Errorf("reading the process storage pointer at %#x: %w", ptrAddr, err)
	}
	addr := binary.LittleEndian.Uint64(word[:])
	if addr == 0 {
		return 0, ErrNotPublished
	}
	return addr, nil
}

// readString reads a utf8-str (a uint32 length, then that many bytes) at
// addr and returns it with the address after it.
func readString(mem io.ReaderAt, addr uint64, max uint32) (string, uint64, error) {
	var n [4]byte
	if _, err := mem.ReadAt(n[:], int64(addr)); err != nil {
		return "", 0, fmt.Errorf("reading a string length at %#x: %w", addr, err)
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > max {
		return "", 0, fmt.Errorf("%w: a string of %d bytes at %#x (at most %d)", ErrBadStorage, size, addr, max)
	}
	buf := make([]byte, size)
	if _, err := mem.ReadAt(buf, int64(addr+4)); err != nil {
		return "", 0, fmt.Errorf("reading a string at %#x: %w", addr+4, err)
	}
	if !utf8.Valid(buf) {
		return "", 0, fmt.Errorf("%w: a string at %#x is not UTF-8", ErrBadStorage, addr+4)
	}
	return string(buf), addr + 4 + uint64(size), nil
}

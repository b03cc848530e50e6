package python

// Reading CPython objects out of another process. Only the 64-bit
// little-endian layouts Offsets describes (amd64, arm64) are handled.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// symType is a static CPython type an object is checked against.
type symType int

const (
	symTypeCode symType = iota
	symTypeStr
	symTypeBytes
	symNumTypes
)

// symTypeNames are the types' tp_name, NUL included: what a read of
// len(name) bytes at tp_name must find.
var symTypeNames = [symNumTypes]string{
	symTypeCode:  "code\x00",
	symTypeStr:   "str\x00",
	symTypeBytes: "bytes\x00",
}

// read fills buf from the process's memory at addr; an address no object
// can be at is a malformed object.
func (s *Symbolizer) read(addr uint64, buf []byte) error {
	err := s.mem.Read(addr, buf)
	if errors.Is(err, procmem.ErrBadAddress) {
		return fmt.Errorf("%w: %w", ErrBadObject, err)
	}
	return err
}

// checkType fails unless typ is the address of the static type t.
func (s *Symbolizer) checkType(typ uint64, t symType) error {
	s.mu.Lock()
	known := s.types[t]
	s.mu.Unlock()
	if typ != 0 && known == typ {
		return nil
	}
	want := symTypeNames[t]
	wrong := ErrBadObject
	if t == symTypeCode {
		wrong = ErrNotCode
	}
	// An unreadable type makes the object garbage, not the process gone
	// (the object itself was just read): the read error is kept as text
	// so that the error is not also ErrUnreadable.
	hdr := make([]byte, s.typeSpan)
	if err := s.read(typ, hdr); err != nil {
		return fmt.Errorf("%w: type %#x: %v", wrong, typ, err)
	}
	if binary.LittleEndian.Uint64(hdr[s.off.Type.Flags:])&pyTPFlagsHeapType != 0 {
		return fmt.Errorf("%w: type %#x is a heap type, not %q", wrong, typ, want[:len(want)-1])
	}
	name := make([]byte, len(want))
	if err := s.read(binary.LittleEndian.Uint64(hdr[s.off.Type.Name:]), name); err != nil {
		return fmt.Errorf("%w: name of type %#x: %v", wrong, typ, err)
	}
	if string(name) != want {
		return fmt.Errorf("%w: type %#x is %q, not %q", wrong, typ, name, want[:len(want)-1])
	}
	s.mu.Lock()
	if s.types[t] == 0 {
		s.types[t] = typ
	}
	s.mu.Unlock()
	return nil
}

// The unicode kinds of PyASCIIObject.state.kind (PyUnicode_Kind): the
// bytes per code point of a compact string's data.
const (
	pyUnicode1Byte = 1
	pyUnicode2Byte = 2
	pyUnicode4Byte = 4
)

// readString reads the str object at addr as UTF-8. It takes compact
// strings, the only ones CPython makes for code objects, and refuses
// legacy ones. Code points a Go string cannot hold (surrogates, as
// surrogateescape leaves in file names) become U+FFFD, so the result is
// always valid UTF-8, as OTLP requires.
func (s *Symbolizer) readString(addr uint64) (string, error) {
	u := &s.off.Unicode
	hdr := make([]byte, s.strSpan)
	if err := s.read(addr, hdr); err != nil {
		return "", err
	}
	if err := s.checkType(binary.LittleEndian.Uint64(hdr[s.off.Object.Type:]), symTypeStr); err != nil {
		return "", fmt.Errorf("object at %#x: %w", addr, err)
	}
	state := binary.LittleEndian.Uint32(hdr[u.State:])
	field := func(shift, bits int) uint32 { return state >> shift & (1<<bits - 1) }
	kind, compact, ascii := field(u.KindShift, u.KindBits), field(u.CompactShift, u.CompactBits), field(u.ASCIIShift, u.ASCIIBits)
	length := int64(binary.LittleEndian.Uint64(hdr[u.Length:]))
	switch {
	case compact == 0:
		return "", fmt.Errorf("%w: str at %#x is a legacy string (state %#x)", ErrBadObject, addr, state)
	case length < 0 || length > symMaxStringChars:
		return "", fmt.Errorf("%w: str at %#x of length %d", ErrBadObject, addr, length)
	case ascii != 0 && kind != pyUnicode1Byte,
		kind != pyUnicode1Byte && kind != pyUnicode2Byte && kind != pyUnicode4Byte:
		return "", fmt.Errorf("%w: str at %#x of kind %d (ascii %d)", ErrBadObject, addr, kind, ascii)
	}
	data := addr + uint64(u.CompactSize)
	if ascii != 0 {
		data = addr + uint64(u.ASCIISize)
	}
	raw := make([]byte, length*int64(kind))
	if err := s.read(data, raw); err != nil {
		return "", fmt.Errorf("characters of str at %#x: %w", addr, err)
	}
	if ascii != 0 {
		for i, c := range raw {
			if c >= utf8.RuneSelf {
				return "", fmt.Errorf("%w: ascii str at %#x holds %#x at %d", ErrBadObject, addr, c, i)
			}
		}
		return string(raw), nil
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i += int(kind) {
		var r uint32
		switch kind {
		case pyUnicode1Byte:
			r = uint32(raw[i])
		case pyUnicode2Byte:
			r = uint32(binary.LittleEndian.Uint16(raw[i:]))
		default:
			r = binary.LittleEndian.Uint32(raw[i:])
		}
		// Surrogates and values past U+10FFFF (which rune(r) may make
		// negative) append as U+FFFD.
		out = utf8.AppendRune(out, rune(r))
	}
	return string(out), nil
}

// readBytes reads the contents of the bytes object at addr, of at most
// limit bytes.
func (s *Symbolizer) readBytes(addr uint64, limit int) ([]byte, error) {
	hdr := make([]byte, s.bytesSpan)
	if err := s.read(addr, hdr); err != nil {
		return nil, err
	}
	if err := s.checkType(binary.LittleEndian.Uint64(hdr[s.off.Object.Type:]), symTypeBytes); err != nil {
		return nil, fmt.Errorf("object at %#x: %w", addr, err)
	}
	size := int64(binary.LittleEndian.Uint64(hdr[s.off.Bytes.Size:]))
	if size < 0 || size > int64(limit) {
		return nil, fmt.Errorf("%w: bytes at %#x of size %d (at most %d taken)", ErrBadObject, addr, size, limit)
	}
	data := make([]byte, size)
	if size == 0 {
		return data, nil
	}
	if err := s.read(addr+uint64(s.off.Bytes.Data), data); err != nil {
		return nil, fmt.Errorf("contents of bytes at %#x: %w", addr, err)
	}
	return data, nil
}

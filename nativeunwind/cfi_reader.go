package nativeunwind

import (
	"encoding/binary"
	"fmt"
)

// FormatError reports malformed unwind information: the section, the byte
// offset in it and what is wrong there.
type FormatError struct {
	Section string
	Offset  int
	Problem string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s+%#x: %s", e.Section, e.Offset, e.Problem)
}

// reader decodes the fields of one section. The first failure is sticky:
// it records the offset and problem and moves the cursor to the end, so
// that a caller may read a group of fields and check once, and no loop
// over the remaining bytes can continue.
type reader struct {
	data  []byte
	pos   int // index into data
	end   int // reads stop here
	order binary.ByteOrder

	problem   string
	problemAt int
}

func (r *reader) failf(format string, args ...any) {
	if r.problem == "" {
		r.problem = fmt.Sprintf(format, args...)
		r.problemAt = r.pos
	}
	r.pos = r.end
}

func (r *reader) ok() bool       { return r.problem == "" }
func (r *reader) remaining() int { return r.end - r.pos }
func (r *reader) atEnd() bool    { return r.pos >= r.end }
func (r *reader) err(section string) error {
	if r.problem == "" {
		return nil
	}
	return &FormatError{Section: section, Offset: r.problemAt, Problem: r.problem}
}

// take returns the next n bytes, or nil after recording a truncation.
func (r *reader) take(n uint64, what string) []byte {
	if n > uint64(r.remaining()) {
		r.failf("%s: %d bytes needed, %d left", what, n, r.remaining())
		return nil
	}
	b := r.data[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b
}

func (r *reader) u8(what string) uint8 {
	if r.pos >= r.end {
		r.failf("%s: truncated", what)
		return 0
	}
	v := r.data[r.pos]
	r.pos++
	return v
}

func (r *reader) u16(what string) uint16 {
	if b := r.take(2, what); b != nil {
		return r.order.Uint16(b)
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if b := r.take(4, what); b != nil {
		return r.order.Uint32(b)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if b := r.take(8, what); b != nil {
		return r.order.Uint64(b)
	}
	return 0
}

// uleb reads an unsigned LEB128 number that must fit 64 bits.
func (r *reader) uleb(what string) uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if r.pos >= r.end {
			r.failf("%s: truncated LEB128", what)
			return 0
		}
		b := r.data[r.pos]
		r.pos++
		if shift == 63 && b&0x7e != 0 || shift > 63 && b&0x7f != 0 {
			r.failf("%s: LEB128 overflows 64 bits", what)
			return 0
		}
		if shift < 64 {
			v |= uint64(b&0x7f) << shift
		}
		if b&0x80 == 0 {
			return v
		}
	}
}

// sleb reads a signed LEB128 number that must fit 64 bits.
func (r *reader) sleb(what string) int64 {
	var v int64
	for shift := uint(0); ; shift += 7 {
		if r.pos >= r.end {
			r.failf("%s: truncated LEB128", what)
			return 0
		}
		b := r.data[r.pos]
		r.pos++
		if shift == 63 {
			// Only the sign may remain: 0x00 or 0x7f, without continuation.
			if b != 0 && b != 0x7f {
				r.failf("%s: LEB128 overflows 64 bits", what)
				return 0
			}
			return v | int64(b&1)<<63
		}
		v |= int64(b&0x7f) << shift
		if b&0x80 == 0 {
			if shift+7 < 64 && b&0x40 != 0 {
				v |= -1 << (shift + 7)
			}
			return v
		}
	}
}

// cstring reads a NUL-terminated string of at most max bytes.
func (r *reader) cstring(max int, what string) string {
	for i := r.pos; i < r.end && i-r.pos <= max; i++ {
		if r.data[i] == 0 {
			s := string(r.data[r.pos:i])
			r.pos = i + 1
			return s
		}
	}
	r.failf("%s: unterminated or longer than %d bytes", what, max)
	return ""
}

// Pointer encodings (DW_EH_PE_*, LSB "Exception Frames").
const (
	pePtr     = 0x00 // absptr: an address-sized word
	peULEB    = 0x01
	peUData2  = 0x02
	peUData4  = 0x03
	peUData8  = 0x04
	peSigned  = 0x08 // an address-sized signed word
	peSLEB    = 0x09
	peSData2  = 0x0a
	peSData4  = 0x0b
	peSData8  = 0x0c
	pePCRel   = 0x10
	peTextRel = 0x20
	peDataRel = 0x30
	peFuncRel = 0x40
	peAligned = 0x50
	peIndir   = 0x80
	peOmit    = 0xff
)

// pointerBases are what the relative pointer encodings are relative to.
type pointerBases struct {
	section uint64 // virtual address of data[0], for pcrel
	text    uint64 // textrel: the .text section
	data    uint64 // datarel: .got in .eh_frame, the header in .eh_frame_hdr
	fn      uint64 // funcrel: the FDE's initial location, 0 when unknown
	// deref reads an address-sized word at a virtual address of the file,
	// for DW_EH_PE_indirect; nil when the file's contents are unavailable.
	deref func(addr uint64) (uint64, bool)
}

// pointer reads a pointer with encoding enc; ptrSize is 4 or 8.
func (r *reader) pointer(enc byte, ptrSize int, b *pointerBases, what string) uint64 {
	if enc == peOmit {
		r.failf("%s: omitted pointer", what)
		return 0
	}
	app := enc & 0x70
	if app == peAligned {
		addr := b.section + uint64(r.pos)
		if pad := int(-addr & uint64(ptrSize-1)); pad > 0 {
			r.take(uint64(pad), what)
		}
	}
	fieldAddr := b.section + uint64(r.pos)
	var v uint64
	switch enc & 0x0f {
	case pePtr, peSigned:
		if ptrSize == 4 {
			v = uint64(r.u32(what))
			if enc&0x0f == peSigned {
				v = uint64(int64(int32(v)))
			}
		} else {
			v = r.u64(what)
		}
	case peULEB:
		v = r.uleb(what)
	case peUData2:
		v = uint64(r.u16(what))
	case peUData4:
		v = uint64(r.u32(what))
	case peUData8, peSData8:
		v = r.u64(what)
	case peSLEB:
		v = uint64(r.sleb(what))
	case peSData2:
		v = uint64(int64(int16(r.u16(what))))
	case peSData4:
		v = uint64(int64(int32(r.u32(what))))
	default:
		r.failf("%s: unknown pointer format %#x", what, enc)
		return 0
	}
	switch app {
	case 0, peAligned:
	case pePCRel:
		v += fieldAddr
	case peTextRel:
		v += b.text
	case peDataRel:
		v += b.data
	case peFuncRel:
		if b.fn == 0 {
			r.failf("%s: function-relative pointer outside an FDE", what)
			return 0
		}
		v += b.fn
	default:
		r.failf("%s: unknown pointer application %#x", what, enc)
		return 0
	}
	if ptrSize == 4 {
		v &= 0xffffffff
	}
	if enc&peIndir != 0 {
		var ok bool
		if b.deref != nil {
			v, ok = b.deref(v)
		}
		if !ok {
			r.failf("%s: indirect pointer to %#x cannot be read", what, v)
			return 0
		}
	}
	return v
}

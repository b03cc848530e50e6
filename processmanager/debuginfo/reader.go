package debuginfo

import "encoding/binary"

// dwarfReader reads little-endian DWARF data; a read past the end, or a
// LEB128 longer than ten bytes, sets err and returns zeros from then on.
type dwarfReader struct {
	b   []byte
	pos int
	err bool
}

func (h *dwarfReader) take(n int) []byte {
	if h.err || n < 0 || n > len(h.b)-h.pos {
		h.err = true
		return make([]byte, max(n, 0))
	}
	h.pos += n
	return h.b[h.pos-n : h.pos]
}

func (h *dwarfReader) skip(n int)  { h.take(n) }
func (h *dwarfReader) u8() uint8   { return h.take(1)[0] }
func (h *dwarfReader) u16() uint16 { return binary.LittleEndian.Uint16(h.take(2)) }
func (h *dwarfReader) u32() uint32 { return binary.LittleEndian.Uint32(h.take(4)) }

// offset reads a section offset of size 4 or 8 (DWARF 32 or 64).
func (h *dwarfReader) offset(size int) uint64 {
	if size == 8 {
		return binary.LittleEndian.Uint64(h.take(8))
	}
	return uint64(h.u32())
}

func (h *dwarfReader) uleb() uint64 {
	var v uint64
	for shift := 0; shift < 70; shift += 7 {
		b := h.u8()
		if h.err {
			return 0
		}
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			return v
		}
	}
	h.err = true
	return 0
}

// Forms whose values are not relative to their unit.
const (
	formRefAddr   = 0x10
	formIndirect  = 0x16
	formRefSup4   = 0x1c
	formRefSup8   = 0x24
	formImplicit  = 0x21
	formGNURefAlt = 0x1f20
)

// DWARF 5 forms an entry format may use (section 7.5.6).
const (
	formBlock2      = 0x03
	formBlock4      = 0x04
	formData2       = 0x05
	formData4       = 0x06
	formData8       = 0x07
	formString      = 0x08
	formBlock       = 0x09
	formBlock1      = 0x0a
	formData1       = 0x0b
	formFlag        = 0x0c
	formSdata       = 0x0d
	formStrp        = 0x0e
	formUdata       = 0x0f
	formSecOffset   = 0x17
	formFlagPresent = 0x19
	formStrx        = 0x1a
	formStrpSup     = 0x1d
	formData16      = 0x1e
	formLineStrp    = 0x1f
	formStrx1       = 0x25
	formStrx2       = 0x26
	formStrx3       = 0x27
	formStrx4       = 0x28
)

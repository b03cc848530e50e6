package v8

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// Reading V8's heap from outside: every object may have moved or been
// freed since the sample, so each read checks the type it expects and
// fails with ErrObject instead of trusting a pointer (internals.md §2, §7:
// no pointer compression, tagged pointers end in 01, a Smi is the upper
// half of a word).

// ErrObject says memory does not hold the object a frame named.
var ErrObject = errors.New("not the V8 object expected")

// Bounds of what is read of one object.
const (
	maxStringBytes = 4 << 20
	// maxNameBytes bounds a name; longer ones are cut.
	maxNameBytes = 1024
	maxConsDepth = 32
	maxTable     = 1 << 20
)

// heap reads one process's V8 objects.
type heap struct {
	r *procmem.Reader
	l *Layout
	// mapTypes caches the instance type of maps: a map lives as long as
	// objects of its kind and is never moved from read-only space or
	// old space in practice; a stale entry only fails a type check.
	mapTypes map[uint64]uint16
}

const maxMapTypes = 4096

func isHeapObject(v uint64) bool { return v&3 == 1 }
func isSmi(v uint64) bool        { return v&0xffffffff == 0 }
func smi(v uint64) int64         { return int64(v) >> 32 }

// field reads the tagged word at offset off of object obj.
func (h *heap) field(obj uint64, off int64) (uint64, error) {
	return h.r.U64(obj - 1 + uint64(off))
}

// typeOf reads an object's instance type.
func (h *heap) typeOf(obj uint64) (uint16, error) {
	if !isHeapObject(obj) {
		return 0, fmt.Errorf("%w: %#x is not a heap object", ErrObject, obj)
	}
	m, err := h.field(obj, 0)
	if err != nil {
		return 0, err
	}
	return h.mapType(m)
}

// mapType reads the instance type a map describes, through the cache.
func (h *heap) mapType(m uint64) (uint16, error) {
	if !isHeapObject(m) {
		return 0, fmt.Errorf("%w: map %#x", ErrObject, m)
	}
	if t, ok := h.mapTypes[m]; ok {
		return t, nil
	}
	t, err := h.r.U16(m - 1 + uint64(h.l.MapInstanceType))
	if err != nil {
		return 0, err
	}
	if len(h.mapTypes) >= maxMapTypes {
		clear(h.mapTypes)
	}
	h.mapTypes[m] = t
	return t, nil
}

// header reads the first n bytes of object obj.
func (h *heap) header(obj uint64, n int64) ([]byte, error) {
	if !isHeapObject(obj) {
		return nil, fmt.Errorf("%w: %#x is not a heap object", ErrObject, obj)
	}
	buf := make([]byte, n)
	return buf, h.r.Read(obj-1, buf)
}

// expectMap fails unless the map m of obj (its first word) is of one of
// types.
func (h *heap) expectMap(obj, m uint64, what string, types ...uint16) error {
	t, err := h.mapType(m)
	if err != nil {
		return err
	}
	if !slices.Contains(types, t) {
		return fmt.Errorf("%w: %#x is of type %d, not a %s", ErrObject, obj, t, what)
	}
	return nil
}

// expect reads obj's type and fails unless it is one of types.
func (h *heap) expect(obj uint64, what string, types ...uint16) (uint16, error) {
	if !isHeapObject(obj) {
		return 0, fmt.Errorf("%w: %#x is not a heap object", ErrObject, obj)
	}
	m, err := h.field(obj, 0)
	if err != nil {
		return 0, err
	}
	if err := h.expectMap(obj, m, what, types...); err != nil {
		return 0, err
	}
	return h.mapTypes[m], nil
}

// byteArray reads a (Trusted)ByteArray's bytes: its length is a Smi after
// the map, the bytes follow (internals.md §2.3).
func (h *heap) byteArray(obj uint64) ([]byte, error) {
	if !isHeapObject(obj) {
		return nil, fmt.Errorf("%w: %#x is not a byte array", ErrObject, obj)
	}
	n, err := h.field(obj, h.l.FixedArrayLength)
	if err != nil {
		return nil, err
	}
	if !isSmi(n) || smi(n) < 0 || smi(n) > maxTable {
		return nil, fmt.Errorf("%w: byte array of length %#x", ErrObject, n)
	}
	buf := make([]byte, smi(n))
	if err := h.r.Read(obj-1+uint64(h.l.FixedArrayData), buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// fixedArray reads the tagged elements of a FixedArray-shaped object.
func (h *heap) fixedArray(obj uint64, max int) ([]uint64, error) {
	if !isHeapObject(obj) {
		return nil, fmt.Errorf("%w: %#x is not an array", ErrObject, obj)
	}
	n, err := h.field(obj, h.l.FixedArrayLength)
	if err != nil {
		return nil, err
	}
	if !isSmi(n) || smi(n) < 0 || smi(n) > int64(max) {
		return nil, fmt.Errorf("%w: array of length %#x", ErrObject, n)
	}
	buf := make([]byte, 8*smi(n))
	if err := h.r.Read(obj-1+uint64(h.l.FixedArrayData), buf); err != nil {
		return nil, err
	}
	out := make([]uint64, smi(n))
	for i := range out {
		out[i] = le.Uint64(buf[8*i:])
	}
	return out, nil
}

// element reads element i of a FixedArray-shaped object.
func (h *heap) element(obj uint64, i int64) (uint64, error) {
	return h.field(obj, h.l.FixedArrayData+8*i)
}

// str reads a String of up to max bytes (UTF-8); longer ones are cut.
func (h *heap) str(obj uint64, max int) (string, error) {
	b, err := h.strBytes(obj, max, 0)
	return string(b), err
}

func (h *heap) strBytes(obj uint64, max, depth int) ([]byte, error) {
	l := h.l
	t, err := h.typeOf(obj)
	if err != nil {
		return nil, err
	}
	if t >= l.FirstNonstringType {
		return nil, fmt.Errorf("%w: %#x is of type %d, not a string", ErrObject, obj, t)
	}
	lw, err := h.r.U32(obj - 1 + uint64(l.StringLength))
	if err != nil {
		return nil, err
	}
	n := int(int32(lw))
	if n < 0 || n > maxStringBytes {
		return nil, fmt.Errorf("%w: string of length %d", ErrObject, n)
	}
	oneByte := t&l.EncodingMask == l.OneByteTag
	switch t & l.ReprMask {
	case l.SeqTag:
		off := l.SeqTwoByteChars
		if oneByte {
			off = l.SeqOneByteChars
		}
		return h.chars(obj-1+uint64(off), n, oneByte, max)
	case l.ExternalTag:
		data, err := h.field(obj, l.ExternalResourceData)
		if err != nil {
			return nil, err
		}
		return h.chars(data, n, oneByte, max)
	case l.ConsTag, l.SlicedTag, l.ThinTag:
		if depth >= maxConsDepth {
			return nil, fmt.Errorf("%w: strings nested deeper than %d", ErrObject, maxConsDepth)
		}
		switch t & l.ReprMask {
		case l.ThinTag:
			actual, err := h.field(obj, l.ThinActual)
			if err != nil {
				return nil, err
			}
			return h.strBytes(actual, max, depth+1)
		case l.SlicedTag:
			parent, err := h.field(obj, l.SlicedParent)
			if err != nil {
				return nil, err
			}
			offw, err := h.field(obj, l.SlicedOffs)
			if err != nil {
				return nil, err
			}
			// Read the parent up to the slice's end, in its own units.
			whole, err := h.strRunes(parent, int(smi(offw))+n, depth+1)
			if err != nil {
				return nil, err
			}
			start := min(int(smi(offw)), len(whole))
			end := min(start+n, len(whole))
			return cut([]byte(string(whole[start:end])), max), nil
		default:
			first, err := h.field(obj, l.ConsFirst)
			if err != nil {
				return nil, err
			}
			second, err := h.field(obj, l.ConsSecond)
			if err != nil {
				return nil, err
			}
			a, err := h.strBytes(first, max, depth+1)
			if err != nil || len(a) >= max {
				return a, err
			}
			b, err := h.strBytes(second, max-len(a), depth+1)
			return append(a, b...), err
		}
	}
	return nil, fmt.Errorf("%w: string of type %d", ErrObject, t)
}

// strRunes reads up to n characters of a string as runes.
func (h *heap) strRunes(obj uint64, n, depth int) ([]rune, error) {
	b, err := h.strBytes(obj, 3*n, depth)
	return []rune(string(b)), err
}

// chars reads n characters, one or two bytes each, as UTF-8 of at most
// max bytes.
func (h *heap) chars(addr uint64, n int, oneByte bool, max int) ([]byte, error) {
	if oneByte {
		buf := make([]byte, min(n, max))
		if err := h.r.Read(addr, buf); err != nil {
			return nil, err
		}
		// Latin-1 to UTF-8.
		out := make([]byte, 0, len(buf))
		for _, c := range buf {
			out = appendRune(out, rune(c))
		}
		return cut(out, max), nil
	}
	buf := make([]byte, 2*min(n, max))
	if err := h.r.Read(addr, buf); err != nil {
		return nil, err
	}
	units := make([]uint16, len(buf)/2)
	for i := range units {
		units[i] = le.Uint16(buf[2*i:])
	}
	return cut([]byte(string(utf16.Decode(units))), max), nil
}

func appendRune(b []byte, r rune) []byte {
	if r < 0x80 {
		return append(b, byte(r))
	}
	return append(b, string(r)...)
}

// cut shortens b to at most max bytes.
func cut(b []byte, max int) []byte {
	if len(b) > max {
		return b[:max]
	}
	return b
}

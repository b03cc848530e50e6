package hotspot

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// The JVM describes the layout of its own structures for debuggers (the
// serviceability agent) in four tables that libjvm.so exports: fields
// (gHotSpotVMStructs), types (gHotSpotVMTypes), and int and long constants.
// Each exported table symbol is a pointer to an array of entries ended by
// one whose name is null; the layout of an entry is itself exported, as
// the offsets of its members and the array's stride
// (gHotSpotVMStructEntryTypeNameOffset, …), all set when the JVM starts
// (src/hotspot/share/runtime/vmStructs.{hpp,cpp}, JDK 8 to 26). Reading them
// from the target's memory makes every JDK version describe itself: no
// offset table is kept by hand.

// VMStructs is what a JVM's tables say about its structures.
type VMStructs struct {
	// Fields maps "Type::_field" to its offset in Type (a non-static
	// field) or its address (a static one).
	Fields map[string]Field
	// Types maps a type's name to its size in bytes.
	Types map[string]uint64
	// IntConstants and LongConstants map a constant's name to its value.
	IntConstants  map[string]int32
	LongConstants map[string]uint64
}

// Field is one entry of gHotSpotVMStructs.
type Field struct {
	// Type is the field's C++ type as the table spells it ("Symbol*").
	Type     string
	IsStatic bool
	// Offset is the field's byte offset in its struct (non-static fields).
	Offset uint64
	// Address is the field's address in the process (static fields).
	Address uint64
}

// Bounds of the tables, far above what a JVM exports (JDK 21: about 1,900
// fields, 750 types, 1,000 int and 100 long constants).
const (
	maxEntries    = 20000
	maxNameLength = 256
	// maxStride bounds an entry's size as the JVM states it.
	maxStride = 256
)

// vmTableSymbols are the exported symbols the tables are found by, in the
// order symbolAddrs returns them.
var vmTableSymbols = []string{
	"gHotSpotVMStructs",
	"gHotSpotVMStructEntryArrayStride",
	"gHotSpotVMStructEntryTypeNameOffset",
	"gHotSpotVMStructEntryFieldNameOffset",
	"gHotSpotVMStructEntryTypeStringOffset",
	"gHotSpotVMStructEntryIsStaticOffset",
	"gHotSpotVMStructEntryOffsetOffset",
	"gHotSpotVMStructEntryAddressOffset",
	"gHotSpotVMTypes",
	"gHotSpotVMTypeEntryArrayStride",
	"gHotSpotVMTypeEntryTypeNameOffset",
	"gHotSpotVMTypeEntrySizeOffset",
	"gHotSpotVMIntConstants",
	"gHotSpotVMIntConstantEntryArrayStride",
	"gHotSpotVMIntConstantEntryNameOffset",
	"gHotSpotVMIntConstantEntryValueOffset",
	"gHotSpotVMLongConstants",
	"gHotSpotVMLongConstantEntryArrayStride",
	"gHotSpotVMLongConstantEntryNameOffset",
	"gHotSpotVMLongConstantEntryValueOffset",
}

// ErrNotHotSpot says a file exports no vmStructs tables.
var ErrNotHotSpot = errors.New("not a HotSpot JVM (no gHotSpotVMStructs)")

// tableSymbols are the file addresses of vmTableSymbols.
type tableSymbols [20]uint64

// findTableSymbols looks up the tables' symbols in f's dynamic symbols.
func findTableSymbols(f *elf.File) (tableSymbols, error) {
	var out tableSymbols
	syms, err := f.DynamicSymbols()
	if err != nil {
		return out, fmt.Errorf("%w: %w", ErrNotHotSpot, err)
	}
	index := make(map[string]int, len(vmTableSymbols))
	for i, name := range vmTableSymbols {
		index[name] = i
	}
	found := 0
	for _, s := range syms {
		if i, ok := index[s.Name]; ok && out[i] == 0 && s.Value != 0 {
			out[i] = s.Value
			found++
		}
	}
	if out[0] == 0 {
		return out, ErrNotHotSpot
	}
	if found != len(vmTableSymbols) {
		for i, v := range out {
			if v == 0 {
				return out, fmt.Errorf("HotSpot exports gHotSpotVMStructs but not %s", vmTableSymbols[i])
			}
		}
	}
	return out, nil
}

// tableLayout is one table's entry layout as the JVM exports it.
type tableLayout struct {
	stride  uint64
	offsets []uint64
}

// readVMStructs reads the four tables of a process whose libjvm.so's
// symbols are at syms plus bias.
func readVMStructs(r *procmem.Reader, syms tableSymbols, bias uint64) (*VMStructs, error) {
	// The names lie together in libjvm.so's read-only data: about 100
	// pages for some 8,000 names.
	names := r.PageCache(1024)
	u64 := func(i int) (uint64, error) { return r.U64(syms[i] + bias) }
	layout := func(strideSym int, n int) (tableLayout, error) {
		l := tableLayout{}
		var err error
		if l.stride, err = u64(strideSym); err != nil {
			return l, err
		}
		if l.stride == 0 {
			return l, fmt.Errorf("%w: %s is 0", interpreter.ErrStarting, vmTableSymbols[strideSym])
		}
		if l.stride > maxStride {
			return l, fmt.Errorf("%s is %d: the tables are corrupt", vmTableSymbols[strideSym], l.stride)
		}
		for i := strideSym + 1; i <= strideSym+n; i++ {
			off, err := u64(i)
			if err != nil {
				return l, err
			}
			if off+8 > l.stride {
				return l, fmt.Errorf("%s is %d, past the entry's %d bytes", vmTableSymbols[i], off, l.stride)
			}
			l.offsets = append(l.offsets, off)
		}
		return l, nil
	}
	vs := &VMStructs{
		Fields:        map[string]Field{},
		Types:         map[string]uint64{},
		IntConstants:  map[string]int32{},
		LongConstants: map[string]uint64{},
	}

	// Fields: typeName, fieldName, typeString, isStatic, offset, address.
	l, err := layout(1, 6)
	if err != nil {
		return nil, err
	}
	err = walkTable(r, names, syms[0]+bias, l, func(e []byte, name string) error {
		fieldName, err := names.CString(le64(e, l.offsets[1]), maxNameLength)
		if err != nil {
			return fmt.Errorf("field name of %s: %w", name, err)
		}
		var typ string
		if p := le64(e, l.offsets[2]); p != 0 {
			typ, _ = names.CString(p, maxNameLength) // informative only
		}
		f := Field{
			Type:     typ,
			IsStatic: le32(e, l.offsets[3]) != 0,
			Offset:   le64(e, l.offsets[4]),
			Address:  le64(e, l.offsets[5]),
		}
		vs.Fields[name+"::"+fieldName] = f
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gHotSpotVMStructs: %w", err)
	}

	// Types: typeName, size.
	if l, err = layout(9, 2); err != nil {
		return nil, err
	}
	err = walkTable(r, names, syms[8]+bias, l, func(e []byte, name string) error {
		vs.Types[name] = le64(e, l.offsets[1])
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gHotSpotVMTypes: %w", err)
	}

	// Constants: name, value.
	if l, err = layout(13, 2); err != nil {
		return nil, err
	}
	err = walkTable(r, names, syms[12]+bias, l, func(e []byte, name string) error {
		vs.IntConstants[name] = int32(le32(e, l.offsets[1]))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gHotSpotVMIntConstants: %w", err)
	}
	if l, err = layout(17, 2); err != nil {
		return nil, err
	}
	err = walkTable(r, names, syms[16]+bias, l, func(e []byte, name string) error {
		vs.LongConstants[name] = le64(e, l.offsets[1])
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gHotSpotVMLongConstants: %w", err)
	}
	return vs, nil
}

// walkTable calls fn with each entry of the table whose pointer is at ptr
// and the name its first member (at l.offsets[0]) points to, up to the
// entry whose name is null.
func walkTable(r *procmem.Reader, names *procmem.PageCache, ptr uint64, l tableLayout, fn func(entry []byte, name string) error) error {
	base, err := r.Ptr(ptr)
	if err != nil {
		return err
	}
	if base == 0 {
		return fmt.Errorf("%w: the table is not set yet", interpreter.ErrStarting)
	}
	// Entries are read in batches: one read per entry would cost a system
	// call each (thousands per JVM).
	const batch = 64
	buf := make([]byte, batch*l.stride)
	for i := 0; i < maxEntries; i += batch {
		addr := base + uint64(i)*l.stride
		if err := r.Read(addr, buf); err != nil {
			// The table may end near the end of its mapping: read the
			// rest one entry at a time.
			err := walkEntries(r, names, addr, l, batch, fn)
			if errors.Is(err, errTableEnd) {
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
		for j := 0; j < batch; j++ {
			done, err := visitEntry(names, buf[uint64(j)*l.stride:uint64(j+1)*l.stride], l, fn)
			if done || err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("more than %d entries", maxEntries)
}

// errTableEnd ends walkEntries at the table's last entry.
var errTableEnd = errors.New("end of table")

// walkEntries visits n entries from addr, reading each on its own.
func walkEntries(r *procmem.Reader, names *procmem.PageCache, addr uint64, l tableLayout, n int, fn func([]byte, string) error) error {
	entry := make([]byte, l.stride)
	for j := 0; j < n; j++ {
		if err := r.Read(addr+uint64(j)*l.stride, entry); err != nil {
			return err
		}
		done, err := visitEntry(names, entry, l, fn)
		if err != nil {
			return err
		}
		if done {
			return errTableEnd
		}
	}
	return nil
}

// visitEntry calls fn for one entry; done is set at the table's end.
func visitEntry(names *procmem.PageCache, entry []byte, l tableLayout, fn func([]byte, string) error) (done bool, err error) {
	namePtr := le64(entry, l.offsets[0])
	if namePtr == 0 {
		return true, nil
	}
	name, err := names.CString(namePtr, maxNameLength)
	if err != nil {
		return false, err
	}
	return false, fn(entry, name)
}

func le64(b []byte, off uint64) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

func le32(b []byte, off uint64) uint32 { return binary.LittleEndian.Uint32(b[off:]) }

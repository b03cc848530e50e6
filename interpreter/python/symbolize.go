package python

// The symbolizer turns what the BPF unwinder reports for a Python frame (the
// address of its code object and an instruction offset) into a function,
// file and line by reading the code object out of the profiled process.
// That memory belongs to another program, which keeps running while we
// read: every pointer is checked before it is followed, every length is
// capped before anything is allocated, and whatever does not add up is an
// error, never a panic.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

var (
	// ErrNotCode says the address reported as a code object holds
	// something else: a frame of 3.13+ whose f_executable is not code, or
	// memory that changed under the unwinder.
	ErrNotCode = errors.New("not a CPython code object")
	// ErrBadObject says a code object's field is not the object it should
	// be: a string or bytes object of the wrong type, layout or size, as a
	// freed or torn object can be. Legacy (non-compact) strings, which
	// CPython never creates for code objects, are refused with it too.
	ErrBadObject = errors.New("malformed CPython object")
	// ErrUnreadable wraps a failed read of the process's memory; the read's
	// own error is wrapped too (io.EOF once the process has exited).
	ErrUnreadable = procmem.ErrUnreadable
)

// OffsetNotStarted is the offset of a frame that has not executed an
// instruction yet. Frame treats every offset with the top bit set (a
// negative int32) this way, so the unwinder can pass the signed byte
// difference it computes as is: f_lasti -1 (3.6-3.9), 2*f_lasti = -2
// (3.10), prev_instr one code unit before the code (3.11, 3.12).
const OffsetNotStarted = math.MaxUint32

// Limits on what one code object may make us read and keep.
const (
	// symMaxStringChars caps co_name, co_qualname and co_filename, in code
	// points: PATH_MAX is 4096 bytes.
	symMaxStringChars = 4096
	// symMaxTableBytes caps a line table: a code object that large would
	// take millions of lines of source.
	symMaxTableBytes = 1 << 20
	// symCacheEntries and symCacheBytes bound a Symbolizer's cache, by
	// number of code objects and by the bytes their names and line tables
	// hold, so that a process with a huge table cannot hold much memory.
	symCacheEntries = 4096
	symCacheBytes   = 4 << 20
)

// pyTPFlagsHeapType is Py_TPFLAGS_HEAPTYPE (Include/object.h, bit 9 in
// every 3.x): set for types created at run time by a class statement.
// The types the symbolizer checks for (code, str, bytes) are static, and a
// Python class named "code" is not one of them.
const pyTPFlagsHeapType = 1 << 9

// Frame is a symbolized Python frame.
type Frame struct {
	// FunctionName is co_qualname ("Class.method", "outer.<locals>.inner")
	// where the version has it (3.11+), else co_name.
	FunctionName string
	// FileName is co_filename, as the code was compiled.
	FileName string
	// Line is the source line of the instruction at the offset; FirstLine
	// for a frame that has not started; 0 when the line table gives the
	// instruction no line (an artificial instruction, 3.10+).
	Line int
	// FirstLine is co_firstlineno, the line of the def (or its first
	// decorator), or 1 for a module.
	FirstLine int
}

// Symbolizer symbolizes the Python frames of one process. It is safe for
// concurrent use. It reads memory through an io.ReaderAt, which is
// /proc/PID/mem for a live process: the caller opens and closes it.
//
// It caches what it read per code object address, bounded by entries and
// by bytes (symCacheEntries, symCacheBytes). A code object can be freed
// and its address reused, by another code object (a module reloaded, code
// compiled by exec) or anything else, so every hit is revalidated with the
// one read that a miss starts with anyway: the code object's header, up to
// the last field we use (about 150 bytes). An entry keeps the header
// fields it was built from: ob_type, co_firstlineno and the pointers to
// co_filename, co_name, co_qualname, the line table and (before 3.11,
// where it is a separate object) co_code; a hit counts only if they are
// all unchanged. Strings and bytes are immutable, and the objects a live
// code object points to are alive, so unchanged pointers mean unchanged
// contents. What this cannot tell apart: a new code object at the old
// address whose every one of these objects, the line table included, also
// sits where the old one's was, with another line table. Its names agree
// (they are the same, shared interned strings, or it would take more
// coincidences), and only its lines can be wrong until the entry is
// evicted. We accept that rather than read the line table on every hit.
type Symbolizer struct {
	mem    *procmem.Reader
	off    *Offsets
	format LineTableFormat

	// codeSpan is how much of a code object's header the lookup reads;
	// strSpan, bytesSpan and typeSpan likewise for the other objects.
	codeSpan, strSpan, bytesSpan, typeSpan int
	// tableField is the line table's offset in the code object: co_lnotab
	// or co_linetable.
	tableField int

	cache *interpreter.SymbolCache[uint64, *symEntry]

	mu sync.Mutex
	// types holds the address of each static type once its tp_name and
	// flags checked out, so that later objects need no read for it.
	types [symNumTypes]uint64
}

// NewSymbolizer returns a Symbolizer for a process whose memory mem reads
// and which runs the CPython that off describes.
func NewSymbolizer(mem io.ReaderAt, off *Offsets) (*Symbolizer, error) {
	return newSymbolizer(mem, off, symCacheEntries, symCacheBytes)
}

func newSymbolizer(mem io.ReaderAt, off *Offsets, entries, bytes int) (*Symbolizer, error) {
	format, err := LineTableFormatFor(off.Version)
	if err != nil {
		return nil, err
	}
	s := &Symbolizer{mem: procmem.New(mem), off: off, format: format, cache: interpreter.NewSymbolCache[uint64](entries, bytes, (*symEntry).cacheCost)}
	s.tableField = off.Code.Linetable
	if format == LineTableLnotab {
		s.tableField = off.Code.Lnotab
	}
	required := []struct {
		name   string
		offset int
	}{
		{"PyObject.ob_type", off.Object.Type},
		{"PyCodeObject.co_filename", off.Code.Filename},
		{"PyCodeObject.co_name", off.Code.Name},
		{"PyCodeObject.co_firstlineno", off.Code.FirstLineno},
		{"PyCodeObject line table", s.tableField},
		{"PyTypeObject.tp_name", off.Type.Name},
		{"PyTypeObject.tp_flags", off.Type.Flags},
		{"PyBytesObject.ob_size", off.Bytes.Size},
		{"PyBytesObject.ob_sval", off.Bytes.Data},
		{"PyASCIIObject.length", off.Unicode.Length},
		{"PyASCIIObject.state", off.Unicode.State},
		{"sizeof(PyASCIIObject)", off.Unicode.ASCIISize},
		{"sizeof(PyCompactUnicodeObject)", off.Unicode.CompactSize},
	}
	for _, r := range required {
		// The headers read are a few hundred bytes at most.
		if r.offset < 0 || r.offset > 1024 {
			return nil, fmt.Errorf("CPython %v offsets: %s at %d", off.Version.MajorMinor(), r.name, r.offset)
		}
	}
	ptr := func(field int) int { return fieldEnd(field, 8) }
	s.codeSpan = max(ptr(off.Object.Type), ptr(off.Code.Filename), ptr(off.Code.Name), ptr(off.Code.Qualname),
		fieldEnd(off.Code.FirstLineno, 4), ptr(s.tableField), ptr(off.Code.Code))
	s.strSpan = max(ptr(off.Object.Type), ptr(off.Unicode.Length), fieldEnd(off.Unicode.State, 4))
	s.bytesSpan = max(ptr(off.Object.Type), ptr(off.Bytes.Size))
	s.typeSpan = max(ptr(off.Type.Name), ptr(off.Type.Flags))
	return s, nil
}

// fieldEnd is where a field of size bytes at offset field ends, 0 for a
// NoField one: a read of the longest fieldEnd covers them all.
func fieldEnd(field, size int) int {
	if field < 0 {
		return 0
	}
	return field + size
}

// Stats returns the counts of the lookups so far.
func (s *Symbolizer) Stats() interpreter.CacheStats { return s.cache.Stats() }

// Frame symbolizes the frame running the code object at codeAddr at
// offset, which is in bytes from the code's first instruction, the unit
// LineForOffset takes in every version (see there):
//   - 3.6-3.9: f_lasti as is;
//   - 3.10: 2*f_lasti;
//   - 3.11, 3.12: prev_instr minus (codeAddr + Offsets.Code.CodeAdaptive);
//   - 3.13+: instr_ptr minus the same.
//
// An offset whose top bit is set (see OffsetNotStarted) is a frame that
// has not started, at line co_firstlineno.
//
// Errors wrap ErrNotCode, ErrBadObject, ErrUnreadable or
// ErrLineTableMalformed.
func (s *Symbolizer) Frame(codeAddr uint64, offset uint32) (Frame, error) {
	if codeAddr == 0 || codeAddr >= procmem.MaxPointer {
		return Frame{}, fmt.Errorf("%w: address %#x", ErrNotCode, codeAddr)
	}
	hdr := make([]byte, s.codeSpan)
	if err := s.read(codeAddr, hdr); err != nil {
		return Frame{}, fmt.Errorf("code object at %#x: %w", codeAddr, err)
	}
	id := s.codeID(hdr)
	e, err := s.cache.Get(codeAddr, func(e *symEntry) bool { return e.id == id },
		func() (*symEntry, error) { return s.load(codeAddr, id) })
	if err != nil {
		return Frame{}, err
	}
	return e.frame(s.format, offset)
}

// symCodeID is what identifies a code object: the fields of its header
// that its cache entry was built from (NoField ones stay 0).
type symCodeID struct {
	typ, filename, name, qualname, table, code uint64
	firstLine                                  int32
}

func (s *Symbolizer) codeID(hdr []byte) symCodeID {
	c := &s.off.Code
	ptr := func(field int) uint64 {
		if field < 0 {
			return 0
		}
		return binary.LittleEndian.Uint64(hdr[field:])
	}
	return symCodeID{
		typ:       ptr(s.off.Object.Type),
		filename:  ptr(c.Filename),
		name:      ptr(c.Name),
		qualname:  ptr(c.Qualname),
		table:     ptr(s.tableField),
		code:      ptr(c.Code),
		firstLine: int32(binary.LittleEndian.Uint32(hdr[c.FirstLineno:])),
	}
}

// load reads what a code object's frames are symbolized from.
func (s *Symbolizer) load(addr uint64, id symCodeID) (*symEntry, error) {
	if err := s.checkType(id.typ, symTypeCode); err != nil {
		return nil, fmt.Errorf("object at %#x: %w", addr, err)
	}
	if id.firstLine < 0 {
		// The code constructor refuses it since 3.8; the compiler never made one.
		return nil, fmt.Errorf("%w: code object %#x has co_firstlineno %d", ErrBadObject, addr, id.firstLine)
	}
	nameField, namePtr := "co_name", id.name
	if s.off.Code.Qualname >= 0 {
		nameField, namePtr = "co_qualname", id.qualname
	}
	name, err := s.readString(namePtr)
	if err != nil {
		return nil, fmt.Errorf("%s of code object %#x: %w", nameField, addr, err)
	}
	file, err := s.readString(id.filename)
	if err != nil {
		return nil, fmt.Errorf("co_filename of code object %#x: %w", addr, err)
	}
	table, err := s.readBytes(id.table, symMaxTableBytes)
	if err != nil {
		return nil, fmt.Errorf("line table of code object %#x: %w", addr, err)
	}
	return &symEntry{id: id, name: name, file: file, table: table}, nil
}

// symEntry is a cached code object.
type symEntry struct {
	id         symCodeID
	name, file string
	table      []byte
}

// symEntryOverhead approximates what an entry costs beyond its strings and
// table: the entry, its cache node and map slot, and the string headers.
const symEntryOverhead = 160

// cacheCost is what e counts against symCacheBytes.
func (e *symEntry) cacheCost() int {
	return len(e.name) + len(e.file) + len(e.table) + symEntryOverhead
}

func (e *symEntry) frame(format LineTableFormat, offset uint32) (Frame, error) {
	f := Frame{FunctionName: e.name, FileName: e.file, FirstLine: int(e.id.firstLine), Line: int(e.id.firstLine)}
	if int32(offset) < 0 {
		return f, nil
	}
	line, ok, err := LineForOffset(format, e.table, f.FirstLine, offset)
	if err != nil {
		return Frame{}, fmt.Errorf("%s (%s): offset %d: %w", f.FunctionName, f.FileName, offset, err)
	}
	f.Line = 0
	if ok {
		f.Line = line
	}
	return f, nil
}

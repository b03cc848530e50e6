package hotspot

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// Layout is what profiling a JVM takes from its vmStructs: where the code
// cache, the interpreter and the call stub are, and the offsets and widths
// of the fields the unwinder and the symbolizer read. Each JDK release
// renames, moves or narrows a few of them (see internals.md); Layout finds
// them by name and says which a JVM lacks, rather than keying on version
// numbers, except where the tables cannot tell (Unsigned5Bias).
type Layout struct {
	// Version is the JVM's major, minor, security and build number.
	Version [4]int32

	// CodeCacheHeaps is the address of CodeCache::_heaps, a
	// GrowableArray<CodeHeap*>*; its length and data are at
	// ArrayLen and ArrayData. JDK 8 has one heap instead, whose
	// CodeHeap* is at CodeCacheHeap (CodeCache::_heap).
	CodeCacheHeaps, CodeCacheHeap uint64
	ArrayLen, ArrayData           uint32
	// A CodeHeap's code and segment map are VirtualSpaces (HeapMemory,
	// HeapSegmap) from VSLow; VSHigh is the end of what the heap reserved
	// (_high_boundary: it commits memory up to it as it fills).
	// HeapLog2Segment holds the log2 of its segment size.
	HeapMemory, HeapSegmap, HeapLog2Segment uint32
	VSLow, VSHigh                           uint32
	// HeapBlockSize is sizeof(HeapBlock): the CodeBlob follows it.
	// HeapBlockUsed is the offset in it of the bool that says the block
	// is allocated (HeapBlock::_header._used).
	HeapBlockSize, HeapBlockUsed uint32

	Blob BlobLayout
	NM   NMethodLayout

	// Interpreter is the address of AbstractInterpreter::_code, the
	// StubQueue whose [StubBuffer, +BufferLimit) holds the template
	// interpreter's code.
	Interpreter             uint64
	StubBuffer, BufferLimit uint32

	Method MethodLayout

	// BCPSlot is the interpreted frame's slot of the bytecode pointer, in
	// words below its frame pointer; in JDK 8 (BCPMayBeIndex) the slot
	// holds the bytecode's index instead while the collector runs.
	BCPSlot       uint8
	BCPMayBeIndex bool

	// ContReturnPC is the address of ContinuationEntry::_return_pc where
	// the tables export it (JDK 25+), else 0.
	ContReturnPC uint64

	// Unsigned5Bias is 1 where HotSpot's compressed integers never use
	// the byte 0 (JDK 20+, JDK-8292758), else 0. No table says so.
	Unsigned5Bias uint8
}

// BlobLayout is a CodeBlob's fields.
type BlobLayout struct {
	Name, FrameSize uint32
	// FrameComplete is the offset of _frame_complete_offset, of
	// FrameCompleteWidth bytes.
	FrameComplete, FrameCompleteWidth uint32
	// Code is _code_begin, a pointer, or where CodeRelative is set
	// (JDK 23+) _code_offset, relative to the blob.
	Code         uint32
	CodeRelative bool
	// Kind is the offset of _kind (JDK 25+), HasKind says it exists;
	// KindNmethod is CodeBlobKind::Nmethod.
	Kind        uint32
	HasKind     bool
	KindNmethod uint8
}

// NMethodLayout is an nmethod's fields.
type NMethodLayout struct {
	Method, CompileID uint32
	// StubOffset is the offset of _stub_offset, where the nmethod's
	// handlers start (from the blob).
	StubOffset uint32
	// Scopes says where the debug information is: ScopesInBlob (JDK
	// 8-22) with _scopes_data_begin (a pointer; JDK 8: ScopesDataRelative,
	// _scopes_data_offset from the blob), _scopes_pcs_offset,
	// _dependencies_offset and _metadata_offset from the blob; or in
	// _immutable_data (JDK 23+), ImmutableData, with the PcDescs at
	// ScopesPCs and the scopes at ScopesData from it, and the metadata
	// at _mutable_data + _relocation_size (JDK 25+).
	ScopesInBlob, ScopesDataRelative         bool
	ScopesDataBegin, ScopesPCs, Dependencies uint32
	Metadata, ScopesData, ImmutableData      uint32
	MutableData, RelocationSize              uint32
	ImmutableDataSize                        uint32
	// MutableDataSize, where set (JDK 25+), ends the metadata.
	MutableDataSize uint32
	// CompLevel is the offset of _comp_level, CompLevelWidth its size (0
	// where the JVM does not export it).
	CompLevel, CompLevelWidth uint32
	// PcDescSize is sizeof(PcDesc).
	PcDescSize uint32
}

// MethodLayout is what naming a Method takes.
type MethodLayout struct {
	ConstMethod, AccessFlags, AccessFlagsWidth uint32
	// ConstMethodSize is sizeof(ConstMethod): the bytecodes follow it,
	// then the compressed line number table if bit 0 of the flags (at
	// Flags, FlagsWidth bytes) is set.
	ConstMethodSize, Constants, Flags, FlagsWidth, CodeSize, NameIndex uint32
	// SignatureIndex is the constant pool slot of the method's descriptor.
	SignatureIndex uint32
	// ConstantPoolSize is sizeof(ConstantPool): its slots follow it.
	ConstantPoolSize, PoolHolder uint32
	// SourceFileIndex is the offset of _source_file_name_index in the
	// ConstantPool, or in the InstanceKlass where SourceFileInKlass is
	// set (JDK 11).
	SourceFileIndex   uint32
	SourceFileInKlass bool
	KlassName         uint32
	SymbolLength      uint32
	SymbolBody        uint32
}

// layoutReader looks fields up and collects the names it did not find.
type layoutReader struct {
	vs      *VMStructs
	missing []string
}

func (r *layoutReader) field(names ...string) (Field, bool) {
	for _, n := range names {
		if f, ok := r.vs.Fields[n]; ok {
			return f, true
		}
	}
	return Field{}, false
}

// offset returns the offset of the first of names that exists, a
// non-static field.
func (r *layoutReader) offset(names ...string) uint32 {
	f, ok := r.field(names...)
	if !ok || f.IsStatic || f.Offset > 1<<16 {
		r.missing = append(r.missing, strings.Join(names, " or "))
		return 0
	}
	return uint32(f.Offset)
}

// address returns the address of a static field.
func (r *layoutReader) address(name string) uint64 {
	f, ok := r.vs.Fields[name]
	if !ok || !f.IsStatic || f.Address == 0 {
		r.missing = append(r.missing, name)
		return 0
	}
	return f.Address
}

// width returns the size of a field's type as the table spells it.
func (r *layoutReader) width(name string) uint32 {
	f, ok := r.vs.Fields[name]
	if !ok {
		return 0 // offset() reported it
	}
	if w := typeWidth(f.Type); w != 0 {
		return w
	}
	if size, ok := r.vs.Types[f.Type]; ok && size <= 8 {
		return uint32(size)
	}
	r.missing = append(r.missing, fmt.Sprintf("the width of %s (%q)", name, f.Type))
	return 0
}

// typeWidth is the size of the integer types HotSpot's fields use.
func typeWidth(t string) uint32 {
	switch t {
	case "u1", "bool", "uint8_t", "int8_t", "jbyte", "signed char", "volatile signed char":
		return 1
	case "u2", "unsigned short", "uint16_t", "int16_t", "jushort", "jshort":
		return 2
	case "u4", "int", "unsigned int", "uint32_t", "int32_t", "jint", "juint":
		return 4
	case "u8", "uint64_t", "int64_t", "size_t", "intptr_t", "uintptr_t", "address", "jlong":
		return 8
	}
	if strings.HasSuffix(t, "*") {
		return 8
	}
	return 0
}

func (r *layoutReader) size(typ string) uint32 {
	s, ok := r.vs.Types[typ]
	if !ok || s == 0 || s > 1<<16 {
		r.missing = append(r.missing, "sizeof("+typ+")")
		return 0
	}
	return uint32(s)
}

func (r *layoutReader) has(name string) bool {
	_, ok := r.vs.Fields[name]
	return ok
}

// ErrLayout says a JVM's tables lack what profiling it takes.
var ErrLayout = errors.New("HotSpot layout incomplete")

// NewLayout finds the Layout in a JVM's tables; version is read from the
// process (the static version fields are addresses in its memory).
func NewLayout(vs *VMStructs, version [4]int32) (*Layout, error) {
	r := &layoutReader{vs: vs}
	l := &Layout{Version: version}
	if version[0] >= 20 {
		l.Unsigned5Bias = 1
	}

	if r.has("CodeCache::_heaps") {
		l.CodeCacheHeaps = r.address("CodeCache::_heaps")
		l.ArrayLen = r.offset("GrowableArrayBase::_len", "GenericGrowableArray::_len")
		l.ArrayData = r.offset("GrowableArray<int>::_data")
	} else {
		// JDK 8: one heap (the segmented code cache is JDK 9's,
		// JEP 197).
		l.CodeCacheHeap = r.address("CodeCache::_heap")
	}
	l.HeapMemory = r.offset("CodeHeap::_memory")
	l.HeapSegmap = r.offset("CodeHeap::_segmap")
	l.HeapLog2Segment = r.offset("CodeHeap::_log2_segment_size")
	l.VSLow = r.offset("VirtualSpace::_low")
	l.VSHigh = r.offset("VirtualSpace::_high_boundary")
	l.HeapBlockSize = r.size("HeapBlock")
	l.HeapBlockUsed = r.offset("HeapBlock::_header") + r.offset("HeapBlock::Header::_used")

	b := &l.Blob
	b.Name = r.offset("CodeBlob::_name")
	b.FrameSize = r.offset("CodeBlob::_frame_size")
	b.FrameComplete = r.offset("CodeBlob::_frame_complete_offset")
	b.FrameCompleteWidth = r.width("CodeBlob::_frame_complete_offset")
	if b.CodeRelative = r.has("CodeBlob::_code_offset"); b.CodeRelative {
		b.Code = r.offset("CodeBlob::_code_offset")
	} else {
		b.Code = r.offset("CodeBlob::_code_begin")
	}
	if b.HasKind = r.has("CodeBlob::_kind"); b.HasKind {
		b.Kind = r.offset("CodeBlob::_kind")
		k, ok := vs.IntConstants["CodeBlobKind::Nmethod"]
		if !ok || k < 0 || k > 255 {
			r.missing = append(r.missing, "CodeBlobKind::Nmethod")
		}
		b.KindNmethod = uint8(k)
	}

	n := &l.NM
	n.Method = r.offset("nmethod::_method", "CompiledMethod::_method")
	n.CompileID = r.offset("nmethod::_compile_id")
	n.StubOffset = r.offset("nmethod::_stub_offset")
	n.ScopesPCs = r.offset("nmethod::_scopes_pcs_offset")
	if n.ScopesInBlob = !r.has("nmethod::_immutable_data"); n.ScopesInBlob {
		if n.ScopesDataRelative = r.has("nmethod::_scopes_data_offset"); n.ScopesDataRelative {
			n.ScopesDataBegin = r.offset("nmethod::_scopes_data_offset")
		} else {
			n.ScopesDataBegin = r.offset("CompiledMethod::_scopes_data_begin", "nmethod::_scopes_data_begin")
		}
		n.Dependencies = r.offset("nmethod::_dependencies_offset")
		n.Metadata = r.offset("nmethod::_metadata_offset")
	} else {
		n.ImmutableData = r.offset("nmethod::_immutable_data")
		n.ScopesData = r.offset("nmethod::_scopes_data_offset")
		n.ImmutableDataSize = r.offset("nmethod::_immutable_data_size")
		if !r.has("CodeBlob::_mutable_data") {
			// JDK 23 and 24 keep the metadata after the code, at an
			// offset no table exports.
			r.missing = append(r.missing, "CodeBlob::_mutable_data (JDK 23 and 24 are not supported)")
		}
		n.MutableData = r.offset("CodeBlob::_mutable_data")
		n.RelocationSize = r.offset("CodeBlob::_relocation_size")
		if r.has("CodeBlob::_mutable_data_size") {
			n.MutableDataSize = r.offset("CodeBlob::_mutable_data_size")
		}
	}
	// The tier is a nicety: without it frames are still named.
	if f, ok := r.field("nmethod::_comp_level"); ok && !f.IsStatic {
		if w := typeWidth(f.Type); w == 1 || w == 4 {
			n.CompLevel, n.CompLevelWidth = uint32(f.Offset), w
		} else if size := r.vs.Types[f.Type]; size == 1 || size == 4 {
			n.CompLevel, n.CompLevelWidth = uint32(f.Offset), uint32(size)
		}
	}
	n.PcDescSize = r.size("PcDesc")

	l.Interpreter = r.address("AbstractInterpreter::_code")
	l.StubBuffer = r.offset("StubQueue::_stub_buffer")
	l.BufferLimit = r.offset("StubQueue::_buffer_limit")

	m := &l.Method
	m.ConstMethod = r.offset("Method::_constMethod")
	m.AccessFlags = r.offset("Method::_access_flags")
	m.AccessFlagsWidth = r.width("Method::_access_flags")
	m.ConstMethodSize = r.size("ConstMethod")
	m.Constants = r.offset("ConstMethod::_constants")
	flags := "ConstMethod::_flags"
	if r.has("ConstMethod::_flags._flags") {
		flags = "ConstMethod::_flags._flags"
	}
	m.Flags = r.offset(flags)
	m.FlagsWidth = r.width(flags)
	m.CodeSize = r.offset("ConstMethod::_code_size")
	m.NameIndex = r.offset("ConstMethod::_name_index")
	m.SignatureIndex = r.offset("ConstMethod::_signature_index")
	m.ConstantPoolSize = r.size("ConstantPool")
	m.PoolHolder = r.offset("ConstantPool::_pool_holder")
	if m.SourceFileInKlass = !r.has("ConstantPool::_source_file_name_index"); m.SourceFileInKlass {
		m.SourceFileIndex = r.offset("InstanceKlass::_source_file_name_index")
	} else {
		m.SourceFileIndex = r.offset("ConstantPool::_source_file_name_index")
	}
	m.KlassName = r.offset("Klass::_name")
	if r.has("Symbol::_length") {
		m.SymbolLength = r.offset("Symbol::_length")
	} else {
		// Some builds export the length with the refcount in one
		// 32-bit word, the length its high half (little-endian).
		m.SymbolLength = r.offset("Symbol::_length_and_refcount") + 2
	}
	m.SymbolBody = r.offset("Symbol::_body", "Symbol::_body[0]")

	var ok bool
	if l.BCPSlot, ok = bcpSlot(version[0], runtime.GOARCH); !ok {
		r.missing = append(r.missing, "the interpreter's frame layout on "+runtime.GOARCH+
			" (known for JDK 8 and for 11 and later)")
	}
	l.BCPMayBeIndex = version[0] == 8
	if f, ok := vs.Fields["ContinuationEntry::_return_pc"]; ok && f.IsStatic {
		l.ContReturnPC = f.Address
	}

	if len(r.missing) > 0 {
		return nil, fmt.Errorf("%w: JDK %d.%d.%d lacks %s", ErrLayout, version[0], version[1], version[2],
			strings.Join(r.missing, ", "))
	}
	return l, nil
}

// bcpSlot is the interpreted frame's slot of the bytecode pointer, in
// words below its frame pointer, which no table exports
// (frame::interpreter_frame_bcp_offset, bcx_offset in JDK 8):
//   - JDK 8: -7 on x86_64 and aarch64 (jdk8u hotspot/src/cpu/x86/vm/frame_x86.hpp,
//     and the aarch64 port's hotspot/src/cpu/aarch64/vm/frame_aarch64.hpp);
//   - JDK 9 and later: -8 on x86_64, where the method's mirror took a slot
//     above it (src/hotspot/cpu/x86/frame_x86.hpp), -9 on aarch64, with a
//     padding or extended sp slot too (cpu/aarch64/frame_aarch64.hpp;
//     internals.md, "arm64" A.3); JDK 26's -8 measured on x86_64 (-Xint).
//
// 9 and 10, never measured, are refused with the other versions not listed.
func bcpSlot(major int32, arch string) (uint8, bool) {
	switch {
	case major == 8:
		return 7, arch == "amd64" || arch == "arm64"
	case major >= 11 && arch == "amd64":
		return 8, true
	case major >= 11 && arch == "arm64":
		return 9, true
	}
	return 0, false
}

// versionFields are the static ints of the JVM's version, in Layout.Version
// order: JDK 9 and later number the VM as the JDK.
var versionFields = []string{
	"Abstract_VM_Version::_vm_major_version",
	"Abstract_VM_Version::_vm_minor_version",
	"Abstract_VM_Version::_vm_security_version",
	"Abstract_VM_Version::_vm_build_number",
}

// readVersion reads the JVM's version from its static fields.
func readVersion(mem *procmem.Reader, vs *VMStructs) ([4]int32, error) {
	var v [4]int32
	if _, ok := vs.Fields[versionFields[2]]; !ok {
		return readVersion8(mem, vs)
	}
	for i, name := range versionFields {
		f, ok := vs.Fields[name]
		if !ok || !f.IsStatic {
			return v, fmt.Errorf("%w: no %s", ErrLayout, name)
		}
		n, err := mem.U32(f.Address)
		if err != nil {
			return v, fmt.Errorf("reading %s: %w", name, err)
		}
		v[i] = int32(n)
	}
	if v[0] < 9 {
		return v, fmt.Errorf("%w: a VM numbered %d.%d.%d without the JDK 8 version fields", ErrLayout, v[0], v[1], v[2])
	}
	return v, nil
}

// readVersion8 reads the version of a JVM whose VM has numbers of its own
// (HotSpot 25.504-b01 in JDK 8u504), which JDK 9 gave up (JEP 223): the
// major from JDK_Version::_current, the update from the VM's release
// string, which has no field of its own (jdk8u
// hotspot/src/share/vm/runtime/vm_version.cpp, java.hpp).
func readVersion8(mem *procmem.Reader, vs *VMStructs) ([4]int32, error) {
	var v [4]int32
	cur, ok := vs.Fields["JDK_Version::_current"]
	major, ok2 := vs.Fields["JDK_Version::_major"]
	if !ok || !ok2 || !cur.IsStatic || major.IsStatic {
		return v, fmt.Errorf("%w: neither %s nor JDK_Version::_current", ErrLayout, versionFields[2])
	}
	m, err := mem.U8(cur.Address + major.Offset)
	if err != nil {
		return v, fmt.Errorf("reading JDK_Version::_current: %w", err)
	}
	v[0] = int32(m)
	if v[0] == 0 || v[0] > 8 {
		// Set once the JDK's libraries start; 9 and later number the VM.
		return v, fmt.Errorf("%w: JDK_Version::_current is %d", interpreter.ErrStarting, v[0])
	}
	if f, ok := vs.Fields["Abstract_VM_Version::_s_vm_release"]; ok && f.IsStatic {
		if p, err := mem.Ptr(f.Address); err == nil && p != 0 {
			if rel, err := mem.CString(p, 64); err == nil {
				v[2] = vmReleaseUpdate(rel)
			}
		}
	}
	if f, ok := vs.Fields[versionFields[3]]; ok && f.IsStatic {
		if n, err := mem.U32(f.Address); err == nil {
			v[3] = int32(n)
		}
	}
	return v, nil
}

// vmReleaseUpdate is the update of a JDK 8 VM's release string: 504 in
// "25.504-b01", 0 where it has none.
func vmReleaseUpdate(rel string) int32 {
	_, rest, ok := strings.Cut(rel, ".")
	if !ok {
		return 0
	}
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n > 1<<20 {
		return 0
	}
	return int32(n)
}

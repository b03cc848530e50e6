package python

import (
	"debug/elf"
	"fmt"
	"io"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
)

// Binary is a CPython interpreter found in an ELF file, with what every
// process running it shares: its struct offsets and where it keeps its
// thread state key.
type Binary struct {
	*Interpreter
	// EvalRanges is the code of _PyEval_EvalFrameDefault, [start, end) in
	// file addresses: its symbol's range and any part the compiler split
	// off (see evalparts.go).
	EvalRanges [][2]uint64
	// Offsets is nil when Err is set.
	Offsets *Offsets
	// Err says why processes of this binary cannot be unwound (a version
	// the table lacks, a stripped 3.6); nil when they can.
	Err    error
	keyLoc ThreadStateKeyLocation
}

// NewBinary finds CPython in f (ErrNotPython for other files) and what
// unwinding its processes takes. functions returns the ranges of f's FDEs
// (nativeunwind.FunctionRanges), in which it looks for parts of the eval
// loop split off from its symbol; it is called only for CPython.
func NewBinary(f *elf.File, functions func() ([][2]uint64, error)) (*Binary, error) {
	in, err := Detect(f)
	if err != nil {
		return nil, err
	}
	return newBinary(f, in, functions), nil
}

// newBinary is NewBinary for the interpreter Detect found in f; what
// keeps its processes from being unwound is its Err.
func newBinary(f *elf.File, in *Interpreter, functions func() ([][2]uint64, error)) *Binary {
	b := &Binary{Interpreter: in, EvalRanges: [][2]uint64{in.EvalFrame}}
	if fns, err := functions(); err == nil {
		// Without the parts, the symbol's range still is the eval loop's
		// entry, where every call starts.
		b.EvalRanges, _ = evalParts(f, in, fns)
	}
	if b.Offsets, b.Err = binaryOffsets(f, in); b.Err != nil {
		b.Offsets = nil
		return b
	}
	if _, err := b.Offsets.frameLayout(); err != nil {
		b.Offsets, b.Err = nil, err
		return b
	}
	key, err := FindThreadStateKey(f, in, b.Offsets)
	if err != nil {
		b.Offsets, b.Err = nil, err
	}
	b.keyLoc = key
	return b
}

// binaryOffsets is the layout of the interpreter in f: the table's for its
// version, with, from 3.13 on, every offset the interpreter publishes in
// its _Py_DebugOffsets (which its _PyRuntime's static initializer holds,
// so the file has them) in place of the table's. So a patch release or a
// build whose structs differ from the table's is read as it describes
// itself, and one whose self-description does not decode is refused. A
// debug build (Py_DEBUG) is read only where nothing the table alone
// supplies depends on its build: from 3.15, whose thread state is found
// from code; before, its thread state key's place in _PyRuntime is not
// published.
func binaryOffsets(f *elf.File, in *Interpreter) (*Offsets, error) {
	o, err := OffsetsFor(in.Version)
	if err != nil {
		return nil, err
	}
	if o.Debug.Size == NoField {
		if in.Debug {
			return nil, fmt.Errorf("CPython %v is a debug build (Py_DEBUG): the offsets table describes release builds, and it publishes no _Py_DebugOffsets",
				in.Version.MajorMinor())
		}
		return o, nil
	}
	if in.Runtime == 0 {
		return nil, fmt.Errorf("CPython %v without %s", in.Version.MajorMinor(), RuntimeSymbol)
	}
	raw, err := interpreter.ReadELF(f, in.Runtime+uint64(o.Runtime.DebugOffsets), uint64(o.Debug.Size))
	if err != nil {
		return nil, fmt.Errorf("CPython %v: reading _Py_DebugOffsets: %w", in.Version.MajorMinor(), err)
	}
	published, err := DecodeDebugOffsets(raw)
	if err != nil {
		return nil, fmt.Errorf("CPython %v: %w", in.Version.MajorMinor(), err)
	}
	if published.Version != in.Version {
		return nil, fmt.Errorf("CPython %v publishes _Py_DebugOffsets of %v", in.Version.MajorMinor(), published.Version.MajorMinor())
	}
	if in.Debug && published.ThreadStateFrom != ThreadStateFromGILStateTLS {
		return nil, fmt.Errorf("CPython %v is a debug build (Py_DEBUG): its thread state key's place in _PyRuntime is not in _Py_DebugOffsets",
			in.Version.MajorMinor())
	}
	return published, nil
}

// Process is a process that runs a Binary: it describes the process to
// the BPF unwinder and symbolizes its Python frames.
type Process struct {
	*Symbolizer
	unwinder UnwinderProc
}

// NewProcess describes a process that maps b's file with load bias bias
// (its address minus its file virtual address), whose C library keeps
// thread-specific data as tsd says and whose memory mem reads. The
// interpreter need not have started: the unwinder reads its thread state
// key per sample.
func (b *Binary) NewProcess(mem io.ReaderAt, bias uint64, tsd libc.TSDLayout) (*Process, error) {
	if b.Err != nil {
		return nil, b.Err
	}
	if b.keyLoc.TLS == nil && b.keyLoc.KeySize != 4 {
		return nil, fmt.Errorf("thread state key of %d bytes", b.keyLoc.KeySize)
	}
	sym, err := NewSymbolizer(mem, b.Offsets)
	if err != nil {
		return nil, err
	}
	u, err := b.Offsets.unwinderProc()
	if err != nil {
		return nil, err
	}
	switch {
	case b.keyLoc.TLS != nil:
		u.TStateTLSOffset = b.keyLoc.TLS.Offset
		if b.keyLoc.TLS.Index != 0 {
			u.TStateTLSIndex = b.keyLoc.TLS.Index + bias
		}
	default:
		u.KeyAddr = b.keyLoc.Key + bias
		if b.keyLoc.Initialized != 0 {
			u.KeyReadyAddr = b.keyLoc.Initialized + bias
		}
	}
	u.TSDSelfOffset = tsd.SelfOffset
	u.TSDBlockOffset = tsd.FirstBlockOffset
	u.TSDEntrySize = uint32(tsd.EntrySize)
	u.TSDDataOffset = tsd.DataOffset
	u.TSDMaxKey = tsd.MaxFastKey
	u.TSDSelfDeref = boolByte(tsd.SelfDeref)
	u.TSDBlockDeref = boolByte(tsd.BlockDeref)
	return &Process{Symbolizer: sym, unwinder: u}, nil
}

// Unwinder is the process's entry of the BPF Python unwinder's map.
func (p *Process) Unwinder() UnwinderProc { return p.unwinder }

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// frameLayout says how the unwinder walks this version's frames.
func (o *Offsets) frameLayout() (FrameLayout, error) {
	switch {
	case o.Version.Major != 3 || o.Version.Minor < 6:
	case o.Version.Minor <= 10:
		return FramesObjects, nil
	case o.Version.Minor == 11:
		return Frames311, nil
	case o.Version.Minor == 12:
		return Frames312, nil
	case o.Version.Minor <= 15:
		// 3.14 and 3.15 link frames as 3.13 does; their f_executable
		// carries tag bits, which the unwinder clears for every version.
		return Frames313, nil
	}
	return 0, fmt.Errorf("CPython %v: no frame layout for the unwinder", o.Version.MajorMinor())
}

// unwinderProc is the version's part of the unwinder's entry: which fields
// link the frames and what each frame reports.
func (o *Offsets) unwinderProc() (UnwinderProc, error) {
	layout, err := o.frameLayout()
	if err != nil {
		return UnwinderProc{}, err
	}
	u := UnwinderProc{FrameLayout: layout}
	f := &o.InterpreterFrame
	type field struct {
		name  string
		value int
		dst   *uint16
	}
	var fields []field
	need := func(name string, value int, dst *uint16) { fields = append(fields, field{name, value, dst}) }
	switch layout {
	case FramesObjects:
		u.LastiUnit = uint8(o.LastiUnit)
		need("PyThreadState.frame", o.ThreadState.Frame, &u.TStateFrame)
		need("PyFrameObject.f_back", o.FrameObject.Back, &u.FramePrevious)
		need("PyFrameObject.f_code", o.FrameObject.Code, &u.FrameCode)
		need("PyFrameObject.f_lasti", o.FrameObject.Lasti, &u.FrameInstr)
	case Frames311, Frames312:
		need("PyThreadState.cframe", o.ThreadState.CFrame, &u.TStateFrame)
		need("_PyCFrame.current_frame", o.CFrame.CurrentFrame, &u.CFrameCurrentFrame)
		need("_PyInterpreterFrame.f_code", f.Code, &u.FrameCode)
		need("_PyInterpreterFrame.prev_instr", f.PrevInstr, &u.FrameInstr)
	case Frames313:
		need("PyThreadState.current_frame", o.ThreadState.CurrentFrame, &u.TStateFrame)
		need("_PyInterpreterFrame.f_executable", f.Executable, &u.FrameCode)
		need("_PyInterpreterFrame.instr_ptr", f.InstrPtr, &u.FrameInstr)
	}
	if layout != FramesObjects {
		need("_PyInterpreterFrame.previous", f.Previous, &u.FramePrevious)
		need("PyCodeObject.co_code_adaptive", o.Code.CodeAdaptive, &u.CodeAdaptive)
	}
	if layout == Frames311 {
		need("_PyInterpreterFrame.is_entry", f.IsEntry, &u.FrameIsEntry)
		need("_PyCFrame.previous", o.CFrame.Previous, &u.CFramePrevious)
	}
	if layout >= Frames312 {
		need("_PyInterpreterFrame.owner", f.Owner, &u.FrameOwner)
		// The lowest owner value of an entry frame: 3.14 gives entry
		// frames FRAME_OWNED_BY_INTERPRETER, one below CSTACK, which 3.15
		// dropped.
		entry := -1
		for _, v := range []int{f.OwnedByCStack, f.OwnedByInterpreter} {
			if v != NoField && (entry < 0 || v < entry) {
				entry = v
			}
		}
		if entry < 0 || entry > 0xff {
			return UnwinderProc{}, fmt.Errorf("CPython %v: entry frame owner %d", o.Version.MajorMinor(), entry)
		}
		u.EntryFrameOwner = uint8(entry)
	}
	for _, fl := range fields {
		if fl.value < 0 || fl.value > 0xffff {
			return UnwinderProc{}, fmt.Errorf("CPython %v: %s at %d", o.Version.MajorMinor(), fl.name, fl.value)
		}
		*fl.dst = uint16(fl.value)
	}
	if layout == FramesObjects && u.LastiUnit == 0 {
		return UnwinderProc{}, fmt.Errorf("CPython %v: f_lasti without a unit", o.Version.MajorMinor())
	}
	return u, nil
}

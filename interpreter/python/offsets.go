package python

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// The table in offsets_table.go is compiled from the CPython headers that
// pyenv installed (3.6-3.13) and from Debian unstable's libpython3.X-dev of
// the releases utils/pyfetch fetches (pyfetch.Fetched); see utils/pyoffsets.
//go:generate go run ../../utils/pyoffsets -out offsets_table.go

// Version is a CPython minor release line: Patch is always 0 (the micro
// release is Interpreter.Micro), and it is printed with MajorMinor. The
// table is keyed by it: it assumes that patch releases keep the layouts of
// their minor version, as CPython does in practice (TestOffsetsMatchDWARF
// checks that wherever an interpreter of another patch release is
// installed, such as Debian's). It is an alias because utils/pyoffsets
// generates Version literals.
type Version = interpreter.Version

// NoField marks a field, struct or enumerator the version does not have.
const NoField = -1

// ErrNoOffsets is wrapped by OffsetsFor for versions and architectures
// the table does not cover.
var ErrNoOffsets = errors.New("no struct offsets for this CPython version")

// Offsets is the layout of the CPython structures the Python unwinder and
// symbolizer read, for one minor version on one architecture, as the C
// compiler laid them out for the default build (with the GIL, without
// Py_DEBUG or Py_TRACE_REFS). Every field of the groups below is a byte
// offset into the named C struct, a size in bytes, an enumerator's value or
// a bit position; NoField where the version lacks it.
//
// Header paths are relative to CPython's Include/; "internal/" headers need
// Py_BUILD_CORE.
type Offsets struct {
	Version Version
	Arch    string // GOARCH

	// ThreadStateFrom says how a thread's PyThreadState is found (hand-written,
	// not compiled).
	ThreadStateFrom ThreadStateSource
	// LastiUnit is how many bytes one unit of FrameObject.Lasti counts: 1
	// before 3.10 (f_lasti is a byte offset into co_code), 2 in 3.10 (it
	// counts _Py_CODEUNITs); 0 from 3.11, which has no f_lasti. An f_lasti
	// of -1 means that the frame has not started.
	LastiUnit int

	Runtime          RuntimeOffsets
	TSS              TSSOffsets
	Interpreter      InterpreterOffsets
	ThreadState      ThreadStateOffsets
	CFrame           CFrameOffsets
	FrameObject      FrameObjectOffsets
	InterpreterFrame InterpreterFrameOffsets
	Code             CodeOffsets
	Object           ObjectOffsets
	Type             TypeOffsets
	Bytes            BytesOffsets
	Unicode          UnicodeOffsets
	Debug            DebugLayout
}

// ThreadStateSource is where the unwinder finds the PyThreadState of the
// interrupted thread.
type ThreadStateSource int

const (
	// ThreadStateFromGlobal (3.6): the exported _PyThreadState_Current
	// (Include/pystate.h) holds the GIL holder's thread state; each thread's
	// own is the pthread-specific value of the key stored in autoTLSkey, a
	// static int in Python/pystate.c (in .symtab only).
	ThreadStateFromGlobal ThreadStateSource = iota + 1
	// ThreadStateFromRuntime (3.7-3.11): _PyRuntime + Runtime.TStateCurrent
	// holds the GIL holder's thread state; each thread's own is the
	// pthread-specific value of the key at _PyRuntime + Runtime.AutoTSSKey +
	// TSS.Key.
	ThreadStateFromRuntime
	// ThreadStateFromTLS (3.12+): the thread-local _Py_tss_tstate
	// (Python/pystate.c; a local TLS symbol, in .symtab only) holds each
	// thread's own. The pthread key at _PyRuntime + Runtime.AutoTSSKey +
	// TSS.Key still names it too, unless the thread switched to another
	// interpreter (the key keeps the thread state last bound for the
	// GILState API, bind_gilstate_tstate in Python/pystate.c; before 3.12
	// the first one bound).
	ThreadStateFromTLS
	// ThreadStateFromGILStateTLS (3.15+): no pthread key is left; the
	// thread-local _Py_tss_gilstate (Python/pystate.c, static) holds the
	// thread state last bound for the GILState API, what the key held
	// before, and, unlike _Py_tss_tstate, keeps it while the thread has
	// released the GIL. PyGILState_GetThisThreadState, exported, reads it.
	ThreadStateFromGILStateTLS
)

// Symbols the offsets above are relative to.
const (
	RuntimeSymbol            = "_PyRuntime"             // 3.7+, exported
	CurrentThreadStateSymbol = "_PyThreadState_Current" // 3.6, exported
	TLSKeySymbol             = "autoTLSkey"             // 3.6, static
	ThreadLocalStateSymbol   = "_Py_tss_tstate"         // 3.12+, TLS
	// GILStateReaderSymbol is the exported function that reads
	// _Py_tss_gilstate (3.15+).
	GILStateReaderSymbol = "PyGILState_GetThisThreadState"
)

// RuntimeOffsets is _PyRuntimeState, the type of the global _PyRuntime
// (3.7+): internal/pystate.h (3.7), internal/pycore_pystate.h (3.8),
// internal/pycore_runtime.h (3.9+). It holds glibc types whose sizes
// differ between amd64 and arm64 (pthread_mutex_t), so its offsets do too.
type RuntimeOffsets struct {
	Size             int
	InterpretersHead int // interpreters.head
	InterpretersMain int // interpreters.main
	// TStateCurrent is gilstate.tstate_current (3.7-3.11), an atomic
	// pointer to the thread state holding the GIL.
	TStateCurrent int
	// AutoTSSKey is the Py_tss_t gilstate.autoTSSkey (3.7-3.11), moved to
	// autoTSSkey (3.12+).
	AutoTSSKey int
	// DebugOffsets is debug_offsets, the _Py_DebugOffsets (3.13+) that
	// Debug describes; CPython keeps it first, at 0.
	DebugOffsets int
}

// TSSOffsets is Py_tss_t (struct _Py_tss_t; pythread.h 3.7-3.10,
// cpython/pythread.h 3.11+): an int _is_initialized and the native key,
// pthread_key_t on Linux.
type TSSOffsets struct {
	Size          int
	IsInitialized int // _is_initialized
	Key           int // _key
	KeySize       int // sizeof(_key)
}

// InterpreterOffsets is PyInterpreterState (struct _is): pystate.h (3.6,
// 3.7), internal/pycore_pystate.h (3.8), internal/pycore_interp.h (3.9+).
type InterpreterOffsets struct {
	Next        int // next
	ThreadsHead int // tstate_head (3.6-3.10), threads.head (3.11+)
}

// ThreadStateOffsets is PyThreadState (struct _ts): pystate.h (3.6, 3.7),
// cpython/pystate.h (3.8+).
type ThreadStateOffsets struct {
	Size     int
	Prev     int // prev
	Next     int // next
	Interp   int // interp
	ThreadID int // thread_id: pthread_self() (long in 3.6, unsigned long later)
	// NativeThreadID is native_thread_id (3.11+), the kernel's TID.
	NativeThreadID int
	// Frame is frame (3.6-3.10), the PyFrameObject being executed.
	Frame int
	// CFrame is cframe (3.10-3.12), a pointer to the _PyCFrame of the
	// innermost _PyEval_EvalFrameDefault. In 3.10 the CFrame only carries
	// use_tracing: the frame is still Frame.
	CFrame int
	// CurrentFrame is current_frame (3.13+), the _PyInterpreterFrame being
	// executed.
	CurrentFrame int
}

// CFrameOffsets is CFrame (3.10) and _PyCFrame (3.11, 3.12),
// cpython/pystate.h: a struct on the C stack of _PyEval_EvalFrameDefault.
type CFrameOffsets struct {
	CurrentFrame int // current_frame (3.11, 3.12)
	Previous     int // previous (3.10-3.12)
}

// FrameObjectOffsets is PyFrameObject (struct _frame) as the interpreter
// loop used it up to 3.10: frameobject.h (3.6-3.8), cpython/frameobject.h
// (3.9, 3.10). From 3.11 frame objects are created lazily and the unwinder
// reads InterpreterFrame instead, so these are NoField there.
type FrameObjectOffsets struct {
	Back  int // f_back
	Code  int // f_code
	Lasti int // f_lasti, an int in units of Offsets.LastiUnit
}

// InterpreterFrameOffsets is _PyInterpreterFrame (3.11+) and its enum
// _frameowner, internal/pycore_frame.h (3.11-3.13),
// internal/pycore_interpframe_structs.h (3.14).
type InterpreterFrameOffsets struct {
	Size     int
	Previous int // previous
	// Code is f_code (3.11, 3.12), always a code object.
	Code int
	// Executable is f_executable (3.13+), which holds a code object for
	// Python frames but may hold None or another object for shim and
	// trampoline frames: check its type before reading it as code. In
	// 3.14 it is a _PyStackRef, the pointer with tag bits in its low two
	// bits (Py_TAG_BITS, internal/pycore_stackref.h).
	Executable int
	// PrevInstr is prev_instr (3.11, 3.12), a _Py_CODEUNIT * to the code
	// unit before the next instruction (possibly an inline cache entry).
	PrevInstr int
	// InstrPtr is instr_ptr (3.13+), the instruction being executed or
	// about to begin. For both, pointer - (code + Code.CodeAdaptive) is the
	// byte offset CPython looks the frame's line up for
	// (_PyInterpreterFrame_LASTI times sizeof(_Py_CODEUNIT)).
	InstrPtr   int
	Owner      int // owner, a char holding an enum _frameowner value
	IsEntry    int // is_entry (3.11 only): the first frame of a C call of the eval loop
	Localsplus int // localsplus

	OwnedByThread      int // FRAME_OWNED_BY_THREAD
	OwnedByGenerator   int // FRAME_OWNED_BY_GENERATOR
	OwnedByFrameObject int // FRAME_OWNED_BY_FRAME_OBJECT
	// OwnedByCStack is FRAME_OWNED_BY_CSTACK (3.12+): in 3.12 and 3.13
	// the entry frame _PyEval_EvalFrameDefault pushes on the C stack; it
	// has no code to report and marks where the Python stack of one C call
	// of the eval loop ends (IsEntry did that in 3.11).
	OwnedByCStack int
	// OwnedByInterpreter is FRAME_OWNED_BY_INTERPRETER (3.14+), which the
	// entry frame has from 3.14 on.
	OwnedByInterpreter int
}

// CodeOffsets is PyCodeObject: code.h (3.6-3.8), cpython/code.h (3.9+).
type CodeOffsets struct {
	Size int
	// CodeUnitSize is sizeof(_Py_CODEUNIT): 2 (an opcode byte and an
	// argument byte) since 3.6.
	CodeUnitSize int
	Filename     int // co_filename, a str
	Name         int // co_name, a str
	Qualname     int // co_qualname (3.11+), a str
	FirstLineno  int // co_firstlineno, an int
	// Lnotab is co_lnotab (3.6-3.9), bytes mapping byte offsets to lines.
	Lnotab int
	// Linetable is co_linetable (3.10+), bytes in the 3.10 format (address
	// ranges) or the 3.11+ location table format.
	Linetable int
	// Code is co_code (3.6-3.10), the bytes object that Lasti indexes.
	Code int
	// CodeAdaptive is co_code_adaptive (3.11+), the instructions inline in
	// the code object: an instruction pointer minus (code + CodeAdaptive) is
	// its byte offset.
	CodeAdaptive int
}

// ObjectOffsets is PyObject and PyVarObject: object.h.
type ObjectOffsets struct {
	Type int // PyObject.ob_type
	Size int // PyVarObject.ob_size
}

// TypeOffsets is PyTypeObject (struct _typeobject): object.h (3.6, 3.7),
// cpython/object.h (3.8+). Reading tp_name ("code", "str", "bytes") checks
// that a pointer is the object the unwinder expects.
type TypeOffsets struct {
	Name  int // tp_name, a const char *
	Flags int // tp_flags
}

// BytesOffsets is PyBytesObject: bytesobject.h (3.6-3.8),
// cpython/bytesobject.h (3.9+).
type BytesOffsets struct {
	Size int // ob_base.ob_size, the length
	Data int // ob_sval, the characters inline
}

// UnicodeOffsets is PyASCIIObject, PyCompactUnicodeObject and
// PyUnicodeObject: unicodeobject.h (3.6, 3.7), cpython/unicodeobject.h
// (3.8+). A compact string (state.compact set, as all strings created by
// PyUnicode_New are) keeps its characters right after the struct: after
// ASCIISize bytes if state.ascii is set, else after CompactSize bytes, in
// units of state.kind bytes (1, 2 or 4). A legacy string's are at the
// pointer at Data. 3.12 removed wstr (and state.ready), which shrank both
// sizes.
type UnicodeOffsets struct {
	Length      int // PyASCIIObject.length, in code points
	State       int // PyASCIIObject.state, a 32-bit word of bit-fields
	ASCIISize   int // sizeof(PyASCIIObject)
	CompactSize int // sizeof(PyCompactUnicodeObject)
	Data        int // PyUnicodeObject.data
	// Bit positions (from the least significant bit of the little-endian
	// state word) and widths of state.kind, state.compact and state.ascii.
	KindShift, KindBits       int
	CompactShift, CompactBits int
	ASCIIShift, ASCIIBits     int
}

// DebugLayout is where each field of _Py_DebugOffsets (3.13+,
// internal/pycore_runtime.h; internal/pycore_debug_offsets.h in 3.14) lives, as byte offsets into that struct. A
// running 3.13+ interpreter fills it with the offsets it was built with;
// DecodeDebugOffsets reads them. The struct is only stable within a minor
// version, hence the per-version layout.
type DebugLayout struct {
	Size                      int
	Cookie                    int // cookie, "xdebugpy"
	Version                   int // version, PY_VERSION_HEX
	FreeThreaded              int // free_threaded
	RuntimeSize               int // runtime_state.size
	RuntimeInterpretersHead   int // runtime_state.interpreters_head
	InterpreterNext           int // interpreter_state.next
	InterpreterThreadsHead    int // interpreter_state.threads_head
	ThreadStateSize           int // thread_state.size
	ThreadStatePrev           int // thread_state.prev
	ThreadStateNext           int // thread_state.next
	ThreadStateInterp         int // thread_state.interp
	ThreadStateCurrentFrame   int // thread_state.current_frame
	ThreadStateThreadID       int // thread_state.thread_id
	ThreadStateNativeThreadID int // thread_state.native_thread_id
	FrameSize                 int // interpreter_frame.size
	FramePrevious             int // interpreter_frame.previous
	FrameExecutable           int // interpreter_frame.executable
	FrameInstrPtr             int // interpreter_frame.instr_ptr
	FrameLocalsplus           int // interpreter_frame.localsplus
	FrameOwner                int // interpreter_frame.owner
	CodeSize                  int // code_object.size
	CodeFilename              int // code_object.filename
	CodeName                  int // code_object.name
	CodeQualname              int // code_object.qualname
	CodeLinetable             int // code_object.linetable
	CodeFirstLineno           int // code_object.firstlineno
	CodeCodeAdaptive          int // code_object.co_code_adaptive
	ObjectType                int // pyobject.ob_type
	TypeName                  int // type_object.tp_name
	TypeFlags                 int // type_object.tp_flags
	BytesSize                 int // bytes_object.ob_size
	BytesData                 int // bytes_object.ob_sval
	UnicodeState              int // unicode_object.state
	UnicodeLength             int // unicode_object.length
	UnicodeASCIISize          int // unicode_object.asciiobject_size
}

// OffsetsFor returns the layout of CPython v on the architecture the
// profiler runs on (which is that of the processes it profiles).
func OffsetsFor(v Version) (*Offsets, error) {
	return offsetsFor(runtime.GOARCH, v)
}

func offsetsFor(arch string, v Version) (*Offsets, error) {
	for i := range generatedOffsets {
		o := generatedOffsets[i]
		if o.Version != v || o.Arch != arch {
			continue
		}
		o.ThreadStateFrom, o.LastiUnit = versionSemantics(v)
		return &o, nil
	}
	return nil, fmt.Errorf("CPython %s on %s: %w", v.MajorMinor(), arch, ErrNoOffsets)
}

// versionSemantics holds what the compiler cannot tell: how fields are
// meant to be read.
func versionSemantics(v Version) (ThreadStateSource, int) {
	switch {
	case v.Minor <= 6:
		return ThreadStateFromGlobal, 1
	case v.Minor <= 9:
		return ThreadStateFromRuntime, 1
	case v.Minor == 10:
		return ThreadStateFromRuntime, 2
	case v.Minor == 11:
		return ThreadStateFromRuntime, 0
	case v.Minor <= 14:
		return ThreadStateFromTLS, 0
	default:
		return ThreadStateFromGILStateTLS, 0
	}
}

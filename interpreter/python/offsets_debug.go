package python

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
)

// ErrNoDebugOffsets says that the bytes given to DecodeDebugOffsets do not
// start with the _Py_DebugOffsets cookie: the process is older than 3.13,
// or the address is not that of _PyRuntime.
var ErrNoDebugOffsets = errors.New("no _Py_DebugOffsets cookie")

// debugCookie opens _Py_DebugOffsets (_Py_Debug_Cookie in
// internal/pycore_runtime.h); the PY_VERSION_HEX that follows it selects
// the layout of the rest.
const (
	debugCookie        = "xdebugpy"
	debugVersionOffset = 8
	// Offsets are far below this; a larger value means the bytes are not
	// what they claim to be.
	maxDebugValue = 1 << 24
)

// DecodeDebugOffsets reads the _Py_DebugOffsets that a CPython 3.13+
// process keeps at the start of _PyRuntime (raw holds at least
// Debug.Size bytes read from there) and returns the table's offsets for the
// version it names, with every field the process publishes replaced by the
// published value. The table still supplies what _Py_DebugOffsets lacks:
// autoTSSkey, the frame owner values and the string bit-fields.
func DecodeDebugOffsets(raw []byte) (*Offsets, error) {
	return decodeDebugOffsets(runtime.GOARCH, raw)
}

func decodeDebugOffsets(arch string, raw []byte) (*Offsets, error) {
	if len(raw) < debugVersionOffset+8 || string(raw[:len(debugCookie)]) != debugCookie {
		return nil, ErrNoDebugOffsets
	}
	// The process reading is the profiled process's host: same byte order.
	hex := binary.NativeEndian.Uint64(raw[debugVersionOffset:])
	v := Version{Major: int(hex >> 24 & 0xff), Minor: int(hex >> 16 & 0xff)}
	o, err := offsetsFor(arch, v)
	if err != nil {
		return nil, fmt.Errorf("_Py_DebugOffsets of version %#x: %w", hex, err)
	}
	d := o.Debug
	if d.Size == NoField || d.Version != debugVersionOffset {
		return nil, fmt.Errorf("CPython %s: the table has no _Py_DebugOffsets layout: %w", v.MajorMinor(), ErrNoOffsets)
	}
	if len(raw) < d.Size {
		return nil, fmt.Errorf("CPython %s: _Py_DebugOffsets is %d bytes, got %d", v.MajorMinor(), d.Size, len(raw))
	}
	if binary.NativeEndian.Uint64(raw[d.FreeThreaded:]) != 0 {
		return nil, fmt.Errorf("CPython %s free-threaded build: %w", v.MajorMinor(), ErrNoOffsets)
	}
	for _, t := range o.debugTargets() {
		if t.at < 0 || t.at+8 > d.Size {
			return nil, fmt.Errorf("CPython %s: the table's _Py_DebugOffsets layout is broken", v.MajorMinor())
		}
		val := binary.NativeEndian.Uint64(raw[t.at:])
		if val >= maxDebugValue {
			return nil, fmt.Errorf("CPython %s: _Py_DebugOffsets value %#x at %d is implausible", v.MajorMinor(), val, t.at)
		}
		*t.field = int(val)
	}
	return o, nil
}

// debugTarget is a field of Offsets that _Py_DebugOffsets publishes, and
// where in _Py_DebugOffsets it does.
type debugTarget struct {
	at    int
	field *int
}

func (o *Offsets) debugTargets() []debugTarget {
	d := &o.Debug
	return []debugTarget{
		{d.RuntimeSize, &o.Runtime.Size},
		{d.RuntimeInterpretersHead, &o.Runtime.InterpretersHead},
		{d.InterpreterNext, &o.Interpreter.Next},
		{d.InterpreterThreadsHead, &o.Interpreter.ThreadsHead},
		{d.ThreadStateSize, &o.ThreadState.Size},
		{d.ThreadStatePrev, &o.ThreadState.Prev},
		{d.ThreadStateNext, &o.ThreadState.Next},
		{d.ThreadStateInterp, &o.ThreadState.Interp},
		{d.ThreadStateCurrentFrame, &o.ThreadState.CurrentFrame},
		{d.ThreadStateThreadID, &o.ThreadState.ThreadID},
		{d.ThreadStateNativeThreadID, &o.ThreadState.NativeThreadID},
		{d.FrameSize, &o.InterpreterFrame.Size},
		{d.FramePrevious, &o.InterpreterFrame.Previous},
		{d.FrameExecutable, &o.InterpreterFrame.Executable},
		{d.FrameInstrPtr, &o.InterpreterFrame.InstrPtr},
		{d.FrameLocalsplus, &o.InterpreterFrame.Localsplus},
		{d.FrameOwner, &o.InterpreterFrame.Owner},
		{d.CodeSize, &o.Code.Size},
		{d.CodeFilename, &o.Code.Filename},
		{d.CodeName, &o.Code.Name},
		{d.CodeQualname, &o.Code.Qualname},
		{d.CodeLinetable, &o.Code.Linetable},
		{d.CodeFirstLineno, &o.Code.FirstLineno},
		{d.CodeCodeAdaptive, &o.Code.CodeAdaptive},
		{d.ObjectType, &o.Object.Type},
		{d.TypeName, &o.Type.Name},
		{d.TypeFlags, &o.Type.Flags},
		{d.BytesSize, &o.Bytes.Size},
		{d.BytesData, &o.Bytes.Data},
		{d.UnicodeState, &o.Unicode.State},
		{d.UnicodeLength, &o.Unicode.Length},
		{d.UnicodeASCIISize, &o.Unicode.ASCIISize},
	}
}

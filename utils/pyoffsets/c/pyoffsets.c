// The CPython struct layouts the Python unwinder reads, as compile-time
// constants. utils/pyoffsets compiles this file (never links or runs it) against
// one installed CPython's headers, for amd64 and arm64, and reads the
// constants back from the object file's symbols: the pyoffsets array and
// one pyoffsets_bits_* object per bit-field.
//
// Each entry names the Go field it fills (a path in python.Offsets), the
// C type and member it measures (so that tests can look the same member up
// in DWARF), and the value. A field a version lacks is an entry of kind
// 'n' with the value -1, so that the Go table always has every field.
//
// Where the structs live (Include/ of each CPython release):
//   PyThreadState   pystate.h (3.6, 3.7), cpython/pystate.h (3.8+)
//   PyFrameObject   frameobject.h (3.6-3.8), cpython/frameobject.h (3.9, 3.10)
//   _PyCFrame       cpython/pystate.h (CFrame in 3.10, _PyCFrame 3.11, 3.12)
//   _PyInterpreterFrame, enum _frameowner  internal/pycore_frame.h
//                   (3.11-3.13), internal/pycore_interpframe_structs.h (3.14+)
//   PyCodeObject    code.h (3.6-3.8), cpython/code.h (3.9+)
//   _PyRuntimeState internal/pystate.h (3.7), internal/pycore_pystate.h
//                   (3.8), internal/pycore_runtime.h (3.9-3.13),
//                   internal/pycore_runtime_structs.h (3.14+)
//   PyInterpreterState  pystate.h (3.6, 3.7), internal/pycore_pystate.h
//                   (3.8), internal/pycore_interp.h (3.9+)
//   Py_tss_t        pythread.h (3.7-3.10), cpython/pythread.h (3.11+)
//   PyObject, PyVarObject  object.h
//   PyTypeObject    object.h (3.6, 3.7), cpython/object.h (3.8+)
//   PyBytesObject   bytesobject.h (3.6-3.8), cpython/bytesobject.h (3.9+)
//   PyASCIIObject, PyCompactUnicodeObject, PyUnicodeObject
//                   unicodeobject.h (3.6, 3.7), cpython/unicodeobject.h (3.8+)
//   _Py_DebugOffsets internal/pycore_runtime.h (3.13),
//                   internal/pycore_debug_offsets.h (3.14+)
//
// 3.14's f_executable is a _PyStackRef (internal/pycore_structs.h): a union
// of one uintptr_t whose low bits are tags (Py_TAG_BITS, 3 with the GIL).

#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#if defined(Py_GIL_DISABLED) || defined(Py_DEBUG) || defined(Py_TRACE_REFS)
#  error                                                                                           \
    "these headers are of a free-threaded or debug build; the table describes the default build"
#endif

#if PY_VERSION_HEX >= 0x030E0000
#  include "internal/pycore_interpframe_structs.h"
#  include "internal/pycore_runtime_structs.h"
#  include "internal/pycore_debug_offsets.h"
#elif PY_VERSION_HEX >= 0x030D0000
#  include "internal/pycore_frame.h"
#  include "internal/pycore_runtime.h"
#elif PY_VERSION_HEX >= 0x030B0000
#  include "internal/pycore_frame.h"
#  include "internal/pycore_interp.h"
#  include "internal/pycore_runtime.h"
#elif PY_VERSION_HEX >= 0x03090000
#  include "frameobject.h"
#  include "internal/pycore_interp.h"
#  include "internal/pycore_runtime.h"
#elif PY_VERSION_HEX >= 0x03080000
#  include "frameobject.h"
#  include "internal/pycore_pystate.h"
#elif PY_VERSION_HEX >= 0x03070000
#  include "frameobject.h"
#  include "internal/pystate.h"
#else
#  include "frameobject.h"
#endif

struct pyoffset {
  char key[48];    // Go field path in python.Offsets
  char ctype[40];  // C typedef or struct tag measured
  char member[48]; // member path, or enumerator; "" for sizeof(ctype)
  char kind;       // see below
  int64_t value;
};

// Kinds: 'o' offsetof(ctype, member); 's' sizeof(ctype); 'm' sizeof of the
// member; 'e' value of the enumerator member of enum ctype; 'n' absent.
// clang-format off
#define OFF(key, type, member) {key, #type, #member, 'o', offsetof(type, member)}
#define SIZE(key, type) {key, #type, "", 's', sizeof(type)}
#define MSIZE(key, type, member) {key, #type, #member, 'm', sizeof(((type *)0)->member)}
#define ENUM(key, type, name) {key, #type, #name, 'e', name}
#define NONE(key) {key, "", "", 'n', -1}
// clang-format on

__attribute__((used)) const struct pyoffset pyoffsets[] = {
#if PY_VERSION_HEX >= 0x03070000
  SIZE("Runtime.Size", _PyRuntimeState),
  OFF("Runtime.InterpretersHead", _PyRuntimeState, interpreters.head),
  OFF("Runtime.InterpretersMain", _PyRuntimeState, interpreters.main),
#else
  NONE("Runtime.Size"),
  NONE("Runtime.InterpretersHead"),
  NONE("Runtime.InterpretersMain"),
#endif
#if PY_VERSION_HEX >= 0x030F0000
  // 3.15 binds a thread's state for the GILState API in a thread-local
  // variable (_Py_tss_gilstate, Python/pystate.c), no longer a pthread key.
  NONE("Runtime.TStateCurrent"),
  NONE("Runtime.AutoTSSKey"),
#elif PY_VERSION_HEX >= 0x030C0000
  NONE("Runtime.TStateCurrent"),
  OFF("Runtime.AutoTSSKey", _PyRuntimeState, autoTSSkey),
#elif PY_VERSION_HEX >= 0x03070000
  OFF("Runtime.TStateCurrent", _PyRuntimeState, gilstate.tstate_current),
  OFF("Runtime.AutoTSSKey", _PyRuntimeState, gilstate.autoTSSkey),
#else
  NONE("Runtime.TStateCurrent"),
  NONE("Runtime.AutoTSSKey"),
#endif
#if PY_VERSION_HEX >= 0x030D0000
  OFF("Runtime.DebugOffsets", _PyRuntimeState, debug_offsets),
#else
  NONE("Runtime.DebugOffsets"),
#endif

#if PY_VERSION_HEX >= 0x03070000
  SIZE("TSS.Size", Py_tss_t),
  OFF("TSS.IsInitialized", Py_tss_t, _is_initialized),
  OFF("TSS.Key", Py_tss_t, _key),
  MSIZE("TSS.KeySize", Py_tss_t, _key),
#else
  NONE("TSS.Size"),
  NONE("TSS.IsInitialized"),
  NONE("TSS.Key"),
  NONE("TSS.KeySize"),
#endif

  OFF("Interpreter.Next", PyInterpreterState, next),
#if PY_VERSION_HEX >= 0x030B0000
  OFF("Interpreter.ThreadsHead", PyInterpreterState, threads.head),
#else
  OFF("Interpreter.ThreadsHead", PyInterpreterState, tstate_head),
#endif

  SIZE("ThreadState.Size", PyThreadState),
  OFF("ThreadState.Prev", PyThreadState, prev),
  OFF("ThreadState.Next", PyThreadState, next),
  OFF("ThreadState.Interp", PyThreadState, interp),
  OFF("ThreadState.ThreadID", PyThreadState, thread_id),
#if PY_VERSION_HEX >= 0x030B0000
  OFF("ThreadState.NativeThreadID", PyThreadState, native_thread_id),
#else
  NONE("ThreadState.NativeThreadID"),
#endif
#if PY_VERSION_HEX >= 0x030D0000
  NONE("ThreadState.Frame"),
  NONE("ThreadState.CFrame"),
  OFF("ThreadState.CurrentFrame", PyThreadState, current_frame),
#elif PY_VERSION_HEX >= 0x030B0000
  NONE("ThreadState.Frame"),
  OFF("ThreadState.CFrame", PyThreadState, cframe),
  NONE("ThreadState.CurrentFrame"),
#elif PY_VERSION_HEX >= 0x030A0000
  // 3.10 has a CFrame, but the thread state still points at the frame
  // object: the CFrame only carries use_tracing.
  OFF("ThreadState.Frame", PyThreadState, frame),
  OFF("ThreadState.CFrame", PyThreadState, cframe),
  NONE("ThreadState.CurrentFrame"),
#else
  OFF("ThreadState.Frame", PyThreadState, frame),
  NONE("ThreadState.CFrame"),
  NONE("ThreadState.CurrentFrame"),
#endif

#if PY_VERSION_HEX >= 0x030D0000
  NONE("CFrame.CurrentFrame"),
  NONE("CFrame.Previous"),
#elif PY_VERSION_HEX >= 0x030B0000
  OFF("CFrame.CurrentFrame", _PyCFrame, current_frame),
  OFF("CFrame.Previous", _PyCFrame, previous),
#elif PY_VERSION_HEX >= 0x030A0000
  NONE("CFrame.CurrentFrame"),
  OFF("CFrame.Previous", CFrame, previous),
#else
  NONE("CFrame.CurrentFrame"),
  NONE("CFrame.Previous"),
#endif

#if PY_VERSION_HEX < 0x030B0000
  OFF("FrameObject.Back", PyFrameObject, f_back),
  OFF("FrameObject.Code", PyFrameObject, f_code),
  OFF("FrameObject.Lasti", PyFrameObject, f_lasti),
#else
  NONE("FrameObject.Back"),
  NONE("FrameObject.Code"),
  NONE("FrameObject.Lasti"),
#endif

#if PY_VERSION_HEX >= 0x030B0000
  SIZE("InterpreterFrame.Size", _PyInterpreterFrame),
  OFF("InterpreterFrame.Previous", _PyInterpreterFrame, previous),
  OFF("InterpreterFrame.Owner", _PyInterpreterFrame, owner),
  OFF("InterpreterFrame.Localsplus", _PyInterpreterFrame, localsplus),
  ENUM("InterpreterFrame.OwnedByThread", enum _frameowner, FRAME_OWNED_BY_THREAD),
  ENUM("InterpreterFrame.OwnedByGenerator", enum _frameowner, FRAME_OWNED_BY_GENERATOR),
  ENUM("InterpreterFrame.OwnedByFrameObject", enum _frameowner, FRAME_OWNED_BY_FRAME_OBJECT),
#else
  NONE("InterpreterFrame.Size"),
  NONE("InterpreterFrame.Previous"),
  NONE("InterpreterFrame.Owner"),
  NONE("InterpreterFrame.Localsplus"),
  NONE("InterpreterFrame.OwnedByThread"),
  NONE("InterpreterFrame.OwnedByGenerator"),
  NONE("InterpreterFrame.OwnedByFrameObject"),
#endif
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000
  // 3.15 dropped FRAME_OWNED_BY_CSTACK: entry frames are owned by the
  // interpreter, as from 3.14.
  ENUM("InterpreterFrame.OwnedByCStack", enum _frameowner, FRAME_OWNED_BY_CSTACK),
#else
  NONE("InterpreterFrame.OwnedByCStack"),
#endif
#if PY_VERSION_HEX >= 0x030E0000
  ENUM("InterpreterFrame.OwnedByInterpreter", enum _frameowner, FRAME_OWNED_BY_INTERPRETER),
#else
  NONE("InterpreterFrame.OwnedByInterpreter"),
#endif
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
  OFF("InterpreterFrame.IsEntry", _PyInterpreterFrame, is_entry),
#else
  NONE("InterpreterFrame.IsEntry"),
#endif
#if PY_VERSION_HEX >= 0x030D0000
  NONE("InterpreterFrame.Code"),
  OFF("InterpreterFrame.Executable", _PyInterpreterFrame, f_executable),
  NONE("InterpreterFrame.PrevInstr"),
  OFF("InterpreterFrame.InstrPtr", _PyInterpreterFrame, instr_ptr),
#elif PY_VERSION_HEX >= 0x030B0000
  OFF("InterpreterFrame.Code", _PyInterpreterFrame, f_code),
  NONE("InterpreterFrame.Executable"),
  OFF("InterpreterFrame.PrevInstr", _PyInterpreterFrame, prev_instr),
  NONE("InterpreterFrame.InstrPtr"),
#else
  NONE("InterpreterFrame.Code"),
  NONE("InterpreterFrame.Executable"),
  NONE("InterpreterFrame.PrevInstr"),
  NONE("InterpreterFrame.InstrPtr"),
#endif

  SIZE("Code.Size", PyCodeObject),
  SIZE("Code.CodeUnitSize", _Py_CODEUNIT),
  OFF("Code.Filename", PyCodeObject, co_filename),
  OFF("Code.Name", PyCodeObject, co_name),
  OFF("Code.FirstLineno", PyCodeObject, co_firstlineno),
#if PY_VERSION_HEX >= 0x030B0000
  OFF("Code.Qualname", PyCodeObject, co_qualname),
  NONE("Code.Code"),
  OFF("Code.CodeAdaptive", PyCodeObject, co_code_adaptive),
#else
  NONE("Code.Qualname"),
  OFF("Code.Code", PyCodeObject, co_code),
  NONE("Code.CodeAdaptive"),
#endif
#if PY_VERSION_HEX >= 0x030A0000
  NONE("Code.Lnotab"),
  OFF("Code.Linetable", PyCodeObject, co_linetable),
#else
  OFF("Code.Lnotab", PyCodeObject, co_lnotab),
  NONE("Code.Linetable"),
#endif

  OFF("Object.Type", PyObject, ob_type),
  OFF("Object.Size", PyVarObject, ob_size),
  OFF("Type.Name", PyTypeObject, tp_name),
  OFF("Type.Flags", PyTypeObject, tp_flags),

  OFF("Bytes.Size", PyBytesObject, ob_base.ob_size),
  OFF("Bytes.Data", PyBytesObject, ob_sval),

  OFF("Unicode.Length", PyASCIIObject, length),
  OFF("Unicode.State", PyASCIIObject, state),
  SIZE("Unicode.ASCIISize", PyASCIIObject),
  SIZE("Unicode.CompactSize", PyCompactUnicodeObject),
  OFF("Unicode.Data", PyUnicodeObject, data),

#if PY_VERSION_HEX >= 0x030D0000
#  define DEBUG(key, member) OFF("Debug." key, _Py_DebugOffsets, member)
  DEBUG("Cookie", cookie),
  DEBUG("Version", version),
  DEBUG("FreeThreaded", free_threaded),
  DEBUG("RuntimeSize", runtime_state.size),
  DEBUG("RuntimeInterpretersHead", runtime_state.interpreters_head),
  DEBUG("InterpreterNext", interpreter_state.next),
  DEBUG("InterpreterThreadsHead", interpreter_state.threads_head),
  DEBUG("ThreadStateSize", thread_state.size),
  DEBUG("ThreadStatePrev", thread_state.prev),
  DEBUG("ThreadStateNext", thread_state.next),
  DEBUG("ThreadStateInterp", thread_state.interp),
  DEBUG("ThreadStateCurrentFrame", thread_state.current_frame),
  DEBUG("ThreadStateThreadID", thread_state.thread_id),
  DEBUG("ThreadStateNativeThreadID", thread_state.native_thread_id),
  DEBUG("FrameSize", interpreter_frame.size),
  DEBUG("FramePrevious", interpreter_frame.previous),
  DEBUG("FrameExecutable", interpreter_frame.executable),
  DEBUG("FrameInstrPtr", interpreter_frame.instr_ptr),
  DEBUG("FrameLocalsplus", interpreter_frame.localsplus),
  DEBUG("FrameOwner", interpreter_frame.owner),
  DEBUG("CodeSize", code_object.size),
  DEBUG("CodeFilename", code_object.filename),
  DEBUG("CodeName", code_object.name),
  DEBUG("CodeQualname", code_object.qualname),
  DEBUG("CodeLinetable", code_object.linetable),
  DEBUG("CodeFirstLineno", code_object.firstlineno),
  DEBUG("CodeCodeAdaptive", code_object.co_code_adaptive),
  DEBUG("ObjectType", pyobject.ob_type),
  DEBUG("TypeName", type_object.tp_name),
  DEBUG("TypeFlags", type_object.tp_flags),
  DEBUG("BytesSize", bytes_object.ob_size),
  DEBUG("BytesData", bytes_object.ob_sval),
  DEBUG("UnicodeState", unicode_object.state),
  DEBUG("UnicodeLength", unicode_object.length),
  DEBUG("UnicodeASCIISize", unicode_object.asciiobject_size),
  SIZE("Debug.Size", _Py_DebugOffsets),
#  undef DEBUG
#else
  NONE("Debug"), // the whole struct is absent
#endif
};

// A bit-field's position cannot be a constant expression, so each one gets
// an object whose initializer sets only that bit-field to all ones; the
// reader finds the set bits in the bytes of obj at byte offset word.
#define BITS(name, gokey, type, field, bitfield, ones)                                             \
  __attribute__((used)) const struct {                                                             \
    char key[48];                                                                                  \
    char ctype[40];                                                                                \
    char member[48];                                                                               \
    int64_t word;                                                                                  \
    type obj;                                                                                      \
  } pyoffsets_bits_##name = {                                                                      \
    gokey, #type, #field "." #bitfield, offsetof(type, field), {.field = {.bitfield = ones}}};

BITS(kind, "Unicode.Kind", PyASCIIObject, state, kind, 7)
BITS(compact, "Unicode.Compact", PyASCIIObject, state, compact, 1)
BITS(ascii, "Unicode.ASCII", PyASCIIObject, state, ascii, 1)

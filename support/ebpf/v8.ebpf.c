// The V8 (Node.js) unwinder (runtime RUNTIME_V8). User space
// claims V8's JIT code and the embedded builtins in the node binary; the
// native unwinder hands over at a PC in them. Every frame V8 generates
// keeps a frame pointer (rbp, x29 on arm64; internals.md §3.1), so this
// program walks the frame pointer chain while the PC stays in V8's code and says what each frame
// is; user space names it. A return address outside V8's code (an entry
// frame's C++ caller) hands back to the native unwinder.
//
// A frame is typed (entry, exit, stub, internal, …) when the word at fp-8
// is a marker, StackFrame::Type << 1; otherwise it is a JavaScript frame
// with its context there and its JSFunction at fp-16. A JavaScript frame
// whose PC is in the interpreter's entry builtins or bytecode handlers is
// interpreted: its BytecodeArray is at fp-32, its bytecode offset a Smi at
// fp-40 (for the top frame, in a handler, two registers hold them live:
// V8_BYTECODE_ARRAY_REGISTER and V8_BYTECODE_OFFSET_REGISTER below).
//
// Its frames: the top two bits of addr say what the frame is (enum
// v8_frame_type); bit 61 is set for the interrupted PC. Bytecode: file_id
// is the SharedFunctionInfo, addr the bytecode offset (bits 0-31) and bits
// 3-26 of the BytecodeArray's address (bits 32-55), which user space
// checks against the function's. Code: file_id is the SharedFunctionInfo,
// addr the PC (bits 0-47): baseline or optimized code, a builtin with
// JavaScript linkage, or, for the top frame, a builtin without a frame of
// its own called by the function. Stub: file_id is the frame type (0 for
// none), addr the PC.
#include "tracemgmt.h"

enum v8_frame_type {
  V8_FRAME_BYTECODE = 0,
  V8_FRAME_CODE = 1,
  V8_FRAME_STUB = 2,
};
#define V8_FRAME_TYPE_SHIFT 62
#define V8_FRAME_TOP        (1ULL << 61)
#define V8_PC_MASK          ((1ULL << 48) - 1)

// JIT code ranges a process's configuration lists (an isolate's code range
// each, workers have their own); code beyond them is found through the
// mapping trie, at the cost of a round trip through the native unwinder.
#define V8_CODE_RANGES 4

// The builtins' places: the binary's and copies beside isolates' code.
#define V8_BLOBS 4

// What the V8 unwinder needs of a process (its entry in runtime_procs).
struct v8_proc {
  // JIT code: [code_lo[i], code_hi[i]).
  u64 code_lo[V8_CODE_RANGES];
  u64 code_hi[V8_CODE_RANGES];
  // The embedded builtins, blob_size bytes at blob_lo[0] in the binary
  // and at blob_lo[1..] (0 if none) where V8 copied them beside an
  // isolate's JIT code for short calls.
  u64 blob_lo[V8_BLOBS];
  u32 blob_size;
  // Offsets in the blob: the interpreter's entry builtins
  // [entry_lo, entry_hi) and its bytecode handlers [handlers_lo,
  // handlers_hi).
  u32 entry_lo;
  u32 entry_hi;
  u32 handlers_lo;
  u32 handlers_hi;
  // Byte offsets of JSFunction::shared and Map::instance_type, the
  // SharedFunctionInfo instance type, and BytecodeArray's header (where
  // the bytecodes start: a frame's bytecode offset counts from the
  // tagged array pointer, so it is this minus one above the offset).
  u16 jsfunction_shared;
  u16 map_instance_type;
  u16 type_sfi;
  u16 bytecode_data;
  // Frame types (StackFrame::Type) are below this.
  u8 frame_types;
  // The types of entry frames (EntryFrame, ConstructEntryFrame).
  u8 entry_frame;
  u8 construct_entry_frame;
  u8 pad;
};
_Static_assert(sizeof(struct v8_proc) <= RUNTIME_PROC_SIZE, "v8_proc too large");

// The runtime's counters (runtime_metrics).
enum v8_metric {
  METRIC_V8_BYTECODE_FRAMES,
  METRIC_V8_CODE_FRAMES,
  METRIC_V8_STUB_FRAMES,
  // Code of a process user space has not (yet) described.
  METRIC_ERR_V8_NO_PROC,
  // A read of the process's memory failed: the walk ends.
  METRIC_ERR_V8_READ,
  // A frame that is neither typed nor a JavaScript function's, or whose
  // frame pointer is not above its stack pointer: the walk ends.
  METRIC_ERR_V8_BAD_FRAME,
  METRIC_V8_COUNT,
};
_Static_assert(METRIC_V8_COUNT <= RUNTIME_METRICS_MAX, "too many v8 metrics");

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct v8_btf_exports {
  struct v8_proc v8_proc;
  enum v8_metric v8_metric;
  enum v8_frame_type v8_frame_type;
} v8_btf_exports __attribute__((used));

// The registers the interpreter keeps the bytecode array and offset in
// (kInterpreterBytecodeArrayRegister, kInterpreterBytecodeOffsetRegister;
// src/codegen/<cpu>/register-<cpu>.h).
#if defined(__TARGET_ARCH_x86)
#  define V8_BYTECODE_ARRAY_REGISTER(r)  ((r)->r12)
#  define V8_BYTECODE_OFFSET_REGISTER(r) ((r)->r9)
#elif defined(__TARGET_ARCH_arm64)
#  define V8_BYTECODE_ARRAY_REGISTER(r)  ((r)->regs[20])
#  define V8_BYTECODE_OFFSET_REGISTER(r) ((r)->regs[19])
#endif

// The words of callee-saved registers an entry frame's builtin pushes
// above its fp/lr pair: the caller's sp is that much above fp + 16. arm64
// pushes x19-x28 and d8-d15 first
// (kCalleeSavedRegisterBytesPushedBeforeFpLrPair); x86_64 pushes them
// below rbp.
#if defined(__TARGET_ARCH_x86)
#  define V8_ENTRY_SAVED_WORDS 0
#elif defined(__TARGET_ARCH_arm64)
#  define V8_ENTRY_SAVED_WORDS 18
#endif

// Bytecode offsets are below this: a register that holds a larger one
// does not hold the offset.
#define V8_MAX_BYTECODES (1 << 24)

// Frames one run of this program walks before it tail-calls itself.
#define V8_FRAMES_PER_PROGRAM 8

// The frame words read at once, from fp-40 to fp+8 (internals.md §3).
#define V8_SLOT_BYTECODE_OFFSET 0 // fp-40
#define V8_SLOT_BYTECODE_ARRAY  1 // fp-32
#define V8_SLOT_FUNCTION        3 // fp-16
#define V8_SLOT_CONTEXT         4 // fp-8: context or marker
#define V8_SLOT_CALLER_FP       5 // fp
#define V8_SLOT_RETURN          6 // fp+8
#define V8_SLOTS                7

static __always_inline int v8_read(void *dst, u32 size, u64 addr)
{
  return bpf_probe_read_user(dst, size, (void *)addr);
}

// The offset of pc in the embedded builtins (either copy), or -1.
static __always_inline s64 v8_blob_offset(const struct v8_proc *p, u64 pc)
{
  for (int i = 0; i < V8_BLOBS; i++)
    if (p->blob_lo[i] && pc >= p->blob_lo[i] && pc < p->blob_lo[i] + p->blob_size)
      return pc - p->blob_lo[i];
  return -1;
}

// Whether pc is in V8's code as the configuration lists it.
static __always_inline int v8_in_code(const struct v8_proc *p, u64 pc)
{
  for (int i = 0; i < V8_CODE_RANGES; i++)
    if (pc >= p->code_lo[i] && pc < p->code_hi[i])
      return 1;
  return v8_blob_offset(p, pc) >= 0;
}

// Whether pc is in V8's JIT code (not its builtins).
static __always_inline int v8_in_jit(const struct v8_proc *p, u64 pc)
{
  for (int i = 0; i < V8_CODE_RANGES; i++)
    if (pc >= p->code_lo[i] && pc < p->code_hi[i] && v8_blob_offset(p, pc) < 0)
      return 1;
  return 0;
}

// The SharedFunctionInfo of the JSFunction fn, or 0 when fn is not a
// function (its shared is not a SharedFunctionInfo).
static __always_inline u64 v8_function_sfi(const struct v8_proc *p, u64 fn)
{
  u64 sfi, map;
  u16 type;
  if ((fn & 3) != 1 || v8_read(&sfi, sizeof(sfi), fn - 1 + p->jsfunction_shared) ||
      (sfi & 3) != 1 || v8_read(&map, sizeof(map), sfi - 1) || (map & 3) != 1 ||
      v8_read(&type, sizeof(type), map - 1 + p->map_instance_type))
    return 0;
  return type == p->type_sfi ? sfi : 0;
}

SEC("perf_event")
int unwind_v8(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;
  const struct v8_proc *p = runtime_config(t->pid, RUNTIME_V8);
  if (!p) {
    runtime_missing(state, t->pid, RUNTIME_V8, METRIC_ERR_V8_NO_PROC);
    return runtime_return(ctx, r);
  }
  // Set while the interrupted PC is in a bytecode handler that built a
  // frame of its own: the interpreted frame below it takes its bytecode
  // from the registers as the top frame would.
  int in_handler = 0;
  for (int i = 0; i < V8_FRAMES_PER_PROGRAM; i++) {
    u64 pc = state->pc, sp = state->sp, fp = state->fp;
    int top = !state->return_address;
    // The native unwinder handed this PC over: the trie says it is V8's
    // even where the configuration does not list it yet.
    if (i > 0 && !v8_in_code(p, pc))
      return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
    u64 s[V8_SLOTS];
    if (fp <= sp) {
      increment_runtime_metric(RUNTIME_V8, METRIC_ERR_V8_BAD_FRAME);
      goto give_up;
    }
    if (v8_read(s, sizeof(s), fp - 40))
      goto read_error;
    u64 marker = s[V8_SLOT_CONTEXT], sfi, caller_sp = fp + 16;
    s64 off = v8_blob_offset(p, pc);
    int handler = off >= p->handlers_lo && off < p->handlers_hi;
    if ((marker & 1) == 0 && marker < ((u64)p->frame_types << 1)) {
      if (top && handler) {
        // Part of interpreting the function below, not reported.
        in_handler = 1;
        goto next;
      }
      if (marker >> 1 == p->entry_frame || marker >> 1 == p->construct_entry_frame)
        caller_sp += V8_ENTRY_SAVED_WORDS * 8;
      increment_runtime_metric(RUNTIME_V8, METRIC_V8_STUB_FRAMES);
      if (push_runtime_frame(t, RUNTIME_V8, marker >> 1,
                             ((u64)V8_FRAME_STUB << V8_FRAME_TYPE_SHIFT) |
                               (top ? V8_FRAME_TOP : 0) | (pc & V8_PC_MASK)))
        goto full;
    } else if ((sfi = v8_function_sfi(p, s[V8_SLOT_FUNCTION]))) {
      u64 array = s[V8_SLOT_BYTECODE_ARRAY];
      u64 tagged_offset = s[V8_SLOT_BYTECODE_OFFSET];
      if (handler || (off >= p->entry_lo && off < p->entry_hi)) {
        s64 bytecode;
        s64 reg = (s64)V8_BYTECODE_OFFSET_REGISTER(&state->user_regs);
        s64 live = reg - (p->bytecode_data - 1);
        if (((top && handler) || in_handler) &&
            V8_BYTECODE_ARRAY_REGISTER(&state->user_regs) == array && live >= 0 &&
            live < V8_MAX_BYTECODES)
          // Handlers keep the offset in a register, untagged, and store
          // it in the frame only before they call out.
          bytecode = reg;
        else if ((tagged_offset & 0xffffffff) == 0) // a Smi
          bytecode = (s64)tagged_offset >> 32;
        else {
          increment_runtime_metric(RUNTIME_V8, METRIC_ERR_V8_BAD_FRAME);
          goto give_up;
        }
        bytecode -= p->bytecode_data - 1;
        increment_runtime_metric(RUNTIME_V8, METRIC_V8_BYTECODE_FRAMES);
        if (push_runtime_frame(t, RUNTIME_V8, sfi,
                               ((u64)V8_FRAME_BYTECODE << V8_FRAME_TYPE_SHIFT) |
                                 (top ? V8_FRAME_TOP : 0) | (((array >> 3) & 0xffffff) << 32) |
                                 (u32)bytecode))
          goto full;
      } else {
        u64 ret, caller_sp;
        if (top && off >= 0 && !frameless_return(state, &ret, &caller_sp) && v8_in_jit(p, ret)) {
          // A builtin without a frame of its own, called from the
          // function's JIT code: both are reported (user space checks
          // the return address is the function's).
          increment_runtime_metric(RUNTIME_V8, METRIC_V8_STUB_FRAMES);
          if (push_runtime_frame(t, RUNTIME_V8, 0,
                                 ((u64)V8_FRAME_STUB << V8_FRAME_TYPE_SHIFT) | V8_FRAME_TOP |
                                   (pc & V8_PC_MASK)))
            goto full;
          top = 0;
          pc = ret;
        }
        increment_runtime_metric(RUNTIME_V8, METRIC_V8_CODE_FRAMES);
        if (push_runtime_frame(t, RUNTIME_V8, sfi,
                               ((u64)V8_FRAME_CODE << V8_FRAME_TYPE_SHIFT) |
                                 (top ? V8_FRAME_TOP : 0) | (pc & V8_PC_MASK)))
          goto full;
      }
    } else {
      // Not a frame of V8's: the rest is walked as native code.
      increment_runtime_metric(RUNTIME_V8, METRIC_ERR_V8_BAD_FRAME);
      goto give_up;
    }
  next:
    if (!top)
      in_handler = 0;
    state->pc = s[V8_SLOT_RETURN] & USER_ADDRESS_MASK;
    state->sp = caller_sp;
    state->fp = s[V8_SLOT_CALLER_FP];
    state->return_address = 1;
    if (state->pc < MIN_CODE_ADDRESS)
      return tail_call_stop(ctx);
  }
  return tail_call_next(ctx, r, RUNTIME_V8);

read_error:
  increment_runtime_metric(RUNTIME_V8, METRIC_ERR_V8_READ);
give_up:
  // The native unwinder walks on with frame pointers from the frame
  // reached.
  runtime_give_up(state, RUNTIME_V8);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
full:
  increment_metric(METRIC_TRUNCATED_TRACES);
  return tail_call_stop(ctx);
}

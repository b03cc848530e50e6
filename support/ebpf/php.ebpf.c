// The PHP unwinder (runtime RUNTIME_PHP), x86_64 and arm64. The native unwinder
// hands over at each frame of execute_ex, the Zend VM's loop, after
// stepping past it. In the hybrid VM a call from PHP code to PHP code,
// include and eval do not recurse in C: one call of execute_ex runs the
// frames (zend_execute_data, linked by prev_execute_data) from the
// thread's current one down to the first PHP frame flagged ZEND_CALL_TOP,
// the one it was entered for; a C function's frame (ZEND_INTERNAL_FUNCTION)
// sits among them, its native frames above the loop's. This program
// reports those frames, innermost first, and hands back
// (interpreter/php/internals.md §4, §5).
//
// PHP is not threaded in Debian's builds (NTS): the current frame is
// executor_globals.current_execute_data, one global per process.
//
// The running frame's opline (its current instruction) is in a register
// while the VM runs it (a global register variable, r15 on x86_64, x28 on
// arm64; another, r14 or x27, holds its execute_data; PHP_OPLINE_REGISTER
// and PHP_EXECUTE_DATA_REGISTER below):
// EX(opline) is written only before calls out, so it is stale for the
// innermost frame and current for every other (internals.md §6).
//
// OPcache's JIT code runs inside execute_ex's native frame: at a PC there
// this program moves the PC to execute_ex's body and lets the native
// unwinder step past that frame, which hands the frames of that call over
// again (internals.md §7). On x86_64 JIT code leaves the stack pointer
// alone (it uses the red zone); on arm64 it moves it, and the body's is
// taken from its frame record, which JIT code never moves (§A.5).
//
// Its frames: file_id is the frame's zend_function (for file-level code its
// file name), addr its opline (0 for a C function's frame, whose opline is
// never written, and where unknown) with PHP_FRAME_* flags.
#include "tracemgmt.h"

// zend_function.type of a C function (ZEND_INTERNAL_FUNCTION).
#define PHP_INTERNAL_FUNCTION 1
// zend_execute_data.This.u1.type_info: the frame a call of execute_ex (or
// of a C function by zend_call_function) was entered for (ZEND_CALL_TOP).
#define PHP_CALL_TOP (1 << 17)
// sizeof(zend_op), alike in 8.0-8.4.
#define PHP_OP_SIZE 32
// zend_function.type of eval'd code (ZEND_EVAL_CODE).
#define PHP_EVAL_CODE 4
// Flags in the low bits of a frame's addr, which oplines (8-byte aligned)
// leave free (php.FrameTop, FrameCode, FrameEval): the frame is flagged
// ZEND_CALL_TOP; it is file-level code, whose file_id is its file name (a
// zend_string); that code is eval'd.
#define PHP_FRAME_TOP  1
#define PHP_FRAME_CODE 2
#define PHP_FRAME_EVAL 4
// And in its top bit, above user-space addresses (php.FrameJIT): the frame
// ran JIT code when sampled.
#define PHP_FRAME_JIT (1ULL << 63)

// What the PHP unwinder needs of a PHP process (its entry in
// runtime_procs); user space fills it from package php's tables.
struct php_proc {
  // The address of executor_globals.current_execute_data.
  u64 current_execute_data;
  // A process address in execute_ex's body past its prologue, where JIT
  // code is unwound from (0: the binary has no JIT support found).
  u64 jit_return;
  // zend_op_array's opcodes, last (the number of oplines) and filename.
  u16 op_array_opcodes;
  u16 op_array_last;
  u16 op_array_filename;
  // arm64: the body's frame record (x29) less its stack pointer (0 on
  // x86_64, where JIT code runs at the body's).
  u16 body_frame_record;
};
_Static_assert(sizeof(struct php_proc) <= RUNTIME_PROC_SIZE, "php_proc too large");

// The first fields of zend_execute_data, alike in 8.0-8.4 (user space
// checks its layouts against it).
struct php_execute_data {
  u64 opline;
  u64 call;
  u64 return_value;
  u64 func;
  // This: a zval, whose u1.type_info carries the call-info flags.
  u64 this_value;
  u32 this_type_info;
  u32 this_num_args;
  u64 prev_execute_data;
};

// The head of zend_function, alike in 8.0-8.4: its type (the common
// part's), and its name (NULL for file-level code).
struct php_function_head {
  u8 type;
  u8 arg_flags[3];
  u32 fn_flags;
  u64 function_name;
};

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum php_metric {
  // PHP frames reported.
  METRIC_PHP_FRAMES,
  // Frames of JIT code stepped past (their PHP frames reported).
  METRIC_PHP_JIT_FRAMES,
  // Innermost frames whose opline was taken from the VM's register.
  METRIC_PHP_REGISTER_OPLINES,
  // A frame of execute_ex in a process user space has not (yet)
  // described: the native frame is reported, and user space is told.
  METRIC_ERR_PHP_NO_PROC,
  // executor_globals could not be read.
  METRIC_ERR_PHP_GLOBALS,
  // Reading a frame failed.
  METRIC_ERR_PHP_FRAME_READ,
  // A call of execute_ex had no frame left to report: the native frame is
  // reported.
  METRIC_ERR_PHP_NO_FRAME,
  // JIT code in a binary without a known execute_ex body: the unwind stops.
  METRIC_ERR_PHP_JIT_RETURN,
  METRIC_PHP_COUNT,
};
_Static_assert(METRIC_PHP_COUNT <= RUNTIME_METRICS_MAX, "too many php metrics");

// Where the PHP unwinder is in a sample.
struct php_walk {
  // The sample (its ktime) this walk belongs to: a walk of an earlier
  // sample is started afresh.
  u64 sample;
  // The next frame to report (0: none left).
  u64 execute_data;
  // The CFA of the execute_ex frame being reported, and the frames
  // reported for it.
  u64 call_cfa;
  u32 call_frames;
  // The current frame was read from executor_globals.
  u8 started;
  // JIT code was met: the opline's register is one of its scratch
  // registers there.
  u8 jit;
  // The JIT code's frame, the first PHP (not C) frame since, is yet to be
  // reported.
  u8 jit_frame;
  // The innermost frame is yet to be reported.
  u8 innermost;
};

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct php_btf_exports {
  struct php_proc php_proc;
  struct php_execute_data php_execute_data;
  struct php_function_head php_function_head;
  enum php_metric php_metric;
} php_btf_exports __attribute__((used));

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct php_walk);
} php_walks SEC(".maps");

// Frames one run of this program walks before it tail-calls itself.
#define PHP_FRAMES_PER_PROGRAM 24

// The walk of the sample being unwound, started afresh for a new sample.
static __always_inline struct php_walk *php_walk_of(const struct trace *t)
{
  u32 zero = 0;
  struct php_walk *w = bpf_map_lookup_elem(&php_walks, &zero);
  if (w && w->sample != t->ktime) {
    w->sample = t->ktime;
    w->execute_data = 0;
    w->call_cfa = 0;
    w->call_frames = 0;
    w->started = 0;
    w->jit = 0;
    w->jit_frame = 0;
    w->innermost = 1;
  }
  return w;
}

// The hybrid VM's global register variables (ZEND_VM_FP_GLOBAL_REG and
// ZEND_VM_IP_GLOBAL_REG, Zend/zend_execute.c).
#if defined(__TARGET_ARCH_x86)
#  define PHP_EXECUTE_DATA_REGISTER(r) ((r)->r14)
#  define PHP_OPLINE_REGISTER(r)       ((r)->r15)
#elif defined(__TARGET_ARCH_arm64)
#  define PHP_EXECUTE_DATA_REGISTER(r) ((r)->regs[27])
#  define PHP_OPLINE_REGISTER(r)       ((r)->regs[28])
#endif

// The innermost frame's opline: the opline register when the VM's
// registers hold this frame (the execute_data register is it) and the
// opline register points into its instructions; else
// EX(opline) if it does; else none (0). JIT code keeps no opline anywhere:
// EX(opline) is the last one stored before a call out, a line the frame has
// moved on from.
static __always_inline u64 php_innermost_opline(const struct unwind_state *state,
                                                const struct php_walk *w,
                                                const struct php_proc *proc, u64 ed,
                                                const struct php_execute_data *ex)
{
  u64 opcodes;
  u32 last;
  if (w->jit ||
      bpf_probe_read_user(&opcodes, sizeof(opcodes), (void *)(ex->func + proc->op_array_opcodes)) ||
      bpf_probe_read_user(&last, sizeof(last), (void *)(ex->func + proc->op_array_last)))
    return 0;
  u64 end = opcodes + (u64)last * PHP_OP_SIZE;
  u64 opline = PHP_OPLINE_REGISTER(&state->user_regs);
  if (PHP_EXECUTE_DATA_REGISTER(&state->user_regs) == ed && opline >= opcodes && opline < end) {
    increment_runtime_metric(RUNTIME_PHP, METRIC_PHP_REGISTER_OPLINES);
    return opline;
  }
  return ex->opline >= opcodes && ex->opline < end ? ex->opline : 0;
}

// Reports the frames of one execute_ex call: from the next one down to
// the first PHP (not C) frame flagged ZEND_CALL_TOP.
static __always_inline int php_walk_call(struct php_walk *w, const struct php_proc *proc,
                                         struct unwind_state *state, struct trace *t)
{
  const struct runtime_handoff *h = &state->handoff;
  for (int i = 0; i < PHP_FRAMES_PER_PROGRAM; i++) {
    u64 ed = w->execute_data;
    struct php_execute_data ex;
    u8 type = 0;
    if (!ed) {
      if (w->call_frames)
        return RUNTIME_WALK_DONE;
      increment_runtime_metric(RUNTIME_PHP, METRIC_ERR_PHP_NO_FRAME);
      return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
    }
    if (bpf_probe_read_user(&ex, sizeof(ex), (void *)ed))
      goto fail;
    w->execute_data = ex.prev_execute_data;
    // A delegating generator's placeholder frame has no function.
    if (!ex.func)
      continue;
    struct php_function_head fn;
    if (bpf_probe_read_user(&fn, sizeof(fn), (void *)ex.func))
      goto fail;
    type = fn.type;
    u64 id = ex.func, opline = 0;
    if (type != PHP_INTERNAL_FUNCTION)
      opline = w->innermost ? php_innermost_opline(state, w, proc, ed, &ex) : ex.opline;
    int top = (ex.this_type_info & PHP_CALL_TOP) != 0;
    u64 flags = top ? PHP_FRAME_TOP : 0;
    if (type != PHP_INTERNAL_FUNCTION && !fn.function_name) {
      // File-level code: its zend_op_array is the request's copy (OPcache
      // keeps the instructions and file name in shared memory), freed when
      // the script ends, often before user space reads it: the frame
      // carries the file name instead.
      if (bpf_probe_read_user(&id, sizeof(id), (void *)(ex.func + proc->op_array_filename)))
        goto fail;
      flags |= type == PHP_EVAL_CODE ? PHP_FRAME_CODE | PHP_FRAME_EVAL : PHP_FRAME_CODE;
    }
    if (w->jit_frame && type != PHP_INTERNAL_FUNCTION) {
      w->jit_frame = 0;
      flags |= PHP_FRAME_JIT;
    }
    w->innermost = 0;
    w->call_frames++;
    increment_runtime_metric(RUNTIME_PHP, METRIC_PHP_FRAMES);
    if (push_runtime_frame(t, RUNTIME_PHP, id, opline | flags))
      return RUNTIME_WALK_FULL;
    // A C function called through zend_call_function is flagged too, but
    // runs without a call of execute_ex of its own.
    if (top && type != PHP_INTERNAL_FUNCTION)
      return RUNTIME_WALK_DONE;
  }
  return RUNTIME_WALK_MORE;
fail:
  // What is left of the frame chain cannot be trusted: the loop's frames
  // from here on are reported as native.
  increment_runtime_metric(RUNTIME_PHP, METRIC_ERR_PHP_FRAME_READ);
  runtime_give_up(state, RUNTIME_PHP);
  if (w->call_frames)
    return RUNTIME_WALK_DONE;
  return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

static __always_inline int php_unwind_call(struct unwind_state *state, struct trace *t,
                                           const struct php_proc *proc, struct php_walk *w)
{
  const struct runtime_handoff *h = &state->handoff;
  if (!w->started) {
    if (bpf_probe_read_user(&w->execute_data, sizeof(w->execute_data),
                            (void *)proc->current_execute_data)) {
      increment_runtime_metric(RUNTIME_PHP, METRIC_ERR_PHP_GLOBALS);
      runtime_give_up(state, RUNTIME_PHP);
      return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
    }
    w->started = 1;
  }
  if (w->call_cfa != h->cfa) {
    // The first run for this frame (not a continuation).
    w->call_cfa = h->cfa;
    w->call_frames = 0;
  }
  return php_walk_call(w, proc, state, t);
}

SEC("perf_event")
int unwind_php(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  const struct runtime_handoff *h = &state->handoff;
  const struct php_proc *proc = runtime_config(r->trace.pid, RUNTIME_PHP);
  if (!proc) {
    runtime_missing(state, r->trace.pid, RUNTIME_PHP, METRIC_ERR_PHP_NO_PROC);
    if (runtime_report_native(h, &r->trace))
      return runtime_walk_on(ctx, r, RUNTIME_PHP, RUNTIME_WALK_FULL);
    if (!h->file_id)
      return tail_call_stop(ctx);
    return runtime_return(ctx, r);
  }
  struct php_walk *w = php_walk_of(&r->trace);
  if (!w)
    return tail_call_stop(ctx);
  if (!h->file_id) {
    // JIT code, handed over at its PC: the native unwinder steps past the
    // execute_ex frame it runs in, which hands its frames over.
    if (!proc->jit_return) {
      increment_runtime_metric(RUNTIME_PHP, METRIC_ERR_PHP_JIT_RETURN);
      runtime_report_native(h, &r->trace);
      return tail_call_stop(ctx);
    }
    increment_runtime_metric(RUNTIME_PHP, METRIC_PHP_JIT_FRAMES);
    w->jit = 1;
    w->jit_frame = 1;
    if (proc->body_frame_record) {
      // arm64: the body's sp is below its frame record (x29), which JIT
      // code never moves, except in the stubs that push a record of their
      // own (stp x29, x30, [sp, #-N]!; mov x29, sp): there x29 is closer
      // to sp than the body's could be, and the body's is the one saved.
      u64 fp = state->fp;
      if (fp - state->sp < proc->body_frame_record &&
          bpf_probe_read_user(&fp, sizeof(fp), (void *)fp)) {
        increment_runtime_metric(RUNTIME_PHP, METRIC_ERR_PHP_FRAME_READ);
        runtime_report_native(h, &r->trace);
        return tail_call_stop(ctx);
      }
      state->fp = fp;
      state->sp = fp - proc->body_frame_record;
    }
    state->pc = proc->jit_return;
    state->return_address = 0;
    return runtime_return(ctx, r);
  }
  int walk = php_unwind_call(state, &r->trace, proc, w);
  if (walk != RUNTIME_WALK_DONE)
    return runtime_walk_on(ctx, r, RUNTIME_PHP, walk);
  return runtime_return(ctx, r);
}

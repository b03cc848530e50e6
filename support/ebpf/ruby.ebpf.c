// The CRuby unwinder (runtime RUNTIME_RUBY), x86_64 and arm64. The native unwinder
// hands over at each frame of vm_exec, which pushes nothing itself but
// runs Ruby frames from the one its caller pushed for it, and of
// vm_exec_core, the loop it calls to run their instructions, after
// stepping past it; this program reports the control frames that call
// runs, innermost first, and hands back: at vm_exec_core's frame, or at
// vm_exec's when the sample came before vm_exec_core was entered. Such a
// call runs frames from the thread's current one down to the one it was
// entered for, which carries VM_FRAME_FLAG_FINISH; a C method's control
// frame sits among them (its native frames are above the loop's frame
// that called it). So C functions land between the right Ruby frames
// (interpreter/ruby/internals.md).
//
// The thread's rb_execution_context_t is ruby_current_ec, a thread-local
// variable of libruby (tls_variable_address; internals.md §1.4, §12.4).
//
// Its frames: file_id is the method entry (rb_method_entry_t) of a
// method's frame, which names the method's class, and the instruction
// sequence (rb_iseq_t) of any other Ruby frame (a block, a class body,
// <main>); addr is the frame's pc (0 before its first instruction). For a
// C function, file_id is its method entry and addr RUBY_CFUNC_FRAME.
#include "tracemgmt.h"

// A pc is a pointer into an instruction sequence, never 1.
#define RUBY_CFUNC_FRAME 1

// Control frame flags (vm_core.h): the frame a call of vm_exec was
// entered for, and a C frame.
#define RUBY_FRAME_FLAG_FINISH  0x20
#define RUBY_FRAME_FLAG_CFRAME  0x80
#define RUBY_FRAME_MAGIC_MASK   0x7fff0001
#define RUBY_FRAME_MAGIC_METHOD 0x11110001
#define RUBY_FRAME_MAGIC_DUMMY  0x79990001

// What the Ruby unwinder needs of a CRuby process (its entry in
// runtime_procs); user space fills it from package ruby's tables.
struct ruby_proc {
  // The GOT pair (tls_index) libruby reaches ruby_current_ec through:
  // the module id the dynamic loader wrote at tls_index, and the
  // variable's offset in the module's TLS block; on arm64 the TLS
  // descriptor (entry, argument) and that offset; or, for a ruby
  // executable with the interpreter linked in, 0 and the variable's
  // offset from the thread pointer.
  u64 tls_index;
  u64 tls_offset;
  // vm_exec_core, [start, end) in libruby's file addresses: the other
  // code handed over is its caller, vm_exec.
  u64 eval_loop_start;
  u64 eval_loop_end;
  // libruby's executable segment, [start, end) in process addresses: JIT
  // code returns into it.
  u64 text_start;
  u64 text_end;
  // Byte offsets: rb_execution_context_t's vm_stack, vm_stack_size (in
  // words) and cfp; rb_control_frame_t's size.
  u16 ec_vm_stack;
  u16 ec_vm_stack_size;
  u16 ec_cfp;
  u16 cfp_size;
};

// The first fields of rb_control_frame_t, alike in every supported
// version (user space checks its layouts against it).
struct ruby_cfp {
  u64 pc;
  u64 sp;
  u64 iseq;
  u64 self;
  u64 ep;
};

// The slots of a frame's environment up to ep: its method entry (or
// cref), VM_ENV_DATA_INDEX_ME_CREF, the previous environment or block
// handler, and the frame's flags at ep[0].
struct ruby_env {
  u64 me_cref;
  u64 specval;
  u64 flags;
};
_Static_assert(sizeof(struct ruby_proc) <= RUNTIME_PROC_SIZE, "ruby_proc too large");

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum ruby_metric {
  // Ruby frames reported.
  METRIC_RUBY_FRAMES,
  // Frames of YJIT code stepped past (their Ruby frames reported).
  METRIC_RUBY_JIT_FRAMES,
  // A frame of vm_exec_core in a process user space has not (yet)
  // described: the native frame is reported, and user space is told.
  METRIC_ERR_RUBY_NO_PROC,
  // The thread's execution context could not be read.
  METRIC_ERR_RUBY_EXECUTION_CONTEXT,
  // Reading a control frame failed.
  METRIC_ERR_RUBY_FRAME_READ,
  // A call of vm_exec_core had no control frame left to report: the
  // native frame is reported.
  METRIC_ERR_RUBY_NO_FRAME,
  // No return address was found above YJIT code: the unwind stops there.
  METRIC_ERR_RUBY_JIT_RETURN,
  METRIC_RUBY_COUNT,
};
_Static_assert(METRIC_RUBY_COUNT <= RUNTIME_METRICS_MAX, "too many ruby metrics");

// Where the Ruby unwinder is in a sample.
struct ruby_walk {
  // The sample (its ktime) this walk belongs to: a walk of an earlier
  // sample is started afresh.
  u64 sample;
  // The next control frame to report, and the end of the VM stack (the
  // frames grow down from it).
  u64 cfp;
  u64 end;
  // The CFA of the vm_exec_core frame being reported, and the frames
  // reported for it.
  u64 call_cfa;
  u32 call_frames;
  // The thread's execution context was found.
  u8 started;
  // A frame handed over before (vm_exec_core's, or JIT code's) reported
  // the frames of the vm_exec call below: the frames of vm_exec_core and
  // vm_exec down to it report none.
  u8 call_reported;
  u8 pad[2];
};

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct ruby_btf_exports {
  struct ruby_proc ruby_proc;
  struct ruby_cfp ruby_cfp;
  enum ruby_metric ruby_metric;
} ruby_btf_exports __attribute__((used));

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct ruby_walk);
} ruby_walks SEC(".maps");

// Control frames one run of this program walks before it tail-calls
// itself.
#define RUBY_FRAMES_PER_PROGRAM 24

// Finds the interrupted thread's execution context and its current
// control frame. Returns 0 when found.
static __always_inline int ruby_start(struct ruby_walk *w, const struct ruby_proc *proc)
{
  u64 tp = thread_pointer(), ec_at, ec, stack, size, cfp;
  if (!tp)
    goto fail;
  ec_at = tls_variable_address(tp, proc->tls_index, proc->tls_offset);
  if (!ec_at || bpf_probe_read_user(&ec, sizeof(ec), (void *)ec_at) || !ec)
    goto fail;
  if (bpf_probe_read_user(&stack, sizeof(stack), (void *)(ec + proc->ec_vm_stack)) ||
      bpf_probe_read_user(&size, sizeof(size), (void *)(ec + proc->ec_vm_stack_size)) ||
      bpf_probe_read_user(&cfp, sizeof(cfp), (void *)(ec + proc->ec_cfp)))
    goto fail;
  // A VM stack is at most a few MiB (RUBY_VM_THREAD_VM_STACK_SIZE).
  if (!stack || !size || size > (1 << 24) || cfp < stack || cfp >= stack + 8 * size)
    goto fail;
  w->cfp = cfp;
  w->end = stack + 8 * size;
  w->started = 1;
  return 0;
fail:
  increment_runtime_metric(RUNTIME_RUBY, METRIC_ERR_RUBY_EXECUTION_CONTEXT);
  return -1;
}

// Reports the control frames of one vm_exec_core call: from the next one
// down to the first with VM_FRAME_FLAG_FINISH.
static __always_inline int ruby_walk_call(struct ruby_walk *w, const struct ruby_proc *proc,
                                          struct unwind_state *state, struct trace *t)
{
  const struct runtime_handoff *h = &state->handoff;
  for (int i = 0; i < RUBY_FRAMES_PER_PROGRAM; i++) {
    u64 cfp = w->cfp, id, addr;
    struct ruby_cfp cf;
    struct ruby_env env;
    if (cfp >= w->end) {
      if (w->call_frames)
        return RUNTIME_WALK_DONE;
      increment_runtime_metric(RUNTIME_RUBY, METRIC_ERR_RUBY_NO_FRAME);
      return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
    }
    if (bpf_probe_read_user(&cf, sizeof(cf), (void *)cfp) ||
        bpf_probe_read_user(&env, sizeof(env), (void *)(cf.ep - 16)))
      goto fail;
    u64 flags = env.flags;
    w->cfp = cfp + proc->cfp_size;
    if ((flags & RUBY_FRAME_MAGIC_MASK) == RUBY_FRAME_MAGIC_DUMMY)
      goto next;
    if (flags & RUBY_FRAME_FLAG_CFRAME) {
      id = env.me_cref;
      addr = RUBY_CFUNC_FRAME;
    } else {
      id = cf.iseq;
      addr = cf.pc;
      if (!id)
        goto next;
      // A method's own environment holds its method entry, whose
      // instruction sequence the frame runs.
      if ((flags & RUBY_FRAME_MAGIC_MASK) == RUBY_FRAME_MAGIC_METHOD && env.me_cref)
        id = env.me_cref;
    }
    w->call_frames++;
    increment_runtime_metric(RUNTIME_RUBY, METRIC_RUBY_FRAMES);
    if (push_runtime_frame(t, RUNTIME_RUBY, id, addr))
      return RUNTIME_WALK_FULL;
  next:
    if (flags & RUBY_FRAME_FLAG_FINISH) {
      if (w->call_frames)
        return RUNTIME_WALK_DONE;
      increment_runtime_metric(RUNTIME_RUBY, METRIC_ERR_RUBY_NO_FRAME);
      return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
    }
  }
  return RUNTIME_WALK_MORE;
fail:
  // What is left of the VM stack cannot be trusted: the loop's frames
  // from here on are reported as native.
  increment_runtime_metric(RUNTIME_RUBY, METRIC_ERR_RUBY_FRAME_READ);
  runtime_give_up(state, RUNTIME_RUBY);
  if (w->call_frames)
    return RUNTIME_WALK_DONE;
  return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

// The walk of the sample being unwound, started afresh for a new sample.
static __always_inline struct ruby_walk *ruby_walk_of(const struct trace *t)
{
  u32 zero = 0;
  struct ruby_walk *w = bpf_map_lookup_elem(&ruby_walks, &zero);
  if (w && w->sample != t->ktime) {
    w->sample = t->ktime;
    w->started = 0;
    w->call_reported = 0;
    w->call_cfa = 0;
    w->call_frames = 0;
  }
  return w;
}

static __always_inline int ruby_unwind_call(struct unwind_state *state, struct trace *t,
                                            const struct ruby_proc *proc)
{
  const struct runtime_handoff *h = &state->handoff;
  if (!proc) {
    runtime_missing(state, t->pid, RUNTIME_RUBY, METRIC_ERR_RUBY_NO_PROC);
    return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
  }
  struct ruby_walk *w = ruby_walk_of(t);
  if (!w || (!w->started && ruby_start(w, proc))) {
    runtime_give_up(state, RUNTIME_RUBY);
    return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
  }
  if (w->call_cfa != h->cfa) {
    // The first run for this frame (not a continuation). A call of
    // vm_exec runs the frames from the one pushed for it, whether it has
    // entered vm_exec_core yet (which it calls directly) or not.
    w->call_cfa = h->cfa;
    w->call_frames = 0;
    u64 pc = h->addr - (h->flags & FRAME_FLAG_RETURN_ADDRESS ? 1 : 0);
    int jit = !h->file_id,
        in_core = !jit && pc >= proc->eval_loop_start && pc < proc->eval_loop_end;
    if (!jit && w->call_reported) {
      if (!in_core)
        w->call_reported = 0;
      return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
    }
    w->call_reported = jit || in_core;
  }
  return ruby_walk_call(w, proc, state, t);
}

// Words above a JIT frame's stack pointer searched for its return address.
#define RUBY_JIT_RETURN_SLOTS 8

// Steps past YJIT code, handed over at its PC, to the libruby function
// that called it (vm_exec or vm_sendish): YJIT's code keeps no frame
// pointer and has no unwind information, but it is entered by a call and
// pushes three registers (cfp, ec and the VM stack pointer: heap
// addresses), so its return address is the first word above the stack
// pointer that points into libruby's code (internals.md §8). Returns 0
// when found.
static __always_inline int ruby_step_jit(struct unwind_state *state, const struct ruby_proc *proc)
{
#if defined(__TARGET_ARCH_arm64)
  // On arm64 YJIT's entry always sets up a frame record (stp x29, x30;
  // mov x29, sp), which its callees keep: step through it (internals.md
  // §12.8); the words above sp may hold stale pointers into libruby.
  u64 rec[2];
  if (!state->fp || bpf_probe_read_user(rec, sizeof(rec), (void *)state->fp))
    return -1;
  u64 ret = rec[1] & USER_ADDRESS_MASK;
  if (ret < proc->text_start || ret >= proc->text_end)
    return -1;
  state->pc = ret;
  state->sp = state->fp + 16;
  state->fp = rec[0];
  state->return_address = 1;
  return 0;
#else
  u64 words[RUBY_JIT_RETURN_SLOTS];
  if (bpf_probe_read_user(words, sizeof(words), (void *)state->sp))
    return -1;
  for (int i = 0; i < RUBY_JIT_RETURN_SLOTS; i++) {
    if (words[i] >= proc->text_start && words[i] < proc->text_end) {
      state->pc = words[i];
      state->sp += 8 * (i + 1);
      state->return_address = 1;
      return 0;
    }
  }
  return -1;
#endif
}

SEC("perf_event")
int unwind_ruby(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  const struct ruby_proc *proc = runtime_config(r->trace.pid, RUNTIME_RUBY);
  int walk = ruby_unwind_call(&r->state, &r->trace, proc);
  if (walk != RUNTIME_WALK_DONE)
    return runtime_walk_on(ctx, r, RUNTIME_RUBY, walk);
  if (!r->state.handoff.file_id && !r->state.handoff.native_done) {
    // JIT code, reported: the native unwinder goes on from its caller.
    if (!proc || ruby_step_jit(&r->state, proc)) {
      increment_runtime_metric(RUNTIME_RUBY, METRIC_ERR_RUBY_JIT_RETURN);
      return tail_call_stop(ctx);
    }
    increment_runtime_metric(RUNTIME_RUBY, METRIC_RUBY_JIT_FRAMES);
  }
  return runtime_return(ctx, r);
}

// The CPython unwinder (runtime RUNTIME_CPYTHON). The native unwinder hands
// over at each frame of the interpreter's eval loop (a rule user space
// marked with the runtime) after stepping past it; this program reports the
// Python frames that call of the eval loop runs, innermost first, and hands
// back. So a C extension's native frames land between the Python frame that
// called it and the Python frames it calls back, as on the real stack.
//
// Its frames: file_id is the address of the code object, addr the byte
// offset of its instruction (a u32; the top bit set when the frame has not
// started).
#include "tracemgmt.h"

// How a CPython version links the frames its unwinder walks (the values of
// package python's FrameLayout).
enum python_frame_layout {
  // 3.6-3.10: each call of the eval loop runs one PyFrameObject, found in
  // tstate->frame, its caller's in f_back.
  PYTHON_FRAMES_OBJECTS = 1,
  // 3.11: _PyInterpreterFrames from tstate->cframe->current_frame, linked
  // by previous; the frames of one call of the eval loop end with the one
  // whose is_entry is set.
  PYTHON_FRAMES_311 = 2,
  // 3.12: as 3.11, but a call of the eval loop ends at the frame it put on
  // the C stack, owned by FRAME_OWNED_BY_CSTACK, which runs no code.
  PYTHON_FRAMES_312 = 3,
  // 3.13+: as 3.12, from tstate->current_frame.
  PYTHON_FRAMES_313 = 4,
};

// What the Python unwinder needs of a CPython process (its entry in
// runtime_procs); user space fills it from package python's tables.
struct python_proc {
  // 3.15+: the thread-local variable that holds the thread's PyThreadState
  // (_Py_tss_gilstate), as tls_variable_address takes it; key_addr is then
  // 0.
  u64 tstate_tls_index;
  u64 tstate_tls_offset;
  // 3.6-3.14: CPython's pthread key for thread states, a u32 at key_addr:
  // it exists once the int at key_ready_addr is 1 (3.7+:
  // Py_tss_t._is_initialized) or, where key_ready_addr is 0 (3.6), once
  // the key is not -1. The interpreter creates it while starting, so it is
  // read per sample.
  u64 key_addr;
  u64 key_ready_addr;
  // The interrupted thread's PyThreadState is the value bound to the key,
  // which the unwinder finds the way the C library's pthread_getspecific
  // does, from the thread pointer tp, for keys below tsd_max_key:
  //   base = tsd_self_deref ? *(tp + tsd_self_offset) : tp
  //   block = base + tsd_block_offset, then *block if tsd_block_deref
  //   tstate = *(block + key * tsd_entry_size + tsd_data_offset)
  s64 tsd_self_offset;
  s64 tsd_block_offset;
  s64 tsd_data_offset;
  u32 tsd_entry_size;
  u32 tsd_max_key;
  u8 tsd_self_deref;
  u8 tsd_block_deref;
  u8 frame_layout; // enum python_frame_layout
  // PYTHON_FRAMES_OBJECTS: bytes per unit of f_lasti.
  u8 lasti_unit;
  // 3.12+: a frame whose owner is this or above is the entry frame a call
  // of the eval loop keeps on its C stack (FRAME_OWNED_BY_CSTACK in 3.12
  // and 3.13, FRAME_OWNED_BY_INTERPRETER in 3.14), which runs no code.
  u8 entry_frame_owner;
  u8 pad[3];
  // Byte offsets into CPython's structs: tstate->frame, ->cframe or
  // ->current_frame as the layout says; _PyCFrame's current_frame and
  // previous; the frame's caller (f_back, previous), code (f_code,
  // f_executable), instruction (f_lasti, prev_instr, instr_ptr), owner and
  // is_entry; co_code_adaptive.
  u16 tstate_frame;
  u16 cframe_current_frame;
  u16 cframe_previous;
  u16 frame_previous;
  u16 frame_code;
  u16 frame_instr;
  u16 frame_owner;
  u16 frame_is_entry;
  u16 code_adaptive;
  u16 pad16[3];
};
_Static_assert(sizeof(struct python_proc) <= RUNTIME_PROC_SIZE, "python_proc too large");

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum cpython_metric {
  // Python frames reported.
  METRIC_CPYTHON_FRAMES,
  // An eval loop frame was entering or leaving its call (3.11+): the
  // Python frames are its caller's, so the native frame is reported.
  METRIC_CPYTHON_CALL_BOUNDARY,
  // A frame of CPython's eval loop in a process user space has not (yet)
  // described: the native frame is reported, and user space is told
  // (EVENT_UNKNOWN_PC).
  METRIC_ERR_CPYTHON_NO_PROC,
  // The thread's PyThreadState or its current frame could not be read (a
  // thread that never ran Python has none; the interpreter may not have
  // created its key yet).
  METRIC_ERR_CPYTHON_THREAD_STATE,
  // Reading a Python frame failed.
  METRIC_ERR_CPYTHON_FRAME_READ,
  // An eval loop frame had no Python frame left to report: the native
  // frame is reported.
  METRIC_ERR_CPYTHON_NO_FRAME,
  METRIC_CPYTHON_COUNT,
};
_Static_assert(METRIC_CPYTHON_COUNT <= RUNTIME_METRICS_MAX, "too many cpython metrics");

// Where the Python unwinder is in a sample.
struct python_walk {
  // The sample (its ktime) this walk belongs to: a walk of an earlier
  // sample is started afresh.
  u64 sample;
  // The next frame to report; 0 when none are left.
  u64 frame;
  // PYTHON_FRAMES_311: the _PyCFrame of the next eval loop call.
  u64 cframe;
  // The C stack of the eval loop's call: [eval_lo, handoff.cfa), from the
  // previous call's CFA (0 for the first) to this one's. A call keeps its
  // _PyCFrame (3.11) or its entry frame (3.12+) there (in the eval loop's
  // own frame, or in a part the compiler split off), which tells the
  // frames of this call from those of its caller while it is entering or
  // leaving.
  u64 eval_lo;
  u64 eval_cfa;
  // Where the current call's walk began, to take back the frames it
  // reported if they turn out to be its caller's.
  u64 call_first_frame;
  u32 call_first_index;
  // Python frames reported for the current call.
  u32 call_frames;
  // The thread's Python frames were found.
  u8 started;
  u8 pad[7];
};

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct cpython_btf_exports {
  enum python_frame_layout python_frame_layout;
  struct python_proc python_proc;
  enum cpython_metric cpython_metric;
} cpython_btf_exports __attribute__((used));

// The per-CPU walk of the sample being unwound.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct python_walk);
} cpython_walks SEC(".maps");

// Python frames one run of this program walks before it tail-calls itself.
#define PYTHON_FRAMES_PER_PROGRAM 32

// The interrupted thread's PyThreadState: the value bound to CPython's
// pthread key, found as pthread_getspecific finds it, or (3.15+) its
// thread-local variable (struct python_proc). A thread that never ran
// Python has none. Returns 0 when it cannot be read.
static __always_inline u64 python_thread_state(u64 tp, const struct python_proc *proc)
{
  u64 base = tp, block, tstate;
  u32 key;
  s32 ready = 1;
  if (!proc->key_addr) {
    block = tls_variable_address(tp, proc->tstate_tls_index, proc->tstate_tls_offset);
    if (!block || bpf_probe_read_user(&tstate, sizeof(tstate), (void *)block))
      return 0;
    return tstate;
  }
  if (bpf_probe_read_user(&key, sizeof(key), (void *)proc->key_addr))
    return 0;
  if (proc->key_ready_addr) {
    if (bpf_probe_read_user(&ready, sizeof(ready), (void *)proc->key_ready_addr))
      return 0;
  } else if ((s32)key == -1) {
    ready = 0;
  }
  if (ready != 1 || key >= proc->tsd_max_key)
    return 0;
  if (proc->tsd_self_deref &&
      bpf_probe_read_user(&base, sizeof(base), (void *)(tp + proc->tsd_self_offset)))
    return 0;
  block = base + proc->tsd_block_offset;
  if (proc->tsd_block_deref && bpf_probe_read_user(&block, sizeof(block), (void *)block))
    return 0;
  block += (u64)key * proc->tsd_entry_size + proc->tsd_data_offset;
  if (bpf_probe_read_user(&tstate, sizeof(tstate), (void *)block))
    return 0;
  return tstate;
}

// Finds the current Python frame of the interrupted thread, from its
// PyThreadState. Returns 0 when found.
static __always_inline int python_start(struct python_walk *w, const struct python_proc *proc)
{
  u64 tp = thread_pointer(), tstate, frame;
  if (!tp || !(tstate = python_thread_state(tp, proc)))
    goto fail;
  if (bpf_probe_read_user(&frame, sizeof(frame), (void *)(tstate + proc->tstate_frame)))
    goto fail;
  w->frame = 0;
  w->cframe = 0;
  switch (proc->frame_layout) {
  case PYTHON_FRAMES_311:
    // frame is the innermost call's _PyCFrame; each call starts from its own.
    w->cframe = frame;
    break;
  case PYTHON_FRAMES_312:
    // frame is the innermost call's _PyCFrame.
    if (!frame || bpf_probe_read_user(&w->frame, sizeof(w->frame),
                                      (void *)(frame + proc->cframe_current_frame)))
      goto fail;
    break;
  default:
    w->frame = frame;
  }
  w->started = 1;
  return 0;
fail:
  increment_runtime_metric(RUNTIME_CPYTHON, METRIC_ERR_CPYTHON_THREAD_STATE);
  return -1;
}

// Ends a call that has no Python frames of its own: it is entering or
// leaving, or its frames could not be read. Its native frame is reported.
static __always_inline int python_call_native(const struct runtime_handoff *h, struct trace *t)
{
  return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

// Reports the PyFrameObject w->frame runs (3.6-3.10, one per call of the
// eval loop) and hands the frames of the calls below to the native
// unwinder's inline walk, which reports one per eval loop frame without
// spending tail calls.
static __always_inline int python_frame_objects(struct python_walk *w,
                                                const struct python_proc *proc,
                                                struct unwind_state *state, struct trace *t)
{
  struct inline_walk *iw = &state->inline_walk;
  iw->node = w->frame;
  iw->next_off = proc->frame_previous;
  iw->id_off = proc->frame_code;
  iw->addr_off = proc->frame_instr;
  // f_lasti is -1 before the first instruction: the offset's top bit is
  // then set, which user space reads as "not started".
  iw->addr_scale = proc->lasti_unit;
  iw->runtime = RUNTIME_CPYTHON;
  iw->metric_frames = METRIC_CPYTHON_FRAMES;
  iw->metric_no_frame = METRIC_ERR_CPYTHON_NO_FRAME;
  iw->metric_read_error = METRIC_ERR_CPYTHON_FRAME_READ;
  return inline_walk_step(state, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

static __always_inline int on_eval_stack(const struct python_walk *w, u64 addr)
{
  return addr >= w->eval_lo && addr < w->eval_cfa;
}

// Starts the walk of one call of the eval loop (3.11+). In 3.11 the call's
// frames start at its own _PyCFrame's current_frame: a _PyCFrame that is
// not on this native frame's stack is the caller's, so this call is
// entering or leaving and runs no frame of its own.
static __always_inline int python_begin_call(struct python_walk *w, const struct python_proc *proc,
                                             struct unwind_state *state, struct trace *t)
{
  w->call_first_frame = w->frame;
  w->call_first_index = t->num_frames;
  if (proc->frame_layout != PYTHON_FRAMES_311)
    return 0;
  u64 cf = w->cframe;
  if (!on_eval_stack(w, cf)) {
    increment_runtime_metric(RUNTIME_CPYTHON, METRIC_CPYTHON_CALL_BOUNDARY);
    return -1;
  }
  if (bpf_probe_read_user(&w->frame, sizeof(w->frame), (void *)(cf + proc->cframe_current_frame)) ||
      bpf_probe_read_user(&w->cframe, sizeof(w->cframe), (void *)(cf + proc->cframe_previous))) {
    increment_runtime_metric(RUNTIME_CPYTHON, METRIC_ERR_CPYTHON_FRAME_READ);
    runtime_give_up(state, RUNTIME_CPYTHON);
    return -1;
  }
  return 0;
}

// Reports the _PyInterpreterFrames (3.11+) of one eval loop call, from
// its innermost frame up to the one the call started with: in 3.11 the
// frame whose is_entry is set; in 3.12+ the frame below the entry frame
// the call put on its C stack. An entry frame that is not on this native
// frame's stack is the caller's: the call is entering or leaving, and the
// frames reported were the caller's, so they are taken back.
static __always_inline int python_walk_call(struct python_walk *w, const struct python_proc *proc,
                                            struct unwind_state *state, struct trace *t)
{
  const struct runtime_handoff *h = &state->handoff;
  if (!w->call_frames && python_begin_call(w, proc, state, t))
    return python_call_native(h, t);
  for (int i = 0; i < PYTHON_FRAMES_PER_PROGRAM; i++) {
    u64 f = w->frame, prev, code, instr;
    if (!f) {
      if (w->call_frames)
        return RUNTIME_WALK_DONE;
      increment_runtime_metric(RUNTIME_CPYTHON, METRIC_ERR_CPYTHON_NO_FRAME);
      return python_call_native(h, t);
    }
    if (bpf_probe_read_user(&prev, sizeof(prev), (void *)(f + proc->frame_previous)))
      goto fail;
    if (proc->frame_layout >= PYTHON_FRAMES_312) {
      u8 owner;
      if (bpf_probe_read_user(&owner, sizeof(owner), (void *)(f + proc->frame_owner)))
        goto fail;
      if (owner >= proc->entry_frame_owner) {
        if (!on_eval_stack(w, f)) {
          increment_runtime_metric(RUNTIME_CPYTHON, METRIC_CPYTHON_CALL_BOUNDARY);
          t->num_frames = w->call_first_index;
          w->frame = w->call_first_frame;
          return python_call_native(h, t);
        }
        w->frame = prev;
        return w->call_frames ? RUNTIME_WALK_DONE : python_call_native(h, t);
      }
    }
    if (bpf_probe_read_user(&code, sizeof(code), (void *)(f + proc->frame_code)) ||
        bpf_probe_read_user(&instr, sizeof(instr), (void *)(f + proc->frame_instr)))
      goto fail;
    // 3.14's f_executable is a _PyStackRef: a pointer with tag bits.
    code &= ~3ULL;
    w->frame = prev;
    w->call_frames++;
    increment_runtime_metric(RUNTIME_CPYTHON, METRIC_CPYTHON_FRAMES);
    // Before the first instruction, prev_instr points one code unit below
    // the code: the offset's top bit is then set ("not started").
    u32 offset = (u32)(instr - code - proc->code_adaptive);
    if (push_runtime_frame(t, RUNTIME_CPYTHON, code, offset))
      return RUNTIME_WALK_FULL;
    if (proc->frame_layout == PYTHON_FRAMES_311) {
      u8 is_entry;
      if (bpf_probe_read_user(&is_entry, sizeof(is_entry), (void *)(f + proc->frame_is_entry)))
        goto fail;
      if (is_entry)
        return RUNTIME_WALK_DONE;
    }
  }
  return RUNTIME_WALK_MORE;
fail:
  // What is left of the Python stack cannot be trusted: the eval frames
  // from here on are reported as native.
  increment_runtime_metric(RUNTIME_CPYTHON, METRIC_ERR_CPYTHON_FRAME_READ);
  runtime_give_up(state, RUNTIME_CPYTHON);
  return w->call_frames ? RUNTIME_WALK_DONE : python_call_native(h, t);
}

// The walk of the sample being unwound, started afresh for a new sample.
static __always_inline struct python_walk *python_walk_of(const struct trace *t)
{
  u32 zero = 0;
  struct python_walk *w = bpf_map_lookup_elem(&cpython_walks, &zero);
  if (w && w->sample != t->ktime) {
    w->sample = t->ktime;
    w->started = 0;
    w->eval_lo = 0;
    w->eval_cfa = 0;
    w->call_frames = 0;
  }
  return w;
}

// Reports the Python frames of one eval loop call.
static __always_inline int python_unwind_call(struct unwind_state *state, struct trace *t)
{
  const struct runtime_handoff *h = &state->handoff;
  const struct python_proc *proc = runtime_config(t->pid, RUNTIME_CPYTHON);
  if (!proc) {
    runtime_missing(state, t->pid, RUNTIME_CPYTHON, METRIC_ERR_CPYTHON_NO_PROC);
    return python_call_native(h, t);
  }
  struct python_walk *w = python_walk_of(t);
  if (!w || (!w->started && python_start(w, proc))) {
    runtime_give_up(state, RUNTIME_CPYTHON);
    return python_call_native(h, t);
  }
  if (w->eval_cfa != h->cfa) {
    // The first run for this eval loop frame (not a continuation).
    w->eval_cfa = h->cfa;
    w->call_frames = 0;
  }
  int walk = proc->frame_layout == PYTHON_FRAMES_OBJECTS ? python_frame_objects(w, proc, state, t)
                                                         : python_walk_call(w, proc, state, t);
  if (walk == RUNTIME_WALK_DONE)
    w->eval_lo = w->eval_cfa;
  return walk;
}

SEC("perf_event")
int unwind_cpython(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  int walk = python_unwind_call(&r->state, &r->trace);
  if (walk != RUNTIME_WALK_DONE)
    return runtime_walk_on(ctx, r, RUNTIME_CPYTHON, walk);
  return runtime_return(ctx, r);
}

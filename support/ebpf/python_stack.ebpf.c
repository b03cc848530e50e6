// The CPython unwinder. The native unwinder hands over at each frame of the
// interpreter's eval loop (a rule marked UNWIND_RULE_INTERPRETER) after
// stepping past it; this program reports the Python frames that call of the
// eval loop runs, innermost first, and hands back. So a C extension's native
// frames land between the Python frame that called it and the Python frames
// it calls back, as on the real stack.
#include "python.h"

// Python frames one run of this program walks before it tail-calls itself.
#define PYTHON_FRAMES_PER_PROGRAM 32

// Finds the current Python frame of the interrupted thread: its
// PyThreadState is the value bound to CPython's pthread key, found as
// pthread_getspecific finds it (struct python_proc). A thread that never
// ran Python has none.
static __always_inline void python_start(struct python_walk *w, const struct python_proc *proc)
{
  w->status = PYTHON_NONE;
  u64 tp = thread_pointer(), base = tp, block, tstate, frame;
  u32 key;
  s32 ready = 1;
  if (!tp || bpf_probe_read_user(&key, sizeof(key), (void *)proc->key_addr))
    goto fail;
  if (proc->key_ready_addr) {
    if (bpf_probe_read_user(&ready, sizeof(ready), (void *)proc->key_ready_addr))
      goto fail;
  } else if ((s32)key == -1) {
    ready = 0;
  }
  if (ready != 1 || key >= proc->tsd_max_key)
    goto fail;
  if (proc->tsd_self_deref &&
      bpf_probe_read_user(&base, sizeof(base), (void *)(tp + proc->tsd_self_offset)))
    goto fail;
  block = base + proc->tsd_block_offset;
  if (proc->tsd_block_deref && bpf_probe_read_user(&block, sizeof(block), (void *)block))
    goto fail;
  block += (u64)key * proc->tsd_entry_size + proc->tsd_data_offset;
  if (bpf_probe_read_user(&tstate, sizeof(tstate), (void *)block) || !tstate)
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
  w->frame_layout = proc->frame_layout;
  w->lasti_unit = proc->lasti_unit;
  w->frame_previous = proc->frame_previous;
  w->frame_code = proc->frame_code;
  w->frame_instr = proc->frame_instr;
  w->status = PYTHON_WALKING;
  return;
fail:
  increment_metric(METRIC_ERR_PYTHON_THREAD_STATE);
}

// What python_walk_call leaves to do.
enum python_call_walk {
  // The eval loop call's frames are reported.
  PYTHON_CALL_DONE,
  // It has more frames than one program walks.
  PYTHON_CALL_MORE,
  // The trace is full.
  PYTHON_CALL_FULL,
};

static __always_inline int on_eval_stack(const struct python_walk *w, u64 addr)
{
  return addr >= w->eval_lo && addr < w->eval_cfa;
}

// Ends a call that has no Python frames of its own: it is entering or
// leaving, or its frames could not be read. Its native frame is reported.
static __always_inline int python_call_native(struct python_walk *w, struct trace *t)
{
  return python_report_native(w, t) ? PYTHON_CALL_FULL : PYTHON_CALL_DONE;
}

// Starts the walk of one call of the eval loop (3.11+). In 3.11 the call's
// frames start at its own _PyCFrame's current_frame: a _PyCFrame that is
// not on this native frame's stack is the caller's, so this call is
// entering or leaving and runs no frame of its own.
static __always_inline int python_begin_call(struct python_walk *w, const struct python_proc *proc,
                                             struct trace *t)
{
  w->call_first_frame = w->frame;
  w->call_first_index = t->num_frames;
  if (proc->frame_layout != PYTHON_FRAMES_311)
    return 0;
  u64 cf = w->cframe;
  if (!on_eval_stack(w, cf)) {
    increment_metric(METRIC_PYTHON_CALL_BOUNDARY);
    return -1;
  }
  if (bpf_probe_read_user(&w->frame, sizeof(w->frame), (void *)(cf + proc->cframe_current_frame)) ||
      bpf_probe_read_user(&w->cframe, sizeof(w->cframe), (void *)(cf + proc->cframe_previous))) {
    increment_metric(METRIC_ERR_PYTHON_FRAME_READ);
    w->status = PYTHON_NONE;
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
                                            struct trace *t)
{
  if (!w->call_frames && python_begin_call(w, proc, t))
    return python_call_native(w, t);
  for (int i = 0; i < PYTHON_FRAMES_PER_PROGRAM; i++) {
    u64 f = w->frame, prev, code, instr;
    if (!f) {
      if (w->call_frames)
        return PYTHON_CALL_DONE;
      increment_metric(METRIC_ERR_PYTHON_NO_FRAME);
      return python_call_native(w, t);
    }
    if (bpf_probe_read_user(&prev, sizeof(prev), (void *)(f + proc->frame_previous)))
      goto fail;
    if (proc->frame_layout >= PYTHON_FRAMES_312) {
      u8 owner;
      if (bpf_probe_read_user(&owner, sizeof(owner), (void *)(f + proc->frame_owner)))
        goto fail;
      if (owner >= proc->entry_frame_owner) {
        if (!on_eval_stack(w, f)) {
          increment_metric(METRIC_PYTHON_CALL_BOUNDARY);
          t->num_frames = w->call_first_index;
          w->frame = w->call_first_frame;
          return python_call_native(w, t);
        }
        w->frame = prev;
        return w->call_frames ? PYTHON_CALL_DONE : python_call_native(w, t);
      }
    }
    if (bpf_probe_read_user(&code, sizeof(code), (void *)(f + proc->frame_code)) ||
        bpf_probe_read_user(&instr, sizeof(instr), (void *)(f + proc->frame_instr)))
      goto fail;
    // 3.14's f_executable is a _PyStackRef: a pointer with tag bits.
    code &= ~3ULL;
    w->frame = prev;
    w->call_frames++;
    increment_metric(METRIC_PYTHON_FRAMES);
    // Before the first instruction, prev_instr points one code unit below
    // the code: the offset's top bit is then set ("not started").
    u32 offset = (u32)(instr - code - proc->code_adaptive);
    if (push_frame(t, FRAME_KIND_PYTHON, 0, code, offset))
      return PYTHON_CALL_FULL;
    if (proc->frame_layout == PYTHON_FRAMES_311) {
      u8 is_entry;
      if (bpf_probe_read_user(&is_entry, sizeof(is_entry), (void *)(f + proc->frame_is_entry)))
        goto fail;
      if (is_entry)
        return PYTHON_CALL_DONE;
    }
  }
  return PYTHON_CALL_MORE;
fail:
  // What is left of the Python stack cannot be trusted: the eval frames
  // from here on are reported as native.
  increment_metric(METRIC_ERR_PYTHON_FRAME_READ);
  w->status = PYTHON_NONE;
  return w->call_frames ? PYTHON_CALL_DONE : python_call_native(w, t);
}

SEC("perf_event")
int unwind_python(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct python_walk *w = &r->state.python;
  struct trace *t = &r->trace;

  const struct python_proc *proc = bpf_map_lookup_elem(&python_procs, &t->pid);
  if (!proc) {
    increment_metric(METRIC_ERR_PYTHON_NO_PROC);
    report_unknown_pc(t->pid);
    w->status = PYTHON_NONE;
  } else if (w->status == PYTHON_UNKNOWN) {
    python_start(w, proc);
  }

  int walk = PYTHON_CALL_DONE;
  if (!proc || w->status != PYTHON_WALKING) {
    if (python_report_native(w, t))
      walk = PYTHON_CALL_FULL;
  } else if (w->frame_layout == PYTHON_FRAMES_OBJECTS) {
    if (python_report_frame_object(w, t))
      walk = PYTHON_CALL_FULL;
  } else {
    walk = python_walk_call(w, proc, t);
  }

  if (walk == PYTHON_CALL_DONE)
    w->eval_lo = w->eval_cfa;
  switch (walk) {
  case PYTHON_CALL_MORE:
    return tail_call_next(ctx, r, PROG_UNWIND_PYTHON);
  case PYTHON_CALL_FULL:
    increment_metric(METRIC_TRUNCATED_TRACES);
    return tail_call_stop(ctx);
  }
  if (w->native_done)
    return tail_call_stop(ctx);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
}

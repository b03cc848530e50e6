// What the native and the Python unwinder share to report CPython frames in
// place of the eval loop's native frames (see python_stack.ebpf.c).
#ifndef PYTHON_H
#define PYTHON_H

#include "tracemgmt.h"

// Reports the eval loop's native frame itself: the Python frames it runs
// are unknown or could not be read. Returns push_frame's result.
static __always_inline int python_report_native(struct python_walk *w, struct trace *t)
{
  return push_frame(t, FRAME_KIND_NATIVE, w->eval_flags, w->eval_file_id, w->eval_addr);
}

// Reports the PyFrameObject w->frame runs (3.6-3.10, one per call of the
// eval loop) and moves to its caller. A frame that cannot be read ends the
// Python walk: the eval frames from here on are reported as native. Returns
// push_frame's result.
static __always_inline int python_report_frame_object(struct python_walk *w, struct trace *t)
{
  u64 f = w->frame;
  if (!f) {
    increment_metric(METRIC_ERR_PYTHON_NO_FRAME);
    return python_report_native(w, t);
  }
  u64 code, back;
  s32 lasti;
  if (bpf_probe_read_user(&code, sizeof(code), (void *)(f + w->frame_code)) ||
      bpf_probe_read_user(&back, sizeof(back), (void *)(f + w->frame_previous)) ||
      bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(f + w->frame_instr))) {
    increment_metric(METRIC_ERR_PYTHON_FRAME_READ);
    w->status = PYTHON_NONE;
    return python_report_native(w, t);
  }
  w->frame = back;
  increment_metric(METRIC_PYTHON_FRAMES);
  // f_lasti is -1 before the first instruction: the offset's top bit is
  // then set, which user space reads as "not started".
  return push_frame(t, FRAME_KIND_PYTHON, 0, code, (u32)(lasti * (s32)w->lasti_unit));
}

#endif // PYTHON_H

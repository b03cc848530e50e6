// The native unwinder. It walks frame-pointer chains: each frame record on
// the stack holds the caller's frame pointer and the return address. Later
// unwinders (stack deltas, interpreters) take over from here by tail call.
#include "tracemgmt.h"

// Addresses below this are never code: a zero or tiny return address ends
// the walk (the outermost frame).
#define MIN_CODE_ADDRESS 0x1000

// Steps from the frame at state->fp to its caller. Returns 0 to go on, 1 when
// the walk ended normally, -1 on an error (already counted).
static __always_inline int step_frame_pointer(struct unwind_state *state)
{
  if (state->fp == 0)
    return 1;
  if (state->fp & 7) {
    increment_metric(METRIC_ERR_FP_MISALIGNED);
    return -1;
  }
  if (state->fp < state->sp) {
    increment_metric(METRIC_ERR_FP_NOT_INCREASING);
    return -1;
  }
  u64 record[2];
  if (bpf_probe_read_user(record, sizeof(record), (void *)state->fp)) {
    increment_metric(METRIC_ERR_FP_READ);
    return -1;
  }
  if (record[1] < MIN_CODE_ADDRESS)
    return 1;
  state->sp = state->fp + sizeof(record);
  state->fp = record[0];
  state->pc = record[1];
  state->return_address = 1;
  return 0;
}

SEC("perf_event")
int unwind_native(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;

  for (int i = 0; i < NATIVE_FRAMES_PER_PROGRAM; i++) {
    u8 flags = state->return_address ? FRAME_FLAG_RETURN_ADDRESS : 0;
    if (push_frame(t, FRAME_KIND_NATIVE, flags, 0, state->pc)) {
      increment_metric(METRIC_TRUNCATED_TRACES);
      return tail_call_stop(ctx);
    }
    if (step_frame_pointer(state))
      return tail_call_stop(ctx);
  }

  if (++state->tail_calls > MAX_TAIL_CALLS) {
    increment_metric(METRIC_ERR_TAIL_CALL_LIMIT);
    push_frame(t, FRAME_KIND_ABORT, 0, 0, UNWIND_ERROR_TAIL_CALL_LIMIT);
    return tail_call_stop(ctx);
  }
  bpf_tail_call(ctx, &progs, PROG_UNWIND_NATIVE);
  increment_metric(METRIC_ERR_TAIL_CALL);
  return 0;
}

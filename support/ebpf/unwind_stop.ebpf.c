// The end of every unwind: hash the trace and hand it to user space.
#include "tracemgmt.h"

// One round of a multiply-xorshift mix (constants from splitmix64).
static __always_inline u64 hash_mix(u64 h, u64 v)
{
  h ^= v;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 31;
  return h;
}

SEC("perf_event")
int unwind_stop(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct trace *t = &r->trace;

  u64 h = hash_mix(0x9e3779b97f4a7c15ULL, t->pid);
  h = hash_mix(h, t->flags & TRACE_FLAG_TRUNCATED);
  for (u32 i = 0; i < MAX_FRAMES; i++) {
    if (i >= t->num_frames)
      break;
    struct frame *f = &t->frames[i];
    h = hash_mix(h, f->addr);
    h = hash_mix(h, f->file_id ^ ((u64)f->kind << 56) ^ ((u64)f->flags << 48));
  }
  t->hash = h;

  u64 n = t->num_frames;
  if (n > MAX_FRAMES)
    n = MAX_FRAMES;
  u64 size = __builtin_offsetof(struct trace, frames) + n * sizeof(struct frame);
  if (emit_event(t, size, 0))
    increment_metric(METRIC_ERR_TRACE_DROPPED);
  else
    increment_metric(METRIC_TRACES_SENT);
  return 0;
}

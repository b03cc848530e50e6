// The end of every unwind: the thread's contexts, the trace's hash, and the
// trace handed to user space.
#include "go_labels.h"
#include "thread_ctx.h"
#include "tracemgmt.h"

// One round of a multiply-xorshift mix (constants from splitmix64).
static __always_inline u64 hash_mix(u64 h, u64 v)
{
  h ^= v;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 31;
  return h;
}

// Whether the reader should be woken for this trace: it has runtime
// frames (symbolized from the process's memory, so the process must still
// run) or an APM trace context (its stack-trace id is due to the agent
// within the delay we announced), and no trace woke the reader in the last
// trace_wakeup_latency. The reader otherwise polls far less often.
static __always_inline int trace_urgent(const struct record *r)
{
  if (!(r->trace.flags & (TRACE_FLAG_RUNTIME_FRAMES | TRACE_FLAG_APM_CONTEXT)))
    return 0;
  u32 zero = 0;
  u64 *last = bpf_map_lookup_elem(&early_wakeups, &zero);
  u64 now = bpf_ktime_get_ns();
  if (!last || now - *last < trace_wakeup_latency)
    return 0;
  *last = now;
  return 1;
}

// Reads the APM trace the thread is in, if its process has an APM agent:
// the agent's thread-local pointer leads to the thread's correlation
// record, which is ignored while the agent updates it (valid = 0).
static __always_inline void read_apm_context(struct trace *t)
{
  const struct apm_proc *proc = bpf_map_lookup_elem(&apm_procs, &t->pid);
  if (!proc)
    return;
  u64 tp = thread_pointer(), record = 0;
  u8 buf[APM_RECORD_SIZE];
  if (!tp || bpf_probe_read_user(&record, sizeof(record), (void *)(tp + proc->tls_offset))) {
    increment_metric(METRIC_ERR_APM_READ);
    return;
  }
  if (!record)
    return; // a thread the agent gave no record
  if (bpf_probe_read_user(buf, sizeof(buf), (void *)record)) {
    increment_metric(METRIC_ERR_APM_READ);
    return;
  }
  if (!buf[APM_RECORD_VALID]) {
    increment_metric(METRIC_APM_RECORD_INVALID);
    return;
  }
  if (!buf[APM_RECORD_TRACE_PRESENT])
    return;
  __builtin_memcpy(&t->apm, &buf[APM_RECORD_IDS], sizeof(t->apm));
  t->flags |= TRACE_FLAG_APM_CONTEXT;
  increment_metric(METRIC_APM_CONTEXTS);
}

// Sends the trace (its frames, then its labels) to user space.
static __always_inline void emit_trace(struct record *r)
{
  struct trace *t = &r->trace;
  u64 n = t->num_frames;
  if (n > MAX_FRAMES)
    n = MAX_FRAMES;
  u64 labels = t->num_labels;
  if (labels > MAX_LABELS)
    labels = MAX_LABELS;
  u64 size = __builtin_offsetof(struct trace, frames) + n * sizeof(struct frame) +
             labels * sizeof(struct label);
  if (emit_event(t, size, trace_urgent(r)))
    increment_metric(METRIC_ERR_TRACE_DROPPED);
  else
    increment_metric(METRIC_TRACES_SENT);
}

// Reads the APM trace the thread is in and hashes the frames, then hands
// the trace to read_context, or sends it itself where read_context is not
// loaded (its slot is empty: the tail call falls through).
SEC("perf_event")
int unwind_stop(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct trace *t = &r->trace;
  read_apm_context(t);

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

  bpf_tail_call(ctx, &progs, PROG_READ_CONTEXT);
  emit_trace(r);
  return 0;
}

// Reads the thread's goroutine labels and OpenTelemetry thread context
// into the trace and sends it. A program of its own, loaded on its own
// (user space): the verifier walks its paths once rather than once per
// exit of unwind_stop's frame loop, and a kernel that refuses it loses
// only the labels. It makes no tail call: arm64 before 6.0 allows none in
// a program with subprograms (push_go_label).
SEC("perf_event")
int read_context(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  read_go_labels(r);
  read_thread_context(&r->trace);
  emit_trace(r);
  return 0;
}

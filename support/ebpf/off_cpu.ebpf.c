// Off-CPU profiling: at a context switch, the thread leaving the CPU (the
// current one) has its stack unwound by the same programs as a perf
// event's sample, and when a thread whose switch-out was traced runs
// again, how long it waited is reported (EVENT_OFF_CPU_END); user space
// joins the two. sched_switch is a raw tracepoint, so this needs neither
// kprobes nor BPF trampolines. User space loads the unwinders a second
// time as raw tracepoint programs for it, with off_cpu_progs in place of
// progs and off_cpu_records in place of records.
#include "tracemgmt.h"

// The traced switch-outs whose thread has not run again, by tid. LRU:
// threads that exit while waiting are forgotten as others come.
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, u32);
  __type(value, struct off_cpu_start);
} off_cpu_starts SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct off_cpu_budget);
} off_cpu_budgets SEC(".maps");

// Non-zero while sampling is paused (probabilistic profiling): no switch
// is traced, waits traced before still end.
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, u32);
} off_cpu_paused SEC(".maps");

// The off-CPU copies' tail-call targets and scratch record (see above):
// a prog array takes programs of one type only, and a switch-out never
// interrupts a perf event's sample, nor the other way round, but each has
// its own record all the same.
struct {
  __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
  __uint(max_entries, RUNTIME_MAX);
  __type(key, u32);
  __type(value, u32);
} off_cpu_progs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct record);
} off_cpu_records SEC(".maps");

// Reports the end of next's wait, if its switch-out was traced. A wait
// shorter than off_cpu_min_ns is reported too (user space holds its trace
// until then) but counted apart.
static __always_inline void end_wait(struct task_struct *next, u64 now)
{
  u32 tid = 0;
  if (CORE_READ_KERNEL(&tid, &next->pid) || !tid)
    return;
  struct off_cpu_start *s = bpf_map_lookup_elem(&off_cpu_starts, &tid);
  if (!s)
    return;
  struct off_cpu_end ev = {.type = EVENT_OFF_CPU_END, .pid = s->pid, .tid = tid, .start = s->ktime};
  ev.duration = now - s->ktime;
  bpf_map_delete_elem(&off_cpu_starts, &tid);
  increment_metric(ev.duration < off_cpu_min_ns ? METRIC_OFF_CPU_SHORT : METRIC_OFF_CPU_ENDS);
  if (emit_event(&ev, sizeof(ev), 0))
    increment_metric(METRIC_ERR_OFF_CPU_END_DROPPED);
}

// Whether this CPU may unwind one more switch-out in the current second.
static __always_inline int within_budget(u64 now)
{
  u32 zero = 0;
  struct off_cpu_budget *b = bpf_map_lookup_elem(&off_cpu_budgets, &zero);
  if (!b)
    return 0;
  if (now - b->window >= 1000000000ULL) {
    b->window = now;
    b->used = 0;
  }
  if (b->used >= off_cpu_per_second)
    return 0;
  b->used++;
  return 1;
}

// Whether task is runnable (TASK_RUNNING): it left the CPU without waiting
// for anything, preempted or at a resched point.
static __always_inline int task_runnable(struct task_struct *task)
{
  if (CORE_FIELD_EXISTS(task->__state)) {
    unsigned int state = 1;
    CORE_READ_KERNEL(&state, &task->__state);
    return state == 0;
  }
  struct task_struct___before_5_14 *old = (void *)task;
  long state = 1;
  CORE_READ_KERNEL(&state, &old->state);
  return state == 0;
}

// sched_switch(preempt, prev, next[, prev_state]): runs on the CPU prev
// leaves, as prev.
SEC("raw_tracepoint/sched_switch")
int off_cpu_switch(struct bpf_raw_tracepoint_args *ctx)
{
  u64 now = bpf_ktime_get_ns();
  end_wait((struct task_struct *)ctx->args[2], now);

  // A preempted thread (runnable) still runs, as far as it knows: it waits
  // for a CPU, not for something it asked for. Off-CPU time is the time a
  // thread blocked (sleep, I/O, lock, page fault), run-queue delay after
  // its wake-up included.
  if (ctx->args[0] || task_runnable((struct task_struct *)ctx->args[1]))
    return 0;
  // An exiting thread's last switches: it never runs again to end them.
  u64 pid_tgid = bpf_get_current_pid_tgid();
  if (pid_tgid >> 32 == 0 || pid_tgid >> 32 == off_cpu_self_pid ||
      (current_task_flags() & (PF_KTHREAD | PF_EXITING)))
    return 0;
  u32 zero = 0;
  u32 *paused = bpf_map_lookup_elem(&off_cpu_paused, &zero);
  if (paused && *paused)
    return 0;
  increment_metric(METRIC_OFF_CPU_SWITCHES);
  if (off_cpu_threshold <= 0xffffffffULL && bpf_get_prandom_u32() >= off_cpu_threshold) {
    increment_metric(METRIC_OFF_CPU_SAMPLED_OUT);
    return 0;
  }
  if (!within_budget(now)) {
    increment_metric(METRIC_OFF_CPU_OVER_BUDGET);
    return 0;
  }
  struct record *r = get_record();
  if (!r)
    return 0;
  increment_metric(METRIC_OFF_CPU_TRACES);
  start_trace(r, pid_tgid, TRACE_FLAG_OFF_CPU);
  r->trace.ktime = now;
  struct off_cpu_start s = {.ktime = now, .pid = pid_tgid >> 32};
  u32 tid = (u32)pid_tgid;
  bpf_map_update_elem(&off_cpu_starts, &tid, &s, BPF_ANY);

  add_kernel_frames(ctx, r);
  struct pt_regs regs;
  int err = read_saved_user_regs(&regs);
  return start_unwind(ctx, r, &regs, err);
}

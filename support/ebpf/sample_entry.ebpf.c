// The perf_event entry program: starts a trace for the interrupted thread,
// takes the kernel stack, finds the user registers and hands over to the
// native unwinder.
#include "tracemgmt.h"

// The user registers of the current thread while it is in the kernel, saved
// at the top of its kernel stack on entry.
static __always_inline int read_saved_user_regs(struct pt_regs *regs)
{
  const void *saved;
  if (have_task_pt_regs) {
    saved = (const void *)bpf_task_pt_regs(bpf_get_current_task_btf());
  } else {
    // Kernels before 5.15: the layout of task_pt_regs() on both arches.
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    void *stack;
    if (CORE_READ_KERNEL(&stack, &task->stack))
      return -1;
    saved = stack + THREAD_SIZE - __builtin_preserve_type_info(*(struct pt_regs *)0, 1);
  }
  if (bpf_probe_read_kernel(regs, sizeof(*regs), saved))
    return -1;
  return regs_in_kernel(regs) ? -1 : 0;
}

// The user registers of the interrupted thread.
static __always_inline int read_user_regs(struct bpf_perf_event_data *ctx, struct pt_regs *regs)
{
  if (!regs_in_kernel(&ctx->regs)) {
    *regs = ctx->regs;
    return 0;
  }
  return read_saved_user_regs(regs);
}

// The kernel stack of the program's context (a perf event's or a
// tracepoint's) as the trace's first frames.
static __always_inline void add_kernel_frames(void *ctx, struct record *r)
{
  struct trace *t = &r->trace;
  long bytes = bpf_get_stack(ctx, r->kernel_stack, sizeof(r->kernel_stack), 0);
  if (bytes < 0) {
    increment_metric(METRIC_ERR_KERNEL_STACK);
    return;
  }
  u32 n = bytes / sizeof(u64);
  for (u32 i = 0; i < MAX_KERNEL_FRAMES; i++) {
    if (i >= n)
      break;
    t->frames[i].file_id = 0;
    t->frames[i].addr = r->kernel_stack[i];
    t->frames[i].kind = FRAME_KIND_KERNEL;
    t->frames[i].flags = 0;
  }
  if (n > MAX_KERNEL_FRAMES)
    n = MAX_KERNEL_FRAMES;
  t->num_kernel_frames = n;
  t->num_frames = n;
}

// Starts the current thread's trace in r: no frames yet, a fresh unwind
// state.
static __always_inline void start_trace(struct record *r, u64 pid_tgid, u32 flags)
{
  struct trace *t = &r->trace;
  t->type = EVENT_TRACE;
  t->pid = pid_tgid >> 32;
  t->tid = (u32)pid_tgid;
  t->ktime = bpf_ktime_get_ns();
  t->hash = 0;
  t->cpu = bpf_get_smp_processor_id();
  t->flags = flags;
  t->num_kernel_frames = 0;
  t->num_frames = 0;
  t->num_labels = 0;
  bpf_get_current_comm(t->comm, sizeof(t->comm));
  r->state.tail_calls = 0;
  r->state.return_address = 0;
  r->state.vma.end = 0;
  r->state.exe.end = 0;
  r->state.lib.end = 0;
  r->state.vma_tried = 0;
  r->state.exe_read = 0;
  r->state.lib_looked = 0;
  r->state.fp_step_sp = 0;
  r->state.handoff.done_mask = 0;
  r->state.inline_walk.runtime = 0;
}

// The current thread's flags (PF_*).
static __always_inline unsigned int current_task_flags(void)
{
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  unsigned int task_flags = 0;
  CORE_READ_KERNEL(&task_flags, &task->flags);
  return task_flags;
}

// Hands the trace, its user registers read (or not: err), to the native
// unwinder.
static __always_inline int start_unwind(void *ctx, struct record *r, const struct pt_regs *regs,
                                        int err)
{
  if (err) {
    increment_metric(METRIC_ERR_USER_REGS);
    push_frame(&r->trace, FRAME_KIND_ABORT, 0, 0, UNWIND_ERROR_USER_REGS);
    return tail_call_stop(ctx);
  }
  r->state.pc = REGS_PC(regs);
  r->state.sp = REGS_SP(regs);
  r->state.fp = REGS_FP(regs);
  r->state.lr = REGS_LR(regs);
  r->state.user_regs = *regs;
  bpf_tail_call(ctx, &progs, PROG_UNWIND_NATIVE);
  increment_metric(METRIC_ERR_TAIL_CALL);
  return 0;
}

SEC("perf_event")
int sample_entry(struct bpf_perf_event_data *ctx)
{
  u64 pid_tgid = bpf_get_current_pid_tgid();
  if (pid_tgid >> 32 == 0) {
    increment_metric(METRIC_IDLE_SAMPLES);
    return 0;
  }
  struct record *r = get_record();
  if (!r)
    return 0;
  increment_metric(METRIC_SAMPLES);
  start_trace(r, pid_tgid, 0);

  if (regs_in_kernel(&ctx->regs))
    add_kernel_frames(ctx, r);
  if (current_task_flags() & PF_KTHREAD) {
    increment_metric(METRIC_KERNEL_THREAD_SAMPLES);
    return tail_call_stop(ctx);
  }
  struct pt_regs regs;
  int err = read_user_regs(ctx, &regs);
  return start_unwind(ctx, r, &regs, err);
}

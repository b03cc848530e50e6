// Tells user space when a process exits or replaces its image with exec, so
// that its state is freed or re-read. Raw tracepoints need no tracefs.
#include "tracemgmt.h"

// Whether the exiting thread is the last of its group: do_exit() drops
// signal->live before this tracepoint fires, so the process ends when it is
// zero, whichever thread exits last (the leader may exit first).
static __always_inline int group_dead(void)
{
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  struct signal_struct *signal;
  int live;
  if (CORE_READ_KERNEL(&signal, &task->signal) || CORE_READ_KERNEL(&live, &signal->live.counter)) {
    increment_metric(METRIC_ERR_EXIT_GROUP_READ);
    u64 pid_tgid = bpf_get_current_pid_tgid();
    return (pid_tgid >> 32) == (u32)pid_tgid;
  }
  return live == 0;
}

SEC("raw_tracepoint/sched_process_exit")
int process_exit(void *ctx)
{
  if (group_dead())
    emit_process_event(EVENT_PROCESS_EXIT, bpf_get_current_pid_tgid() >> 32, METRIC_PROCESS_EXITS, 0);
  return 0;
}

SEC("raw_tracepoint/sched_process_exec")
int process_exec(void *ctx)
{
  // After exec the calling thread is the leader: its tgid is the process.
  // Urgent: until user space drops the old image's mappings, BPF would
  // unwind the new image's code with them.
  u32 pid = bpf_get_current_pid_tgid() >> 32;
  emit_process_event(EVENT_PROCESS_EXEC, pid, METRIC_PROCESS_EXECS, 1);
  // The new image's first unknown PC must be reported at once, whatever
  // the old image reported.
  bpf_map_delete_elem(&unknown_pc_reports, &pid);
  return 0;
}

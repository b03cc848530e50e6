// Tells user space when a process (its thread-group leader) exits, so that
// per-process state is freed. A raw tracepoint needs no tracefs.
#include "tracemgmt.h"

SEC("raw_tracepoint/sched_process_exit")
int process_exit(void *ctx)
{
  u64 pid_tgid = bpf_get_current_pid_tgid();
  u32 pid = pid_tgid >> 32;
  if (pid != (u32)pid_tgid)
    return 0;
  struct process_event ev = {.type = EVENT_PROCESS_EXIT, .pid = pid};
  if (emit_event(&ev, sizeof(ev)))
    increment_metric(METRIC_ERR_EXIT_EVENT_DROPPED);
  else
    increment_metric(METRIC_PROCESS_EXITS);
  return 0;
}

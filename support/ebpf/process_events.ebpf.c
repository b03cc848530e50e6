// Tells user space when a process it tracks exits or replaces its image
// with exec, so that its state is freed or re-read (see tracked_pids). Raw
// tracepoints need no tracefs.
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
  if (!group_dead())
    return 0;
  u32 pid = bpf_get_current_pid_tgid() >> 32;
  if (!is_tracked(pid)) {
    increment_metric(METRIC_EXITS_UNTRACKED);
    return 0;
  }
  emit_process_event(EVENT_PROCESS_EXIT, pid, 0, METRIC_PROCESS_EXITS, 0);
  bpf_map_delete_elem(&tracked_pids, &pid);
  return 0;
}

// Reports that the current process mapped [start, end) of file from page
// pgoff on, executable.
static __always_inline void report_exec_mapping(u64 start, u64 end, u64 pgoff, struct file *file)
{
  struct mmap_event ev = {
    .type = EVENT_EXEC_MAPPED,
    .pid = bpf_get_current_pid_tgid() >> 32,
    .start = start,
    .end = end,
    .pgoff = pgoff,
  };
  // User space reads an untracked process's mappings whole, if ever.
  if (!is_tracked(ev.pid))
    return;
  struct inode *inode;
  struct super_block *sb;
  u32 dev;
  if (CORE_READ_KERNEL(&inode, &file->f_inode) || CORE_READ_KERNEL(&ev.ino, &inode->i_ino) ||
      CORE_READ_KERNEL(&sb, &inode->i_sb) || CORE_READ_KERNEL(&dev, &sb->s_dev)) {
    increment_metric(METRIC_ERR_MMAP_READ);
    return;
  }
  ev.dev = dev;
  long err = emit_event(&ev, sizeof(ev), 1);
  increment_metric(err ? METRIC_ERR_PROCESS_EVENT_DROPPED : METRIC_EXEC_MAPPINGS);
}

// Every mapping the kernel's ELF loader, the dynamic loader or dlopen makes
// goes through mmap_region, in the mapping process, which still runs no code
// of the mapping. User space loads this as a separate, optional program:
// where the function or BPF trampolines are missing, exec_mapped_kprobe
// stands in.
SEC("fexit/mmap_region")
int exec_mapped_fexit(u64 *ctx)
{
  // mmap_region(file, addr, len, vm_flags, pgoff, uf) returns the address.
  struct file *file = (struct file *)ctx[0];
  u64 len = ctx[2], vm_flags = ctx[3], pgoff = ctx[4], ret = ctx[6];
  if (!file || !(vm_flags & VM_EXEC) || ret >= (u64)-4095)
    return 0;
  report_exec_mapping(ret, ret + len, pgoff, file);
  return 0;
}

// The same from perf_event_mmap, which runs for every new mapping and every
// mprotect whether or not a perf event asked for mapping records.
SEC("kprobe/perf_event_mmap")
int exec_mapped_kprobe(struct pt_regs *ctx)
{
  struct vm_area_struct *vma = (struct vm_area_struct *)REGS_PARM1(ctx);
  unsigned long flags;
  struct file *file;
  u64 start, end, pgoff;
  if (CORE_READ_KERNEL(&flags, &vma->vm_flags) || !(flags & VM_EXEC) ||
      CORE_READ_KERNEL(&file, &vma->vm_file) || !file)
    return 0;
  if (CORE_READ_KERNEL(&start, &vma->vm_start) || CORE_READ_KERNEL(&end, &vma->vm_end) ||
      CORE_READ_KERNEL(&pgoff, &vma->vm_pgoff)) {
    increment_metric(METRIC_ERR_MMAP_READ);
    return 0;
  }
  report_exec_mapping(start, end, pgoff, file);
  return 0;
}

SEC("raw_tracepoint/sched_process_exec")
int process_exec(void *ctx)
{
  // After exec the calling thread is the leader: its tgid is the process.
  // Urgent: until user space drops the old image's mappings, BPF would
  // unwind the new image's code with them. The program's file tells user
  // space whether the unwinder knows it already, so that reading the new
  // process can wait for its first sample.
  u32 pid = bpf_get_current_pid_tgid() >> 32;
  struct exec_event ev = {.type = EVENT_PROCESS_EXEC, .pid = pid};
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  struct mm_struct *mm;
  struct file *f;
  struct inode *inode;
  struct super_block *sb;
  u32 dev;
  if (!CORE_READ_KERNEL(&mm, &task->mm) && mm && !CORE_READ_KERNEL(&f, &mm->exe_file) && f &&
      !CORE_READ_KERNEL(&inode, &f->f_inode) && !CORE_READ_KERNEL(&ev.ino, &inode->i_ino) &&
      !CORE_READ_KERNEL(&sb, &inode->i_sb) && !CORE_READ_KERNEL(&dev, &sb->s_dev))
    ev.dev = dev;
  // The new image's first unknown PC must be reported at once, whatever
  // the old image reported.
  bpf_map_delete_elem(&unknown_pc_reports, &pid);
  // A process user space has no state of, running a program it has
  // loaded: nothing to tell (and a wakeup of user space saved, which
  // costs more than the rest of this program).
  struct file_key key = {.dev = ev.dev, .ino = ev.ino};
  if (ev.ino && !is_tracked(pid) && bpf_map_lookup_elem(&known_files, &key)) {
    increment_metric(METRIC_EXECS_UNTRACKED);
    return 0;
  }
  long err = emit_event(&ev, sizeof(ev), 1);
  increment_metric(err ? METRIC_ERR_PROCESS_EVENT_DROPPED : METRIC_PROCESS_EXECS);
  return 0;
}

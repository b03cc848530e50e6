// Maps and small helpers every program of the unwind chain shares.
#ifndef TRACEMGMT_H
#define TRACEMGMT_H

#include "types.h"

// Set by user space before load (read-only after): whether this kernel has
// bpf_task_pt_regs (5.15+). The verifier drops the branch not taken.
volatile const u32 have_task_pt_regs = 0;

// Set by user space before load: the fill level of the events ring buffer
// above which a record wakes the reader. Below it user space polls on a
// timer, so busy hosts do not pay one wake-up per sample.
volatile const u64 events_wakeup_bytes = 0;

// Set by user space before load: the least time between two unknown-PC
// reports for one process, in nanoseconds.
volatile const u64 unknown_pc_report_interval = 0;
// Set by user space before load: the most time a trace with runtime
// frames or an APM trace context waits in the events ring buffer, in
// nanoseconds. User space symbolizes runtime frames from the process's
// memory, which is gone once the process exits, and owes APM agents their
// correlation messages within the delay it announced.
volatile const u64 trace_wakeup_latency = 0;
// Off-CPU profiling (off_cpu.ebpf.c), set by user space when it is on: a
// switch-out is traced with probability off_cpu_threshold / 2^32 (2^32: all
// of them), at most off_cpu_per_second times a second per CPU, and its
// wait reported when it lasted at least off_cpu_min_ns.
volatile const u64 off_cpu_threshold = 0;
volatile const u64 off_cpu_per_second = 0;
volatile const u64 off_cpu_min_ns = 0;
// The daemon's own process, whose waits are left out: tracing them would
// feed back (each traced switch wakes the daemon to read it).
volatile const u32 off_cpu_self_pid = 0;
// log2 of the page size (vm_pgoff is in pages).
volatile const u32 page_shift = 12;

// Never read: it puts the shared enums and structs into the object's BTF,
// where user space reads their names, values and layouts.
volatile const struct btf_exports {
  enum frame_kind frame_kind;
  enum frame_flag frame_flag;
  enum trace_flag trace_flag;
  enum prog_id prog_id;
  enum metric_id metric_id;
  enum unwind_error unwind_error;
  enum event_type event_type;
  enum cfa_base cfa_base;
  enum delta_layout delta_layout;
  enum unwind_rule_flag unwind_rule_flag;
  enum runtime_id runtime_id;
  struct runtime_proc_key runtime_proc_key;
  struct runtime_proc runtime_proc;
  struct process_event process_event;
  struct exec_event exec_event;
  struct mmap_event mmap_event;
  struct unwind_rule unwind_rule;
  struct stack_delta stack_delta;
  struct delta_slot delta_slot;
  struct delta_page_key delta_page_key;
  struct delta_page delta_page;
  struct pid_mapping_key pid_mapping_key;
  struct pid_mapping pid_mapping;
  struct file_key file_key;
  struct known_file known_file;
  struct apm_proc apm_proc;
  enum apm_record_layout apm_record_layout;
  struct go_proc go_proc;
  struct thread_ctx_proc thread_ctx_proc;
  enum thread_ctx_layout thread_ctx_layout;
  struct label label;
  enum label_flag label_flag;
  struct off_cpu_end off_cpu_end;
} btf_exports __attribute__((used));

// The per-CPU scratch record a sample is built in.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct record);
} records SEC(".maps");

// Named counters, indexed by enum metric_id.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, METRIC_COUNT);
  __type(key, u32);
  __type(value, u64);
} metrics SEC(".maps");

// Per-runtime counters: RUNTIME_METRICS_MAX slots per enum runtime_id,
// indexed within by the runtime's enum <name>_metric.
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, RUNTIME_MAX *RUNTIME_METRICS_MAX);
  __type(key, u32);
  __type(value, u64);
} runtime_metrics SEC(".maps");

// Tail-call targets, indexed by enum prog_id and, for runtimes' unwinders,
// enum runtime_id; filled by user space.
struct {
  __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
  __uint(max_entries, RUNTIME_MAX);
  __type(key, u32);
  __type(value, u32);
} progs SEC(".maps");

// Per-process executable mappings: address -> (file, bias). Filled by user
// space from /proc/PID/maps.
struct {
  __uint(type, BPF_MAP_TYPE_LPM_TRIE);
  __uint(max_entries, 1 << 16);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct pid_mapping_key);
  __type(value, struct pid_mapping);
} pid_mappings SEC(".maps");

// Unwind rules, shared by all files; indexed by stack_delta.rule.
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1 << 14);
  __type(key, u32);
  __type(value, struct unwind_rule);
} unwind_rules SEC(".maps");

// The pool every file's deltas are allocated from: 4M deltas in 16 MiB,
// room for libLLVM (1M deltas), node (370k) and a JDK's VM library (190k) together
// with a host's usual libraries. User space maps it and writes a file's
// deltas as memory: updating libLLVM's 500k elements one by one took as
// long as extracting them.
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, (1 << 22) / DELTAS_PER_SLOT);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, u32);
  __type(value, struct delta_slot);
} stack_deltas SEC(".maps");

// (file, page) -> that page's run of deltas.
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1 << 16);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct delta_page_key);
  __type(value, struct delta_page);
} delta_pages SEC(".maps");

// Files whose deltas are loaded, by the kernel's name for them, for PCs the
// trie does not cover (see unwind_native_frames).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1 << 14);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, struct file_key);
  __type(value, struct known_file);
} known_files SEC(".maps");

// What each runtime's unwinder needs of each process that runs it
// (preallocated: kernels before 6.1 refuse other hash maps in perf_event
// programs).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, struct runtime_proc_key);
  __type(value, struct runtime_proc);
} runtime_procs SEC(".maps");

// Processes with an APM agent, by pid (preallocated, as runtime_procs).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, u32);
  __type(value, struct apm_proc);
} apm_procs SEC(".maps");

// Go programs whose goroutine labels are read, by pid (preallocated, as
// runtime_procs).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, u32);
  __type(value, struct go_proc);
} go_procs SEC(".maps");

// Processes with an OpenTelemetry thread context, by pid (preallocated, as
// runtime_procs).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, u32);
  __type(value, struct thread_ctx_proc);
} thread_ctx_procs SEC(".maps");

// When a trace last woke the events reader early (ktime ns), for
// trace_wakeup_latency.
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, u64);
} early_wakeups SEC(".maps");

// The processes user space keeps state for (it adds them before reading
// their mappings and removes them when it forgets them). Exec, exit and
// mapping events are sent only of these, and of execs of programs whose
// deltas are not loaded: a process user space never read (a shell
// command, a build step) is read at its first sample, if it has one, and
// costs user space nothing until then. Pid 0 is a switch: while it is
// absent or non-zero every process counts as tracked (BPF cannot unwind
// unread processes, or a pid did not fit).
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1 << 15);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, u32);
  __type(value, u8);
} tracked_pids SEC(".maps");

// When each process last had an unknown PC reported (ktime ns).
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 4096);
  __type(key, u32);
  __type(value, u64);
} unknown_pc_reports SEC(".maps");

// Finished traces and process events, in the order they happened. User
// space sizes it for the sampling rate before load.
struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 20);
} events SEC(".maps");

static __always_inline void increment_metric(u32 id)
{
  u64 *count = bpf_map_lookup_elem(&metrics, &id);
  if (count)
    *count += 1;
}

static __always_inline struct record *get_record(void)
{
  u32 zero = 0;
  struct record *r = bpf_map_lookup_elem(&records, &zero);
  if (!r)
    increment_metric(METRIC_ERR_RECORD_LOOKUP);
  return r;
}

// Appends a frame; returns -1 (and marks the trace truncated) when full.
static __always_inline int push_frame(struct trace *t, u8 kind, u8 flags, u64 file_id, u64 addr)
{
  u32 n = t->num_frames;
  if (n >= MAX_FRAMES) {
    t->flags |= TRACE_FLAG_TRUNCATED;
    return -1;
  }
  t->frames[n].file_id = file_id;
  t->frames[n].addr = addr;
  t->frames[n].kind = kind;
  t->frames[n].flags = flags;
  t->num_frames = n + 1;
  return 0;
}

// Emits a record on the events ring buffer; returns non-zero when it is
// full. The reader is woken when urgent or when the buffer fills up.
static __always_inline long emit_event(void *data, u64 size, int urgent)
{
  u64 flags = BPF_RB_NO_WAKEUP;
  if (urgent || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= events_wakeup_bytes)
    flags = BPF_RB_FORCE_WAKEUP;
  return bpf_ringbuf_output(&events, data, size, flags);
}

// Whether user space keeps state for pid (see tracked_pids).
static __always_inline int is_tracked(u32 pid)
{
  u32 all = 0;
  u8 *every = bpf_map_lookup_elem(&tracked_pids, &all);
  return !every || *every || bpf_map_lookup_elem(&tracked_pids, &pid);
}

// Emits a process event; returns non-zero (counted) when the buffer is full.
static __always_inline long emit_process_event(u32 type, u32 pid, u64 addr, u32 metric, int urgent)
{
  struct process_event ev = {.type = type, .pid = pid, .addr = addr};
  long err = emit_event(&ev, sizeof(ev), urgent);
  increment_metric(err ? METRIC_ERR_PROCESS_EVENT_DROPPED : metric);
  return err;
}

// Ends the unwind: hands the trace to unwind_stop.
static __always_inline int tail_call_stop(void *ctx)
{
  bpf_tail_call(ctx, &progs, PROG_UNWIND_STOP);
  increment_metric(METRIC_ERR_TAIL_CALL);
  return 0;
}

// Tells user space, at most once per unknown_pc_report_interval per
// process and at once, that pid needs a look: pc is in no mapping it
// loaded (a new process, or new code, whose mappings it should read, or a
// mapping it has not loaded yet), or, pc 0, a runtime's code runs where it
// has not described the runtime to BPF yet.
static __always_inline void report_unknown_pc(u32 pid, u64 pc)
{
  u64 now = bpf_ktime_get_ns();
  u64 *last = bpf_map_lookup_elem(&unknown_pc_reports, &pid);
  if (last && now - *last < unknown_pc_report_interval)
    return;
  if (emit_process_event(EVENT_UNKNOWN_PC, pid, pc, METRIC_UNKNOWN_PC_REPORTS, 1) == 0)
    bpf_map_update_elem(&unknown_pc_reports, &pid, &now, BPF_ANY);
}

// Hands the unwind to another program, within MAX_TAIL_CALLS: beyond it
// the trace ends with an abort frame. Returns only if the tail call
// failed (counted).
static __always_inline int tail_call_next(void *ctx, struct record *r, u32 prog)
{
  if (++r->state.tail_calls > MAX_TAIL_CALLS) {
    increment_metric(METRIC_ERR_TAIL_CALL_LIMIT);
    push_frame(&r->trace, FRAME_KIND_ABORT, 0, 0, UNWIND_ERROR_TAIL_CALL_LIMIT);
    return tail_call_stop(ctx);
  }
  bpf_tail_call(ctx, &progs, prog);
  increment_metric(METRIC_ERR_TAIL_CALL);
  return 0;
}

// The thread pointer of the current task (x86_64: the fs base; arm64:
// tpidr_el0), as the kernel saved it at the last switch to the task; 0 if
// it cannot be read. C libraries set it once, when creating the thread.
static __always_inline u64 thread_pointer(void)
{
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  u64 tp = 0;
  if (CORE_READ_KERNEL(&tp, &task->thread.TASK_THREAD_POINTER))
    return 0;
  return tp;
}

#if defined(__TARGET_ARCH_x86)
// The DTV pointer's place in glibc's tcbhead_t, from the thread pointer.
#  define TCB_DTV 8
#elif defined(__TARGET_ARCH_arm64)
#  define TCB_DTV 0
#endif

// The address of a module's TLS variable: offset into the block the
// thread's DTV lists for the module. Returns 0 when it cannot be read.
static __always_inline u64 tls_dtv_variable(u64 tp, u64 module, u64 offset)
{
  u64 dtv, block;
  if (!module || module > 0xffff ||
      bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + TCB_DTV)) || !dtv ||
      bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + 16 * module)) || !block ||
      block == (u64)-1)
    return 0;
  return block + offset;
}

// The address of a thread-local variable of the thread whose thread
// pointer is tp, as package tlsvar's Ref describes it: index 0, offset
// from the thread pointer (an executable's local-exec TLS); else, on
// x86_64, index is the GOT pair (tls_index) holding the module id the
// dynamic loader wrote, and offset the variable's in the module's block,
// which the thread's DTV (the word at the thread pointer + 8, glibc's
// tcbhead_t) lists at 16 * module id; on arm64, index is the TLS
// descriptor (entry, argument), whose argument the dynamic loader sets:
// the variable's offset from the thread pointer for a library loaded at
// start (static TLS), or a pointer to the module id and offset for one
// loaded later. index is a process address (load bias added). Returns 0
// when it cannot be read.
static __always_inline u64 tls_variable_address(u64 tp, u64 index, u64 offset)
{
  if (!index)
    return tp + offset;
#if defined(__TARGET_ARCH_arm64)
  // The descriptor's argument: 0 until the dynamic loader has relocated
  // it; a pointer to {module id, offset} for dynamic TLS, whose offset is
  // the variable's (a thread-pointer offset is small: never a readable
  // address); else the variable's offset from the thread pointer.
  u64 arg, dyn[2];
  if (bpf_probe_read_user(&arg, sizeof(arg), (void *)(index + 8)) || !arg)
    return 0;
  if (!bpf_probe_read_user(dyn, sizeof(dyn), (void *)arg) && dyn[1] == offset && dyn[0] &&
      dyn[0] < 0x10000)
    return tls_dtv_variable(tp, dyn[0], offset);
  return tp + arg;
#else
  u64 module;
  if (bpf_probe_read_user(&module, sizeof(module), (void *)index))
    return 0;
  return tls_dtv_variable(tp, module, offset);
#endif
}

// The return address of the interrupted function while it has no frame
// of its own (a leaf or stub that builds none, or one before its prologue
// or past its epilogue), and its caller's sp: at sp, popped by the return
// (x86_64); in the link register, sp unchanged (arm64). For the
// interrupted (top) frame only. Returns 0 when found.
static __always_inline int frameless_return(const struct unwind_state *state, u64 *ret,
                                            u64 *caller_sp)
{
#if defined(__TARGET_ARCH_x86)
  *caller_sp = state->sp + 8;
  return bpf_probe_read_user(ret, sizeof(*ret), (void *)state->sp);
#elif defined(__TARGET_ARCH_arm64)
  *caller_sp = state->sp;
  *ret = state->lr & USER_ADDRESS_MASK;
  return 0;
#endif
}

// Counts one event of a runtime: counter metric of its enum <name>_metric.
static __always_inline void increment_runtime_metric(u32 runtime, u32 metric)
{
  u32 id = runtime * RUNTIME_METRICS_MAX + metric;
  if (runtime >= RUNTIME_MAX || metric >= RUNTIME_METRICS_MAX)
    return;
  u64 *count = bpf_map_lookup_elem(&runtime_metrics, &id);
  if (count)
    *count += 1;
}

// The process the current task's process was forked from without an exec
// since (a pre-forking server's worker), which it
// shares its address space's layout with; 0 if none. After a fork the
// child's mm points at the parent's executable file object, an exec opens
// a new one.
static __always_inline u32 forked_from(void)
{
  struct task_struct *task = (struct task_struct *)bpf_get_current_task(), *parent;
  struct mm_struct *mm, *parent_mm;
  struct file *exe, *parent_exe;
  int tgid;
  if (CORE_READ_KERNEL(&parent, &task->real_parent) || !parent ||
      CORE_READ_KERNEL(&tgid, &parent->tgid) || tgid <= 1 || CORE_READ_KERNEL(&mm, &task->mm) ||
      !mm || CORE_READ_KERNEL(&parent_mm, &parent->mm) || !parent_mm ||
      CORE_READ_KERNEL(&exe, &mm->exe_file) || !exe ||
      CORE_READ_KERNEL(&parent_exe, &parent_mm->exe_file) || exe != parent_exe)
    return 0;
  return tgid;
}

// The configuration user space wrote for runtime in process pid, or NULL:
// a runtime's struct, cast from the generic room. A process user space has
// not described yet that was forked from one it has (the addresses in the
// configuration hold in both) gets its parent's: a new worker of a
// pre-forking server is unwound from its first sample.
static __always_inline const void *runtime_config(u32 pid, u32 runtime)
{
  struct runtime_proc_key key = {.pid = pid, .runtime = runtime};
  const void *config = bpf_map_lookup_elem(&runtime_procs, &key);
  if (config)
    return config;
  key.pid = forked_from();
  if (!key.pid)
    return 0;
  config = bpf_map_lookup_elem(&runtime_procs, &key);
  if (config)
    increment_metric(METRIC_RUNTIME_CONFIG_OF_PARENT);
  return config;
}

// Appends a frame of a runtime (its id is the frame's kind); same result
// as push_frame.
static __always_inline int push_runtime_frame(struct trace *t, u8 runtime, u64 file_id, u64 addr)
{
  t->flags |= TRACE_FLAG_RUNTIME_FRAMES;
  return push_frame(t, runtime, 0, file_id, addr);
}

// Reports the native frame a runtime's frames were to replace: it has
// none, or they could not be read. Same result as push_frame.
static __always_inline int runtime_report_native(const struct runtime_handoff *h, struct trace *t)
{
  return push_frame(t, FRAME_KIND_NATIVE, h->flags, h->file_id, h->addr);
}

// The runtime gives up for this sample: from here on the frames of its
// code are reported as native.
static __always_inline void runtime_give_up(struct unwind_state *state, u32 runtime)
{
  if (runtime < RUNTIME_MAX)
    state->handoff.done_mask |= 1u << runtime;
  if (state->inline_walk.runtime == runtime)
    state->inline_walk.runtime = 0;
}

// Whether a runtime still unwinds its code in this sample.
static __always_inline int runtime_active(const struct unwind_state *state, u32 runtime)
{
  return runtime && runtime < RUNTIME_MAX && !(state->handoff.done_mask & (1u << runtime));
}

// A runtime's code runs in a process user space has not described to its
// unwinder (yet): counted, and user space is told.
static __always_inline void runtime_missing(struct unwind_state *state, u32 pid, u32 runtime,
                                            u32 metric)
{
  increment_runtime_metric(runtime, metric);
  report_unknown_pc(pid, 0);
  runtime_give_up(state, runtime);
}

// Hands the unwind back from a runtime's unwinder: to the native unwinder,
// or to the end where the native unwind had ended at the handed-over
// frame.
static __always_inline int runtime_return(void *ctx, struct record *r)
{
  if (r->state.handoff.native_done)
    return tail_call_stop(ctx);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
}

// What a runtime's walk of one interpreter call (the frames one eval loop
// call runs) leaves to do.
enum runtime_walk {
  // The call's frames are reported: hand the unwind back (runtime_return).
  RUNTIME_WALK_DONE,
  // It has more frames than one program walks: walk on in the next one.
  RUNTIME_WALK_MORE,
  // The trace is full.
  RUNTIME_WALK_FULL,
};

// Ends a runtime's program whose walk is not done: the next program goes
// on with the call, or a full trace ends.
static __always_inline int runtime_walk_on(void *ctx, struct record *r, u32 runtime, int walk)
{
  if (walk == RUNTIME_WALK_MORE)
    return tail_call_next(ctx, r, runtime);
  increment_metric(METRIC_TRUNCATED_TRACES);
  return tail_call_stop(ctx);
}

// Reports the node of a runtime's linked frame list at an eval loop frame
// (struct inline_walk) and moves to its caller. A node that cannot be read
// ends the runtime's walk: its eval frames from here on are reported as
// native. Returns push_frame's result.
static __always_inline int inline_walk_step(struct unwind_state *state, struct trace *t)
{
  struct inline_walk *w = &state->inline_walk;
  u8 runtime = w->runtime;
  u64 node = w->node;
  if (!node) {
    increment_runtime_metric(runtime, w->metric_no_frame);
    return runtime_report_native(&state->handoff, t);
  }
  u64 id, next;
  s32 addr;
  if (bpf_probe_read_user(&id, sizeof(id), (void *)(node + w->id_off)) ||
      bpf_probe_read_user(&next, sizeof(next), (void *)(node + w->next_off)) ||
      bpf_probe_read_user(&addr, sizeof(addr), (void *)(node + w->addr_off))) {
    increment_runtime_metric(runtime, w->metric_read_error);
    runtime_give_up(state, runtime);
    return runtime_report_native(&state->handoff, t);
  }
  w->node = next;
  increment_runtime_metric(runtime, w->metric_frames);
  return push_runtime_frame(t, runtime, id, (u32)(addr * (s32)w->addr_scale));
}

#endif // TRACEMGMT_H

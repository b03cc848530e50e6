// Definitions BPF and user space share. This header is the single source of
// truth: the Go package support reads enum names and struct layouts from the
// BTF of the compiled object, and its tests check the Go mirrors against it.
#ifndef TYPES_H
#define TYPES_H

#include "bpfdefs.h"
#include "runtimes.h"

// Most frames one trace holds, kernel and user together (libpf.MaxFrames):
// an interpreted call can take three (the runtime's frame and two native
// frames of its interpreter), so 40 such calls already fill 128.
#define MAX_FRAMES 256
// Most kernel frames a trace holds: the kernel's perf_event_max_stack
// defaults to 127.
#define MAX_KERNEL_FRAMES 128

// User frames one run of the native unwinder walks before it tail-calls
// itself; with MAX_TAIL_CALLS this bounds a whole unwind. The end of an
// unwind takes two more tail calls (unwind_stop, read_context): 31 in all,
// within the kernel's limit (33; 32 before 5.17 by its own count).
#define NATIVE_FRAMES_PER_PROGRAM 16
#define MAX_TAIL_CALLS            29

// Stack deltas (package nativeunwind), laid out by user space per file: the
// deltas of each 64 KiB page of a file's addresses are a sorted run in the
// stack_deltas pool, found through delta_pages, so a lookup is one hash
// lookup and a binary search of at most DELTA_SEARCH_STEPS steps.
enum delta_layout {
  DELTA_PAGE_BITS = 16,
  // log2 of the most deltas a page can hold, plus one.
  DELTA_SEARCH_STEPS = DELTA_PAGE_BITS + 1,
  // Deltas per stack_deltas element (struct delta_slot): the kernel
  // stores array values in multiples of 8 bytes, so a lone 4-byte delta
  // would take twice its size.
  DELTAS_PER_SLOT = 2,
};

// How a frame's CFA is found (values of nativeunwind.CFABase).
enum cfa_base {
  CFA_UNKNOWN = 0,
  CFA_SP = 1,
  CFA_FP = 2,
  CFA_STOP = 3,
  CFA_SIGNAL = 4,
  CFA_PLT = 5,
  // Go's runtime.asmcgocall calling C on the system stack: CFA = the
  // goroutine's SP, which it saved on the system stack, + cfa_offset.
  CFA_GO_CGO = 6,
};

// Flags of an unwind rule.
enum unwind_rule_flag {
  // arm64: the saved return address is signed (pointer authentication):
  // strip the PAC bits before using it.
  UNWIND_RULE_RA_SIGNED = 1,
  // The CFA may lie below SP: the frame switched stacks (Go's systemstack
  // and asmcgocall run on the system stack while their frame pointer stays
  // on the goroutine's stack).
  UNWIND_RULE_STACK_SWITCH = 2,
};

// One unwind rule, shared by every delta that uses it.
struct unwind_rule {
  u8 cfa_base; // enum cfa_base
  u8 flags;    // enum unwind_rule_flag
  // Non-zero: the frame runs the eval loop of this runtime (enum
  // runtime_id; user space marks the loop's deltas), whose unwinder
  // reports the frames the loop runs in its place, after the step.
  u8 runtime;
  u8 pad;
  // CFA_SP, CFA_FP: added to the register. CFA_PLT: the offset in the
  // 16-byte entry from which on the stub has pushed (11, or 10 with IBT).
  s32 cfa_offset;
  // Where the caller's frame pointer is saved, relative to the CFA; 0 when
  // the register still holds it.
  s32 fp_offset;
  // Where the return address is saved, relative to the CFA; 0 when it is
  // still in the link register (arm64).
  s32 ra_offset;
};

// A delta: from addr_low (within its page) on, rule applies.
struct stack_delta {
  u16 addr_low;
  u16 rule;
};

// An element of the stack_deltas pool. Delta i of the pool is
// d[i % DELTAS_PER_SLOT] of element i / DELTAS_PER_SLOT.
struct delta_slot {
  struct stack_delta d[DELTAS_PER_SLOT];
};

struct delta_page_key {
  u64 file_id;
  u64 page; // file address >> DELTA_PAGE_BITS
};

// The run of a page's deltas in stack_deltas, by delta index (not element).
// Its first delta starts at the
// page's first address, so a lookup never needs the page before.
struct delta_page {
  u32 first;
  u32 count;
};

// Key of the per-process mapping trie: pid, then the address in big-endian
// so that prefixes of it are address ranges.
struct pid_mapping_key {
  u32 prefix_len;
  u32 pid;
  u64 addr_be;
};

// A mapped file: file address = process address - bias. file_id 0 with
// bias 0 is code user space knows without a file (JIT code a runtime
// claimed): its frames keep process addresses and unwind with frame
// pointers unless runtime is set.
struct pid_mapping {
  u64 file_id;
  u64 bias;
  // Non-zero: the code is this runtime's (enum runtime_id), whose
  // unwinder takes over at the PC.
  u8 runtime;
  u8 pad[7];
};

// A file as the kernel names it: its superblock's device number (kernel
// encoding, MAJOR << 20 | MINOR) and inode number.
struct file_key {
  u64 dev;
  u64 ino;
};

// A file whose deltas are loaded. A mapping of it at vm_start from page
// vm_pgoff puts file address a at a - vm_start + (vm_pgoff << PAGE_SHIFT)
// + vaddr_adjust: vaddr_adjust is p_vaddr - p_offset of its executable
// segment.
struct known_file {
  u64 file_id;
  s64 vaddr_adjust;
  // p_vaddr of the file's lowest executable segment: a process that runs
  // the file as its program has it at its mm's start_code, which gives the
  // bias without a VMA lookup (see resolve_vma).
  u64 text_vaddr;
};

// Kinds of frames (values of libpf.FrameKind). A runtime's frames have its
// enum runtime_id as their kind; what file_id and addr hold is the
// runtime's business.
enum frame_kind {
  FRAME_KIND_UNKNOWN = 0,
  FRAME_KIND_NATIVE = 1,
  FRAME_KIND_KERNEL = 2,
  FRAME_KIND_ABORT = 3,
};

// Per-frame flags of user frames. (Kernel frames carry none: all but the
// first are return addresses.)
enum frame_flag {
  // The address is a return address: it follows a call instruction.
  FRAME_FLAG_RETURN_ADDRESS = 1,
};

// Per-trace flags.
enum trace_flag {
  // The stack had more than MAX_FRAMES frames; the outermost were dropped.
  TRACE_FLAG_TRUNCATED = 1,
  // The thread was in an APM trace: struct trace's apm holds its ids.
  TRACE_FLAG_APM_CONTEXT = 2,
  // A runtime reported frames of its own, which user space symbolizes
  // from the process's memory.
  TRACE_FLAG_RUNTIME_FRAMES = 4,
  // The thread had more labels than MAX_LABELS: the others were left out.
  TRACE_FLAG_LABELS_CUT = 8,
  // The thread was in an OpenTelemetry span (OTEP 4947's thread context):
  // struct trace's apm holds its trace and span ids (no transaction id).
  TRACE_FLAG_SPAN_CONTEXT = 16,
  // Taken as the thread left the CPU to wait (off_cpu.ebpf.c), not by a
  // perf event: its ktime is when the wait began, and an EVENT_OFF_CPU_END
  // of the thread says how long it lasted.
  TRACE_FLAG_OFF_CPU = 32,
};

// Sample labels: key/value strings a program keeps for the work a thread
// does (a goroutine's pprof labels), read at sample time and sent after
// the trace's frames. Longer strings are cut to their room.
#define MAX_LABELS      10
#define LABEL_KEY_MAX   16
#define LABEL_VALUE_MAX 48

enum label_flag {
  LABEL_KEY_CUT = 1,
  LABEL_VALUE_CUT = 2,
  // The key is an index into the process's key table (OTEP 4947), in
  // key[0], which user space turns into its name.
  LABEL_KEY_INDEX = 4,
};

struct label {
  u8 key_len;
  u8 value_len;
  u8 flags; // enum label_flag
  u8 pad[5];
  char key[LABEL_KEY_MAX];
  char value[LABEL_VALUE_MAX];
};

// Where a process keeps its threads' OpenTelemetry thread context
// pointer (OTEP 4947's otel_thread_ctx_v1), by pid: as tls_variable_address
// takes it, or, when got_pair is set, tls_index is a general-dynamic GOT
// pair {module id, offset} (on arm64 too, where tls_variable_address takes
// descriptors).
struct thread_ctx_proc {
  u64 tls_index;
  u64 tls_offset;
  u8 got_pair;
  u8 pad[7];
};

// A thread context record (OTEP 4947), packed, in the process's byte
// order: trace id, span id, valid (1), trace flags, the size of the
// attributes that follow (entries of key index, length, value).
enum thread_ctx_layout {
  THREAD_CTX_TRACE_ID = 0,
  THREAD_CTX_SPAN_ID = 16,
  THREAD_CTX_VALID = 24,
  THREAD_CTX_ATTRS_SIZE = 26,
  THREAD_CTX_HEADER_SIZE = 28,
  // Attribute bytes read: the OTEP recommends records of at most 640
  // bytes.
  THREAD_CTX_MAX_ATTRS = 612,
};

// What BPF needs to read the goroutine labels of a Go program's threads,
// by pid (package processmanager/golabels finds it in the executable).
struct go_proc {
  // Where the running thread's g is: the thread pointer + tls_offset, or,
  // when g_in_register, x28 (arm64 programs without cgo).
  s64 tls_offset;
  // Offsets of g.m, m.curg and g.labels.
  u16 g_m;
  u16 m_curg;
  u16 g_labels;
  u8 g_in_register;
  // g.labels points to a map[string]string (Go 1.9-1.23); else to a
  // []struct{key, value string} (Go 1.24 on).
  u8 labels_map;
};

// What the APM agent of a process published, by pid (package tracecorr):
// the offset of its thread-local pointer to each thread's correlation
// record from the thread pointer.
struct apm_proc {
  s64 tls_offset;
};

// Key of runtime_procs: what runtime's unwinder needs of process pid.
struct runtime_proc_key {
  u32 pid;
  u32 runtime; // enum runtime_id
};

// A runtime's configuration for one process: its own struct (the
// runtime's <name>.ebpf.c), written by user space (package interpreter's
// Host.SetConfig).
struct runtime_proc {
  u8 data[RUNTIME_PROC_SIZE];
};

// A thread's correlation record, as the APM agent lays it out (the
// correlation spec's thread-local storage, layout minor version 1).
enum apm_record_layout {
  APM_RECORD_VALID = 2,
  APM_RECORD_TRACE_PRESENT = 3,
  APM_RECORD_IDS = 5,
  APM_RECORD_SIZE = 37,
};

// The ids of the APM trace a sample was taken in.
struct apm_context {
  u8 trace_id[16];
  u8 span_id[8];
  u8 transaction_id[8];
};

// Tail-call targets of the core, indices into the progs map. User space loads
// the program named after each value in lower case without the PROG_ prefix
// (PROG_UNWIND_NATIVE -> unwind_native). A runtime's unwinder,
// unwind_<name>, sits at its enum runtime_id, above these.
enum prog_id {
  PROG_UNWIND_STOP = 0,
  PROG_UNWIND_NATIVE = 1,
  // Optional: loaded only where bpf_find_vma works (native_stack.ebpf.c).
  PROG_RESOLVE_VMA = 2,
  // Optional: goroutine labels and thread contexts, read after unwind_stop
  // and before the trace is sent (unwind_stop.ebpf.c).
  PROG_READ_CONTEXT = 3,
  PROG_COUNT,
};

// Named counters, one slot each in the per-CPU metrics map. User space reports
// them under the lower-case name without the METRIC_ prefix.
enum metric_id {
  // Samples that started an unwind (not idle).
  METRIC_SAMPLES = 0,
  // Samples of the idle task, not unwound.
  METRIC_IDLE_SAMPLES,
  // Samples of kernel threads (kernel stack only).
  METRIC_KERNEL_THREAD_SAMPLES,
  // Traces handed to user space.
  METRIC_TRACES_SENT,
  // The per-CPU record could not be looked up.
  METRIC_ERR_RECORD_LOOKUP,
  // bpf_get_stack failed for the kernel stack.
  METRIC_ERR_KERNEL_STACK,
  // The user registers of a thread interrupted in the kernel could not be read.
  METRIC_ERR_USER_REGS,
  // User frames unwound with stack deltas.
  METRIC_DELTA_FRAMES,
  // User frames unwound with frame pointers (no delta covered the PC).
  METRIC_FP_FRAMES,
  // Frames whose CFA came from their frame record because the step before
  // followed frame pointers and left sp a lower bound (arm64).
  METRIC_CFA_FROM_FRAME_RECORD,
  // Unwinds that ended at a stop delta (thread or process entry point).
  METRIC_STOP_DELTAS,
  // The PC was in no mapping user space had loaded for the process.
  METRIC_ERR_NO_MAPPING,
  // Of those, resolved from the task's VMA of a file user space knows.
  METRIC_VMA_RESOLVED,
  // Samples that missed the trie in a process whose program's code was
  // then found from the task's mm.
  METRIC_EXE_RESOLVED,
  // bpf_find_vma failed: no VMA at the PC, or its lock was contended.
  METRIC_ERR_VMA_LOOKUP,
  // The VMA's file (or its absence: anonymous memory) is not known.
  METRIC_ERR_VMA_UNKNOWN_FILE,
  // Unknown-PC events sent to user space.
  METRIC_UNKNOWN_PC_REPORTS,
  // The PC's file has no deltas for its page.
  METRIC_ERR_NO_DELTAS,
  // The delta's rule could not be read or made no sense.
  METRIC_ERR_BAD_RULE,
  // Reading the return address, frame pointer or signal frame failed.
  METRIC_ERR_DELTA_READ,
  // The unwound stack pointer did not move towards the stack base.
  METRIC_ERR_SP_NOT_INCREASING,
  // Reading a frame record from the user stack failed.
  METRIC_ERR_FP_READ,
  // The frame pointer did not move towards the stack base.
  METRIC_ERR_FP_NOT_INCREASING,
  // The frame pointer was not 8-byte aligned.
  METRIC_ERR_FP_MISALIGNED,
  // Unwinds that ended because a trace reached MAX_FRAMES.
  METRIC_TRUNCATED_TRACES,
  // Unwinds that ran out of tail calls.
  METRIC_ERR_TAIL_CALL_LIMIT,
  // A tail call failed (program missing from the progs map).
  METRIC_ERR_TAIL_CALL,
  // The events ring buffer was full: the trace was dropped.
  METRIC_ERR_TRACE_DROPPED,
  // Process exits reported.
  METRIC_PROCESS_EXITS,
  // The thread group's live count could not be read at a thread's exit;
  // the exit counted as the process's only if the leader exited.
  METRIC_ERR_EXIT_GROUP_READ,
  // Process execs reported.
  METRIC_PROCESS_EXECS,
  // Executable file mappings reported.
  METRIC_EXEC_MAPPINGS,
  // A mapping's fields could not be read.
  METRIC_ERR_MMAP_READ,
  // The events ring buffer was full: a process event was dropped.
  METRIC_ERR_PROCESS_EVENT_DROPPED,
  // Samples of a thread that was in an APM trace.
  METRIC_APM_CONTEXTS,
  // An APM correlation record was being updated (valid = 0): ignored.
  METRIC_APM_RECORD_INVALID,
  // An APM correlation record could not be read.
  METRIC_ERR_APM_READ,
  // Execs of a program whose deltas are loaded, and exits, of processes
  // user space keeps no state for: not sent.
  METRIC_EXECS_UNTRACKED,
  METRIC_EXITS_UNTRACKED,
  // A runtime's unwinder ran on its configuration for the process the
  // sampled one was forked from: user space had not described the child.
  METRIC_RUNTIME_CONFIG_OF_PARENT,
  // Samples of a goroutine with labels.
  METRIC_GO_LABELS,
  // The way from the thread's g to its goroutine's labels could not be
  // read, or led somewhere else (g.m.curg.m is not g.m).
  METRIC_ERR_GO_LABELS_READ,
  // A goroutine's labels were more than MAX_LABELS or longer than their
  // room: cut (the trace and labels say which).
  METRIC_GO_LABELS_CUT,
  // Samples of a thread in an OpenTelemetry span (OTEP 4947).
  METRIC_SPAN_CONTEXTS,
  // A thread context pointer or record could not be read.
  METRIC_ERR_THREAD_CTX_READ,
  // A thread context record was not valid (being written, or detached).
  METRIC_THREAD_CTX_INVALID,
  // Context switches seen while off-CPU profiling is on: a thread left the
  // CPU to wait (not preempted; the idle task's and kernel threads' are
  // not counted).
  METRIC_OFF_CPU_SWITCHES,
  // Switch-outs left out by off_cpu_threshold, and by the per-CPU budget
  // of off-CPU unwinds (off_cpu_per_second).
  METRIC_OFF_CPU_SAMPLED_OUT,
  METRIC_OFF_CPU_OVER_BUDGET,
  // Switch-outs whose stack was unwound.
  METRIC_OFF_CPU_TRACES,
  // Waits of a traced switch-out that ended: reported, or shorter than
  // off_cpu_min_ns (sent, for user space to drop their trace).
  METRIC_OFF_CPU_ENDS,
  METRIC_OFF_CPU_SHORT,
  // The events ring buffer was full: a wait's end was dropped.
  METRIC_ERR_OFF_CPU_END_DROPPED,
  METRIC_COUNT,
};

// Error codes carried by FRAME_KIND_ABORT frames where an unwinder gave up.
enum unwind_error {
  UNWIND_ERROR_NONE = 0,
  UNWIND_ERROR_FP_READ = 1,
  UNWIND_ERROR_FP_NOT_INCREASING = 2,
  UNWIND_ERROR_FP_MISALIGNED = 3,
  UNWIND_ERROR_TAIL_CALL_LIMIT = 4,
  UNWIND_ERROR_USER_REGS = 5,
  // A runtime's unwinder found no caller of a frame it reported.
  UNWIND_ERROR_RUNTIME_CALLER = 6,
};

struct frame {
  // Low 64 bits of the file id when the unwinder resolved the address to a
  // file; 0 when addr is a process address.
  u64 file_id;
  // Process or file-relative address; for FRAME_KIND_ABORT an unwind_error.
  u64 addr;
  u8 kind;  // enum frame_kind
  u8 flags; // enum frame_flag
  u8 pad[6];
};

// Records on the events ring buffer start with a u32 event_type, so traces
// and process events arrive in one order.
enum event_type {
  EVENT_TRACE = 1,
  EVENT_PROCESS_EXIT = 2,
  // The process replaced its image: its mappings are all new.
  EVENT_PROCESS_EXEC = 3,
  // A PC of the process was in no mapping user space had loaded: new
  // process or new code (dlopen). Rate-limited per process.
  EVENT_UNKNOWN_PC = 4,
  // A process mapped a file executable (struct mmap_event): user space
  // adds the mapping without reading /proc/PID/maps, usually before the
  // code runs, so even a process that lives for milliseconds unwinds.
  EVENT_EXEC_MAPPED = 5,
  // A thread whose switch-out was traced (TRACE_FLAG_OFF_CPU) ran again
  // after waiting at least off_cpu_min_ns (struct off_cpu_end).
  EVENT_OFF_CPU_END = 6,
};

// A trace as handed to user space: the header, then num_frames frames (kernel
// frames first, leaf first; then user frames, leaf first), then num_labels
// labels. Only the used part of frames is sent.
struct trace {
  u32 type; // EVENT_TRACE
  u32 pid;
  u32 tid;
  u32 cpu;
  u64 ktime;
  u64 hash;
  char comm[16];
  u32 flags; // enum trace_flag
  u32 num_kernel_frames;
  u32 num_frames;
  // Labels (struct label) that follow the frames.
  u32 num_labels;
  // Set with TRACE_FLAG_APM_CONTEXT; not part of the hash: the same stack
  // in two transactions is one trace.
  struct apm_context apm;
  struct frame frames[MAX_FRAMES];
};

// Where a runtime's unwinder took over from the native unwinder in a
// sample, and what it leaves to it.
struct runtime_handoff {
  // The native frame the runtime's frames replace (its eval loop's, or the
  // JIT code's at the PC), reported instead when it has none.
  u64 file_id;
  u64 addr;
  // The CFA of the eval loop's frame, after the native step past it.
  u64 cfa;
  u8 flags;
  // The runtime (enum runtime_id).
  u8 runtime;
  // The native unwind ended at this frame.
  u8 native_done;
  u8 pad;
  // Runtimes that gave up for this sample (1 << id): frames of their code
  // are reported as native.
  u32 done_mask;
};

// A runtime whose frames form a linked list, one per call of its eval loop
// (an interpreter that runs one frame object per call), lets the native unwinder report them itself
// at each eval loop frame, without spending two tail calls on each.
struct inline_walk {
  // The next node to report; 0 when none are left.
  u64 node;
  // Offsets in a node: its caller's node, the frame's file_id (a pointer)
  // and its addr (an s32 multiplied by addr_scale, reported as a u32).
  u16 next_off;
  u16 id_off;
  u16 addr_off;
  u8 addr_scale;
  // The runtime whose eval loop frames it reports; 0 when not walking.
  u8 runtime;
  // The runtime's counters (its enum <name>_metric) for frames reported,
  // for an eval loop frame with no node left, and for nodes that could not
  // be read.
  u8 metric_frames;
  u8 metric_no_frame;
  u8 metric_read_error;
  u8 pad[5];
};

// [start, end) of a process maps mapping.
struct resolved_range {
  u64 start;
  u64 end;
  struct pid_mapping mapping;
};

// Where the native unwinder is on the user stack.
struct unwind_state {
  u64 pc;
  u64 sp;
  u64 fp;
  // The link register (arm64): the return address of a leaf frame.
  u64 lr;
  // The user registers at the interrupt. Interpreters keep their current
  // bytecode in some (which, per architecture, each runtime's unwinder
  // says), and read them for the top frame, whose stack slots are stale.
  struct pt_regs user_regs;
  u32 tail_calls;
  // Set once pc is a return address rather than the interrupted pc.
  u32 return_address;
  // What resolve_vma resolved for PCs outside the trie: the range the
  // loop checks (vma, end 0 when unset), the program's own code (exe, from
  // the task's mm once exe_read) and the one VMA bpf_find_vma found (lib,
  // once lib_looked). vma_pc is the PC resolve_vma is asked about,
  // vma_tried set once it could not resolve one.
  struct resolved_range vma;
  struct resolved_range exe;
  struct resolved_range lib;
  u64 vma_pc;
  u32 vma_tried;
  u8 exe_read;
  u8 lib_looked;
  // The sp the last frame-pointer step set (arm64), 0 if none. While sp
  // still equals it, it is only a lower bound of the caller's sp (see
  // step_frame_pointer).
  u64 fp_step_sp;
  struct runtime_handoff handoff;
  struct inline_walk inline_walk;
};

// The per-CPU scratch record a sample is built in across tail calls.
struct record {
  struct unwind_state state;
  u64 kernel_stack[MAX_KERNEL_FRAMES];
  struct trace trace;
  // Room for the labels written after the last frame of a full trace.
  struct label labels_room[MAX_LABELS];
};

// EVENT_OFF_CPU_END: thread tid of process pid waited duration ns from
// start (CLOCK_MONOTONIC ns, the ktime of its off-CPU trace).
struct off_cpu_end {
  u32 type; // EVENT_OFF_CPU_END
  u32 pid;
  u32 tid;
  u32 pad;
  u64 start;
  u64 duration;
};

// A traced switch-out waiting for its thread to run again, by tid.
struct off_cpu_start {
  u64 ktime;
  u32 pid;
  u32 pad;
};

// A CPU's budget of off-CPU unwinds: used of off_cpu_per_second in the
// second that began at window (ktime ns).
struct off_cpu_budget {
  u64 window;
  u64 used;
};

// A process event (EVENT_PROCESS_EXIT, EVENT_UNKNOWN_PC).
struct process_event {
  u32 type; // enum event_type
  u32 pid;
  // EVENT_UNKNOWN_PC: the PC (0 when a runtime's code ran undescribed).
  u64 addr;
};

// EVENT_PROCESS_EXEC: process pid now runs the program file (dev, ino), dev
// in the kernel's encoding (0 when unreadable).
struct exec_event {
  u32 type;
  u32 pid;
  u64 dev;
  u64 ino;
};

// EVENT_EXEC_MAPPED: [start, end) of process pid maps the file (dev, ino)
// from page pgoff on. dev is in the kernel's encoding (MAJOR << 20 | MINOR).
struct mmap_event {
  u32 type;
  u32 pid;
  u64 start;
  u64 end;
  u64 pgoff;
  u64 dev;
  u64 ino;
};

#endif // TYPES_H

// The BEAM (Erlang/OTP JIT) unwinder (runtime RUNTIME_BEAM). User space
// claims the JIT's executable mapping; the native unwinder hands over at a
// PC in it: the interrupted PC (JIT code runs) or the first return address
// into JIT code after C frames (a BIF, a NIF, an emulator helper).
//
// Erlang frames keep no frame pointer by default (x86_64 and arm64): the
// process's Erlang stack holds, between E (its top) and c_p->hend, Y
// registers (tagged terms, never primary tag 00) and continuation pointers
// (CPs: return addresses into JIT code, 4-aligned; internals.md §3). The
// walk reports the PC, then every word of the stack that is 4-aligned and
// inside the JIT mapping, as a BEAM frame {file_id 0, addr pc}. A
// frameless tail-recursive leaf keeps its caller's CP at [E], which the
// walk reports like any other.
//
// Where E and c_p are (internals.md §2, from the JIT's register block in
// beam_asm.hpp): in JIT code, x86_64 E = rsp, c_p = r13; arm64 E = x20,
// c_p = x21. From C code called from JIT code, c_p is the current process
// of the thread's scheduler: its ErtsSchedulerData (esdp), which the
// thread keeps under a pthread key (erts_get_scheduler_data() in
// erl_process.c), names it. Failing that (the C library's layout
// unknown): on x86_64, the JIT frame's sp is the scheduler's runtime
// stack, the start of its ErtsSchedulerRegisters on the scheduler's C
// stack; the function that holds them keeps a structure a little above
// them that names both the registers and the current process; then c_p's
// register when the C code left it alone (r13/x21 are callee-saved). E
// is c_p->stop, which
// the JIT stored before calling C code that may touch the stack, or the
// JIT frame's rbp, where the JIT keeps E for calls that do not. A process
// found neither way is not unwound (counted: METRIC_ERR_BEAM_NO_PROCESS).
//
// The Erlang stack ends the trace: on x86_64 JIT code runs on it (rsp =
// E), so the scheduler's C frames below it are not reached.
//
// Dirty schedulers run C code only (dirty NIFs, major garbage
// collections): user space claims their thread functions as the binary's
// code ranges, and the native unwinder hands over after stepping past
// one. The process the scheduler runs is, as above, its
// ErtsSchedulerData's current_process.
#include "tracemgmt.h"

// What the BEAM unwinder needs of a process (its entry in runtime_procs).
struct beam_proc {
  // The JIT's executable mapping: [code_lo, code_hi).
  u64 code_lo;
  u64 code_hi;
  // Byte offsets in struct process (erl_process.h) of htop, stop (E as
  // saved when the process leaves JIT code), heap and hend (the end of
  // the stack).
  u16 proc_htop;
  u16 proc_stop;
  u16 proc_heap;
  u16 proc_hend;
  // Byte offsets in ErtsSchedulerData of its registers and its current
  // process (x86_64).
  u16 esdp_registers;
  u16 esdp_current;
  // Where, above the registers, the scheduler's C stack holds esdp:
  // [registers + esdp_scan_lo, + BEAM_ESDP_SCAN_WORDS words).
  u16 esdp_scan_lo;
  // Dirty schedulers (internals.md §7): byte offsets of current_process
  // in ErtsSchedulerData and of i (the address the process resumes at)
  // in struct process.
  u16 dirty_current;
  u16 proc_i;
  u16 pad0[3];
  // The address of the pthread key under which each scheduler thread
  // keeps its ErtsSchedulerData (0: dirty schedulers not unwound), and
  // where the C library keeps the thread's value of a key below
  // tsd_max_key, from the thread pointer tp (interpreter/libc):
  //   base = tsd_self_deref ? *(tp + tsd_self_offset) : tp
  //   block = base + tsd_block_offset, then *block if tsd_block_deref
  //   esdp = *(block + key * tsd_entry_size + tsd_data_offset)
  u64 sched_key_addr;
  s64 tsd_self_offset;
  s64 tsd_block_offset;
  s64 tsd_data_offset;
  u32 tsd_entry_size;
  u32 tsd_max_key;
  u8 tsd_self_deref;
  u8 tsd_block_deref;
  u8 pad[6];
};
_Static_assert(sizeof(struct beam_proc) <= RUNTIME_PROC_SIZE, "beam_proc too large");

// The runtime's counters (runtime_metrics).
enum beam_metric {
  // PCs of JIT code reported (the interrupted PC or the first return
  // address into JIT code after C frames).
  METRIC_BEAM_PCS,
  // Continuation pointers found on Erlang stacks and reported.
  METRIC_BEAM_CPS,
  // JIT code of a process user space has not described (yet).
  METRIC_ERR_BEAM_NO_PROC,
  // No current process in the registers (C code that reused them): the
  // sample has its native frames and the JIT PC only.
  METRIC_ERR_BEAM_NO_PROCESS,
  // A read of the process's memory failed: the walk ends.
  METRIC_ERR_BEAM_READ,
  // An Erlang stack longer than the walk reads (BEAM_WORDS_PER_PROGRAM
  // per tail call, within the trace's tail call budget): the trace ends
  // with the frames found.
  METRIC_ERR_BEAM_STACK_TOO_DEEP,
  // Samples of dirty scheduler threads handed over at their thread
  // function, and those among them running a process.
  METRIC_BEAM_DIRTY,
  METRIC_BEAM_DIRTY_PROCESS,
  // A scheduler thread's scheduler data could not be read.
  METRIC_ERR_BEAM_SCHED_DATA,
  METRIC_BEAM_COUNT,
};
_Static_assert(METRIC_BEAM_COUNT <= RUNTIME_METRICS_MAX, "too many beam metrics");

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct beam_btf_exports {
  struct beam_proc beam_proc;
  enum beam_metric beam_metric;
} beam_btf_exports __attribute__((used));

// The JIT's registers for E and c_p (internals.md §2).
#if defined(__TARGET_ARCH_x86)
#  define BEAM_E(r)   ((r)->sp)
#  define BEAM_C_P(r) ((r)->r13)
#elif defined(__TARGET_ARCH_arm64)
#  define BEAM_E(r)   ((r)->regs[20])
#  define BEAM_C_P(r) ((r)->regs[21])
#endif

// Stack words read at once, and chunks of them one run of the program
// reads before it tail-calls itself.
#define BEAM_CHUNK_WORDS        16
#define BEAM_CHUNKS_PER_PROGRAM 8

// An Erlang stack is at most this long (bytes) for the walk; a longer
// range between E and hend is garbage.
#define BEAM_MAX_STACK (1ULL << 32)

// Whether w is a CP: a 4-aligned address in the JIT code.
static __always_inline int beam_is_cp(const struct beam_proc *p, u64 w)
{
  return (w & 3) == 0 && w >= p->code_lo && w < p->code_hi;
}

// Words above the registers searched for esdp, read at once.
#define BEAM_ESDP_SCAN_WORDS 32

// The current process of the scheduler whose ErtsSchedulerRegisters are at
// regs (x86_64: the sp of JIT code after C frames), or 0: esdp is the word
// above them that points at a scheduler's data naming these registers.
static __always_inline u64 beam_current_process(const struct beam_proc *p, u64 regs)
{
#if defined(__TARGET_ARCH_x86)
  u64 words[BEAM_ESDP_SCAN_WORDS];
  if (!p->esdp_scan_lo ||
      bpf_probe_read_user(words, sizeof(words), (void *)(regs + p->esdp_scan_lo)))
    return 0;
  for (u32 i = 0; i < BEAM_ESDP_SCAN_WORDS; i++) {
    u64 esdp = words[i], named, c_p;
    if (esdp < MIN_CODE_ADDRESS || (esdp & 7) ||
        bpf_probe_read_user(&named, sizeof(named), (void *)(esdp + p->esdp_registers)) ||
        named != regs)
      continue;
    if (bpf_probe_read_user(&c_p, sizeof(c_p), (void *)(esdp + p->esdp_current)))
      return 0;
    return c_p;
  }
#endif
  return 0;
}

// The process the scheduler on this thread (normal or dirty) runs, or 0
// (none, not configured, or its scheduler data unreadable: counted):
// ErtsSchedulerData's current_process, the scheduler data found as
// erts_get_scheduler_data() finds it, under its pthread key.
static __always_inline u64 beam_sched_process(const struct beam_proc *p)
{
  if (!p->sched_key_addr)
    return 0;
  u64 tp = thread_pointer(), base = tp, block, esdp, c_p;
  u32 key;
  if (!tp || bpf_probe_read_user(&key, sizeof(key), (void *)p->sched_key_addr) ||
      key >= p->tsd_max_key)
    goto fail;
  if (p->tsd_self_deref &&
      bpf_probe_read_user(&base, sizeof(base), (void *)(tp + p->tsd_self_offset)))
    goto fail;
  block = base + p->tsd_block_offset;
  if (p->tsd_block_deref && bpf_probe_read_user(&block, sizeof(block), (void *)block))
    goto fail;
  block += (u64)key * p->tsd_entry_size + p->tsd_data_offset;
  if (bpf_probe_read_user(&esdp, sizeof(esdp), (void *)block) || esdp < MIN_CODE_ADDRESS ||
      bpf_probe_read_user(&c_p, sizeof(c_p), (void *)(esdp + p->dirty_current)))
    goto fail;
  return c_p;
fail:
  increment_runtime_metric(RUNTIME_BEAM, METRIC_ERR_BEAM_SCHED_DATA);
  return 0;
}

// A process's stack bounds: the heap and the stack share one block, heap
// up from heap to htop, stack down from hend. Returns 0 when c_p looks like one.
static __always_inline int beam_process(const struct beam_proc *p, u64 c_p, u64 *htop, u64 *stop,
                                        u64 *heap, u64 *hend)
{
  if (c_p < MIN_CODE_ADDRESS || (c_p & 7) ||
      bpf_probe_read_user(htop, sizeof(*htop), (void *)(c_p + p->proc_htop)) ||
      bpf_probe_read_user(stop, sizeof(*stop), (void *)(c_p + p->proc_stop)) ||
      bpf_probe_read_user(heap, sizeof(*heap), (void *)(c_p + p->proc_heap)) ||
      bpf_probe_read_user(hend, sizeof(*hend), (void *)(c_p + p->proc_hend)))
    return -1;
  if (*heap > *htop || *htop > *hend || *hend - *heap > BEAM_MAX_STACK || (*hend & 7) ||
      (*heap & 7))
    return -1;
  return 0;
}

// Whether e is a stack top of the process: 8-aligned in its block.
static __always_inline int beam_in_stack(u64 e, u64 heap, u64 hend)
{
  return e >= heap && e <= hend && !(e & 7);
}

// Finds the process's Erlang stack [*e, *end): from the JIT's registers
// at the PC, or, from C code, from the scheduler's current process.
// Returns 0 when found.
static __always_inline int beam_stack(const struct beam_proc *p, const struct unwind_state *state,
                                      u64 *e, u64 *end)
{
  u64 htop, stop, heap, hend;
  // The last word of every stack is a CP into the JIT's normal-exit code,
  // which no Erlang function called: not reported.
  if (!state->return_address) {
    u64 top = BEAM_E(&state->user_regs);
    if (beam_process(p, BEAM_C_P(&state->user_regs), &htop, &stop, &heap, &hend) ||
        !beam_in_stack(top, htop, hend))
      return -1;
    *e = top;
    *end = hend - 8;
    return 0;
  }
  u64 c_p = beam_sched_process(p);
  if (!c_p)
    c_p = beam_current_process(p, state->sp);
  if (!c_p)
    c_p = BEAM_C_P(&state->user_regs);
  if (beam_process(p, c_p, &htop, &stop, &heap, &hend))
    return -1;
#if defined(__TARGET_ARCH_x86)
  // E kept in rbp (E_saved) for a call that does not touch the stack.
  if (beam_in_stack(state->fp, htop, hend)) {
    *e = state->fp;
    *end = hend - 8;
    return 0;
  }
#endif
  if (!beam_in_stack(stop, htop, hend))
    return -1;
  *e = stop;
  *end = hend - 8;
  return 0;
}

// A dirty scheduler thread, handed over after its thread function's frame
// (the binary's code range): that frame stays native, then the process
// the scheduler runs, if any: its current function from c_p->i, its
// callers from its saved stack, c_p->stop (the process is off its normal
// scheduler: no JIT register holds anything of it). Returns 0 when the
// walk of the stack is to follow from *e to *end.
static __always_inline int beam_dirty(const struct beam_proc *p, struct unwind_state *state,
                                      struct trace *t, u64 *e, u64 *end)
{
  increment_runtime_metric(RUNTIME_BEAM, METRIC_BEAM_DIRTY);
  if (runtime_report_native(&state->handoff, t))
    return -1;
  u64 c_p = beam_sched_process(p), i, htop, stop, heap, hend;
  if (!c_p || beam_process(p, c_p, &htop, &stop, &heap, &hend) ||
      !beam_in_stack(stop, htop, hend) ||
      bpf_probe_read_user(&i, sizeof(i), (void *)(c_p + p->proc_i)))
    return -1;
  increment_runtime_metric(RUNTIME_BEAM, METRIC_BEAM_DIRTY_PROCESS);
  t->flags |= TRACE_FLAG_RUNTIME_FRAMES;
  if (i >= p->code_lo && i < p->code_hi && push_frame(t, RUNTIME_BEAM, 0, 0, i))
    return -1;
  *e = stop;
  *end = hend - 8;
  return 0;
}

SEC("perf_event")
int unwind_beam(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;
  const struct beam_proc *p = runtime_config(t->pid, RUNTIME_BEAM);
  if (!p) {
    // Nothing says how to step past JIT code: the frame stays native and
    // the unwind ends.
    runtime_missing(state, t->pid, RUNTIME_BEAM, METRIC_ERR_BEAM_NO_PROC);
    runtime_report_native(&state->handoff, t);
    return tail_call_stop(ctx);
  }
  // The walk goes on across tail calls with pc 0: sp is the next word to
  // read, fp the end of the stack.
  if (state->pc && state->handoff.file_id) {
    // The only code of a file the runtime claims: a dirty scheduler's
    // thread function. The thread's frames below it (the C library's
    // thread start) are not walked.
    u64 e, end;
    if (beam_dirty(p, state, t, &e, &end))
      return tail_call_stop(ctx);
    state->pc = 0;
    state->sp = e;
    state->fp = end;
  } else if (state->pc) {
    t->flags |= TRACE_FLAG_RUNTIME_FRAMES;
    increment_runtime_metric(RUNTIME_BEAM, METRIC_BEAM_PCS);
    if (push_frame(t, RUNTIME_BEAM, state->return_address ? FRAME_FLAG_RETURN_ADDRESS : 0, 0,
                   state->pc))
      goto full;
    u64 e, end;
    if (beam_stack(p, state, &e, &end)) {
      increment_runtime_metric(RUNTIME_BEAM, METRIC_ERR_BEAM_NO_PROCESS);
      return tail_call_stop(ctx);
    }
    state->pc = 0;
    state->sp = e;
    state->fp = end;
  }
  u64 words[BEAM_CHUNK_WORDS];
  for (int c = 0; c < BEAM_CHUNKS_PER_PROGRAM; c++) {
    u64 at = state->sp, end = state->fp;
    if (at >= end)
      return tail_call_stop(ctx);
    u64 n = (end - at) / 8;
    if (n >= BEAM_CHUNK_WORDS) {
      n = BEAM_CHUNK_WORDS;
      if (bpf_probe_read_user(words, sizeof(words), (void *)at))
        goto read_error;
    } else {
      // The last words: read the chunk that ends at the stack's end.
      if (end - at < 8 || end < sizeof(words) ||
          bpf_probe_read_user(words, sizeof(words), (void *)(end - sizeof(words))))
        goto read_error;
    }
    u32 first = BEAM_CHUNK_WORDS - n;
    for (u32 i = 0; i < BEAM_CHUNK_WORDS; i++) {
      if (i < first || !beam_is_cp(p, words[i]))
        continue;
      increment_runtime_metric(RUNTIME_BEAM, METRIC_BEAM_CPS);
      if (push_frame(t, RUNTIME_BEAM, FRAME_FLAG_RETURN_ADDRESS, 0, words[i]))
        goto full;
    }
    state->sp = at + n * 8;
  }
  if (state->tail_calls + 1 >= MAX_TAIL_CALLS) {
    increment_runtime_metric(RUNTIME_BEAM, METRIC_ERR_BEAM_STACK_TOO_DEEP);
    return tail_call_stop(ctx);
  }
  return tail_call_next(ctx, r, RUNTIME_BEAM);

read_error:
  increment_runtime_metric(RUNTIME_BEAM, METRIC_ERR_BEAM_READ);
  return tail_call_stop(ctx);
full:
  increment_metric(METRIC_TRUNCATED_TRACES);
  return tail_call_stop(ctx);
}

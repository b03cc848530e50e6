// The native unwinder. For each frame it looks up the stack delta user space
// extracted from the PC's file (package nativeunwind) and applies its rule;
// where no delta covers the PC it follows the frame-pointer chain. A
// runtime's unwinder takes over by tail call where the mapping (JIT code)
// or the rule (an eval loop) names the runtime; the core names none.
#include "tracemgmt.h"

// Addresses below this are never code: a zero or tiny return address ends
// the walk (the outermost frame).
#define MIN_CODE_ADDRESS 0x1000

// Steps from the frame at state->fp to its caller. Returns 0 to go on, 1 when
// the walk ended normally, -1 on an error (already counted).
static __always_inline int step_frame_pointer(struct unwind_state *state)
{
  if (state->fp == 0)
    return 1;
  if (state->fp & 7) {
    increment_metric(METRIC_ERR_FP_MISALIGNED);
    return -1;
  }
  if (state->fp < state->sp) {
    increment_metric(METRIC_ERR_FP_NOT_INCREASING);
    return -1;
  }
  u64 record[2];
  if (bpf_probe_read_user(record, sizeof(record), (void *)state->fp)) {
    increment_metric(METRIC_ERR_FP_READ);
    return -1;
  }
  // A frame record's return address is signed where the code signs it
  // (arm64 pointer authentication): the PAC bits go.
  u64 ra = record[1] & USER_ADDRESS_MASK;
  if (ra < MIN_CODE_ADDRESS)
    return 1;
  state->sp = state->fp + sizeof(record);
  state->fp = record[0];
  state->pc = ra;
  state->return_address = 1;
#if defined(__TARGET_ARCH_arm64)
  // An arm64 frame record need not be at the top of its frame: GCC
  // stores x29 and x30 at the bottom, below the callee-saved registers
  // (Debian glibc 2.36's __libc_start_call_main: stp x29, x30, [sp, #-272]!),
  // so the caller's sp may be above fp + 16. step_delta corrects it
  // where the caller keeps a frame record.
  state->fp_step_sp = state->sp;
#endif
  return 0;
}

// The mapping of pc in process pid, or NULL.
static __always_inline struct pid_mapping *find_mapping(u32 pid, u64 pc)
{
  struct pid_mapping_key key = {
    .prefix_len = 8 * (sizeof(key) - sizeof(key.prefix_len)),
    .pid = pid,
    .addr_be = __builtin_bswap64(pc),
  };
  return bpf_map_lookup_elem(&pid_mappings, &key);
}

// What resolve_vma finds out about the VMA holding a PC.
struct vma_lookup {
  u64 start;
  u64 end;
  u64 file_id;
  u64 bias;
};

// bpf_find_vma's callback: the VMA's file, if user space loaded its deltas,
// and the bias of this mapping of it.
static long vma_callback(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
  struct vma_lookup *l = data;
  l->start = vma->vm_start;
  l->end = vma->vm_end;
  struct file *f = vma->vm_file;
  if (!f)
    return 0;
  struct file_key key = {.dev = f->f_inode->i_sb->s_dev, .ino = f->f_inode->i_ino};
  struct known_file *k = bpf_map_lookup_elem(&known_files, &key);
  if (!k)
    return 0;
  l->file_id = k->file_id;
  l->bias = vma->vm_start - (vma->vm_pgoff << page_shift) - k->vaddr_adjust;
  return 0;
}

// Where the program's own code is and which loaded file it is, from the
// task's mm: no VMA lookup, so the sample's one bpf_find_vma stays for a
// library. User space reads a new process only when it is first sampled,
// and its first samples unwind the program and one library this way.
static __always_inline void read_exe(struct unwind_state *state)
{
  state->exe_read = 1;
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  struct mm_struct *mm;
  struct file *f;
  struct inode *inode;
  struct super_block *sb;
  u64 start, end;
  u32 dev;
  struct file_key key;
  __builtin_memset(&key, 0, sizeof(key));
  if (CORE_READ_KERNEL(&mm, &task->mm) || !mm || CORE_READ_KERNEL(&start, &mm->start_code) ||
      CORE_READ_KERNEL(&end, &mm->end_code) || CORE_READ_KERNEL(&f, &mm->exe_file) || !f ||
      CORE_READ_KERNEL(&inode, &f->f_inode) || CORE_READ_KERNEL(&key.ino, &inode->i_ino) ||
      CORE_READ_KERNEL(&sb, &inode->i_sb) || CORE_READ_KERNEL(&dev, &sb->s_dev))
    return;
  key.dev = dev;
  struct known_file *k = bpf_map_lookup_elem(&known_files, &key);
  if (!k || start >= end)
    return;
  state->exe.start = start;
  state->exe.end = end;
  state->exe.mapping.file_id = k->file_id;
  state->exe.mapping.bias = start - k->text_vaddr;
  state->exe.mapping.runtime = 0;
  increment_metric(METRIC_EXE_RESOLVED);
}

static __always_inline int in_range(const struct resolved_range *r, u64 pc)
{
  return pc >= r->start && pc < r->end;
}

// PCs the mapping trie does not cover yet (a new process, new code) are
// looked up in the program's own code (read_exe) and in the task's VMAs
// with bpf_find_vma (5.17), so a process's first samples unwind before user
// space has read its mappings. That runs in its own program, resolve_vma,
// which user space loads only where the kernel supports it (not on arm64
// before 6.0, whose JIT allows no tail calls in programs with subprograms
// such as the helper's callback). Kept out of unwind_native because a
// kernel without the helper rejects the callback even in dead code (5.10:
// "number of funcs in func_info doesn't match number of subprogs"), and
// 7.2's verifier stops pruning the unwind loop when the loop calls it (16
// frames then exceed 1M instructions). The loop checks one range
// (state->vma); the program's and the library's are kept here, and copied
// there for the PC asked about.
SEC("perf_event")
int resolve_vma(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  u64 pc = state->vma_pc;
  if (!state->exe_read)
    read_exe(state);
  if (!in_range(&state->exe, pc) && !in_range(&state->lib, pc) && !state->lib_looked) {
    // bpf_find_vma works once per sample in interrupt context: it defers
    // releasing the mmap lock to an irq_work that is busy until the
    // interrupt ends.
    state->lib_looked = 1;
    struct vma_lookup l = {};
    if (bpf_find_vma(bpf_get_current_task_btf(), pc, vma_callback, &l, 0)) {
      increment_metric(METRIC_ERR_VMA_LOOKUP);
    } else {
      state->lib.start = l.start;
      state->lib.end = l.end;
      state->lib.mapping.file_id = l.file_id;
      state->lib.mapping.bias = l.bias;
      state->lib.mapping.runtime = 0;
    }
  }
  if (in_range(&state->exe, pc))
    state->vma = state->exe;
  else if (in_range(&state->lib, pc))
    state->vma = state->lib;
  else
    state->vma_tried = 1;
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
}

// The mapping of pc from what resolve_vma found, or NULL. A PC the trie
// and the last range resolve_vma gave miss goes to resolve_vma (counted
// like any tail call), until it could not resolve one; where that program
// is not loaded the tail call falls through and there is nothing.
static __always_inline struct pid_mapping *mapping_from_vma(void *ctx, struct record *r, u64 pc)
{
  struct unwind_state *state = &r->state;
  if (pc < state->vma.start || pc >= state->vma.end) {
    if (state->vma_tried || ++state->tail_calls > MAX_TAIL_CALLS)
      return 0;
    state->vma_pc = pc;
    bpf_tail_call(ctx, &progs, PROG_RESOLVE_VMA);
    state->vma_tried = 1;
    return 0;
  }
  if (!state->vma.mapping.file_id) {
    increment_metric(METRIC_ERR_VMA_UNKNOWN_FILE);
    return 0;
  }
  increment_metric(METRIC_VMA_RESOLVED);
  return &state->vma.mapping;
}

// Delta idx of the stack_deltas pool, or NULL.
static __always_inline struct stack_delta *get_delta(u32 idx)
{
  u32 slot = idx / DELTAS_PER_SLOT;
  struct delta_slot *s = bpf_map_lookup_elem(&stack_deltas, &slot);
  if (!s)
    return 0;
  return &s->d[idx % DELTAS_PER_SLOT];
}

// The rule of the delta covering file address addr of file file_id, or NULL.
static __always_inline struct unwind_rule *find_rule(u64 file_id, u64 addr)
{
  struct delta_page_key key = {.file_id = file_id, .page = addr >> DELTA_PAGE_BITS};
  struct delta_page *page = bpf_map_lookup_elem(&delta_pages, &key);
  if (!page) {
    increment_metric(METRIC_ERR_NO_DELTAS);
    return 0;
  }
  // Binary search for the last delta at or below addr: the page's first
  // delta starts at the page start, so there is one.
  u16 low = addr & ((1 << DELTA_PAGE_BITS) - 1);
  u32 first = page->first, lo = 0, hi = page->count;
  for (int i = 0; i < DELTA_SEARCH_STEPS && lo < hi; i++) {
    u32 mid = (lo + hi) / 2;
    struct stack_delta *d = get_delta(first + mid);
    if (!d)
      return 0;
    if (d->addr_low <= low)
      lo = mid + 1;
    else
      hi = mid;
  }
  struct stack_delta *d = lo ? get_delta(first + lo - 1) : 0;
  if (!d)
    return 0;
  u32 rule = d->rule;
  return bpf_map_lookup_elem(&unwind_rules, &rule);
}

// Continues below a signal handler from the register set the kernel saved
// in the signal frame. Same contract as step_frame_pointer.
static __always_inline int step_signal_frame(struct unwind_state *state)
{
#if defined(__TARGET_ARCH_x86)
  // At __restore_rt the handler has returned into the trampoline, so SP
  // points at the ucontext of struct rt_sigframe; its mcontext (struct
  // sigcontext, arch/x86/include/uapi/asm/sigcontext.h) starts 40 bytes in
  // with r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
  const u64 mcontext = state->sp + 40;
  u64 bp, sp_ip[2];
  if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(mcontext + 10 * 8)) ||
      bpf_probe_read_user(sp_ip, sizeof(sp_ip), (void *)(mcontext + 15 * 8))) {
    increment_metric(METRIC_ERR_DELTA_READ);
    return -1;
  }
  state->fp = bp;
  state->sp = sp_ip[0];
  state->pc = sp_ip[1];
  // The interrupted PC is where the thread was, not after a call.
  state->return_address = 0;
  return 0;
#else
  increment_metric(METRIC_ERR_BAD_RULE);
  return -1;
#endif
}

// Offset of g.stack.hi in Go's runtime.g, which starts with its stack
// bounds, struct stack { lo, hi uintptr } (runtime/runtime2.go).
#define GO_G_STACK_HI 8

// Finds the goroutine's SP of a runtime.asmcgocall that called C on the
// system stack. Before the call it stored two words at SP: the goroutine's
// g and how far below g.stack.hi its SP was (the goroutine's stack may move
// while C runs), or 0 and the SP itself when it already ran on the system
// stack (runtime/asm_arm64.s and asm_amd64.s, asmcgocall; the two differ
// in the order of the words). User space gives this rule only on arm64 (on
// amd64 the frame pointer rule holds there); both layouts are here so that
// the rule means the same on either. Returns 0 on success, -1 if
// unreadable.
static __always_inline int go_cgo_goroutine_sp(const struct unwind_state *state, u64 *sp)
{
  u64 saved[2], hi;
  if (bpf_probe_read_user(saved, sizeof(saved), (void *)state->sp)) {
    increment_metric(METRIC_ERR_DELTA_READ);
    return -1;
  }
#if defined(__TARGET_ARCH_x86)
  u64 g = saved[1], depth = saved[0];
#else
  u64 g = saved[0], depth = saved[1];
#endif
  if (!g) {
    *sp = depth;
    return 0;
  }
  if (bpf_probe_read_user(&hi, sizeof(hi), (void *)(g + GO_G_STACK_HI))) {
    increment_metric(METRIC_ERR_DELTA_READ);
    return -1;
  }
  *sp = hi - depth;
  return 0;
}

// Steps to the caller with a stack delta's rule. Same contract as
// step_frame_pointer.
static __always_inline int step_delta(struct unwind_state *state, const struct unwind_rule *rule)
{
  u64 cfa;
  switch (rule->cfa_base) {
  case CFA_SP:
    cfa = state->sp + rule->cfa_offset;
#if defined(__TARGET_ARCH_arm64)
    // After a frame-pointer step sp is only a lower bound. A frame that
    // keeps a frame record (fp saved, the return address just above it)
    // has x29 pointing at it, so its CFA is fp - fp_offset, at or above
    // the bound's. Otherwise the return address is read from the wrong
    // slot: a new node process's frames are walked by frame pointers
    // until user space has loaded its mappings, glibc's below them by
    // their deltas, and __libc_start_call_main's caller came out as a
    // stack address.
    if (state->sp == state->fp_step_sp && rule->fp_offset &&
        rule->ra_offset == rule->fp_offset + 8 && state->fp - rule->fp_offset >= cfa) {
      cfa = state->fp - rule->fp_offset;
      increment_metric(METRIC_CFA_FROM_FRAME_RECORD);
    }
#endif
    break;
  case CFA_FP:
    cfa = state->fp + rule->cfa_offset;
    break;
  case CFA_PLT:
    // An x86_64 PLT entry has pushed its argument from byte cfa_offset on.
    cfa = state->sp + 8 + ((s64)(state->pc & 15) >= rule->cfa_offset ? 8 : 0);
    break;
  case CFA_GO_CGO:
    if (go_cgo_goroutine_sp(state, &cfa))
      return -1;
    cfa += rule->cfa_offset;
    break;
  case CFA_SIGNAL:
    return step_signal_frame(state);
  case CFA_STOP:
    increment_metric(METRIC_STOP_DELTAS);
    return 1;
  default:
    increment_metric(METRIC_ERR_BAD_RULE);
    return -1;
  }
  // A frame whose return address is still in the link register (arm64)
  // may have no stack of its own: a leaf, or code before the prologue. The
  // register holds that address only in the interrupted frame.
  int ra_in_lr = rule->ra_offset == 0;
  if (ra_in_lr && state->return_address) {
    increment_metric(METRIC_ERR_BAD_RULE);
    return -1;
  }
  if ((cfa < state->sp || (cfa == state->sp && !ra_in_lr)) &&
      !(rule->flags & UNWIND_RULE_STACK_SWITCH)) {
    increment_metric(METRIC_ERR_SP_NOT_INCREASING);
    return -1;
  }
  u64 ra = state->lr;
  if (!ra_in_lr && bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa + rule->ra_offset))) {
    increment_metric(METRIC_ERR_DELTA_READ);
    return -1;
  }
  if (rule->flags & UNWIND_RULE_RA_SIGNED)
    ra &= USER_ADDRESS_MASK;
  if (rule->fp_offset &&
      bpf_probe_read_user(&state->fp, sizeof(state->fp), (void *)(cfa + rule->fp_offset))) {
    increment_metric(METRIC_ERR_DELTA_READ);
    return -1;
  }
  state->sp = cfa;
  state->pc = ra;
  state->return_address = 1;
  return ra < MIN_CODE_ADDRESS ? 1 : 0;
}

// Hands the frame at the PC to the runtime whose JIT code it is, before
// stepping: its unwinder unwinds it.
static __always_inline int hand_over_at_pc(void *ctx, struct record *r, u8 runtime, u64 addr,
                                           u8 flags)
{
  struct runtime_handoff *h = &r->state.handoff;
  h->file_id = 0;
  h->addr = addr;
  h->flags = flags;
  h->runtime = runtime;
  h->cfa = r->state.sp;
  h->native_done = 0;
  tail_call_next(ctx, r, runtime);
  // The tail call failed (counted): the frame stays native and the unwind
  // stops, as nothing says how to step past JIT code.
  push_frame(&r->trace, FRAME_KIND_NATIVE, flags, 0, addr);
  return tail_call_stop(ctx);
}

SEC("perf_event")
int unwind_native(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;

  for (int i = 0; i < NATIVE_FRAMES_PER_PROGRAM; i++) {
    // A return address follows its call: look up the call instruction.
    u64 lookup_pc = state->pc - (state->return_address ? 1 : 0);
    struct pid_mapping *m = find_mapping(t->pid, lookup_pc);
    if (!m) {
      increment_metric(METRIC_ERR_NO_MAPPING);
      report_unknown_pc(t->pid, lookup_pc);
      m = mapping_from_vma(ctx, r, lookup_pc);
    }
    u64 file_id = 0, addr = state->pc;
    if (m) {
      file_id = m->file_id;
      addr = state->pc - m->bias;
    }
    u8 flags = state->return_address ? FRAME_FLAG_RETURN_ADDRESS : 0;
    if (m && runtime_active(state, m->runtime))
      return hand_over_at_pc(ctx, r, m->runtime, addr, flags);
    struct unwind_rule *rule = file_id ? find_rule(file_id, lookup_pc - m->bias) : 0;
    // A runtime's eval loop: its own frames go in place of this one.
    u8 runtime = rule ? rule->runtime : 0;
    int handoff = runtime_active(state, runtime);
    struct runtime_handoff *h = &state->handoff;
    if (handoff) {
      h->file_id = file_id;
      h->addr = addr;
      h->flags = flags;
      h->runtime = runtime;
    } else if (push_frame(t, FRAME_KIND_NATIVE, flags, file_id, addr)) {
      increment_metric(METRIC_TRUNCATED_TRACES);
      return tail_call_stop(ctx);
    }
    int rc;
    if (rule && rule->cfa_base != CFA_UNKNOWN) {
      increment_metric(METRIC_DELTA_FRAMES);
      rc = step_delta(state, rule);
    } else {
      increment_metric(METRIC_FP_FRAMES);
      rc = step_frame_pointer(state);
    }
    if (handoff) {
      h->cfa = state->sp;
      if (state->inline_walk.runtime == runtime) {
        if (inline_walk_step(state, t)) {
          increment_metric(METRIC_TRUNCATED_TRACES);
          return tail_call_stop(ctx);
        }
      } else {
        h->native_done = rc != 0;
        tail_call_next(ctx, r, runtime);
        // The tail call failed (counted): the frame stays native.
        runtime_give_up(state, runtime);
        if (runtime_report_native(h, t))
          return tail_call_stop(ctx);
      }
    }
    if (rc)
      return tail_call_stop(ctx);
  }
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
}

// The HotSpot JVM unwinder (runtime RUNTIME_JVM), x86_64 and arm64. User space
// claims the JVM's code cache; the native unwinder hands over at a PC in
// it. This program walks the Java frames there, interpreted, compiled and
// stubs, until a return address leaves the code cache (the call stub
// returning into JavaCalls::call_helper, a native method's caller), and
// hands back with the registers of the frame it got to.
//
// Facts (see interpreter/hotspot/internals.md): a PC's CodeBlob is found
// through its code heap's segment map; the template interpreter's code is
// one range; interpreted frames keep Method* at fp-3 words and the bytecode
// pointer at fp-8 (x86_64) or fp-9 (arm64; JDK 8: fp-7 on both), the
// caller's unextended sp at fp-1; compiled frames keep no frame pointer, their size in words, the
// saved frame pointer and return address at its top included, is in the
// blob. On arm64 code without a frame of its own (adapters, most stubs, a
// method before its prologue or after its epilogue) keeps its return
// address in the link register (internals.md, "arm64").
//
// Its frames: the top two bits of addr say what the frame is
// (enum jvm_frame_type). Interpreted: file_id is the Method*, addr the
// bytecode pointer (0 in a native method). Compiled: file_id is the
// nmethod, addr holds its compile id (bits 32-60, to tell it from a later
// nmethod at the same address) and the PC's offset from its code (bits
// 0-31); bit 61 is set for the interrupted PC, which HotSpot maps to debug
// information differently from a return address. Stub: file_id is the
// blob, addr the PC's offset in it.
#include "tracemgmt.h"

enum jvm_frame_type {
  JVM_FRAME_INTERPRETED = 0,
  JVM_FRAME_COMPILED = 1,
  JVM_FRAME_STUB = 2,
};
#define JVM_FRAME_TYPE_SHIFT 62
#define JVM_FRAME_TOP        (1ULL << 61)

// The code heaps a code cache has at most: non-nmethods, profiled and
// non-profiled with a segmented code cache, one without.
#define JVM_HEAPS 3

// What the JVM unwinder needs of a process (its entry in runtime_procs);
// user space fills it from the JVM's own vmStructs tables.
struct jvm_proc {
  // Code heap i is [heap_lo[i], heap_hi[i]) with one segment map byte per
  // segment of 1 << segment_shift bytes at heap_segmap[i].
  u64 heap_lo[JVM_HEAPS];
  u64 heap_hi[JVM_HEAPS];
  u64 heap_segmap[JVM_HEAPS];
  // The template interpreter's code: [interp_lo, interp_hi).
  u64 interp_lo;
  u64 interp_hi;
  // Byte offsets in a CodeBlob, all below JVM_BLOB_HEADER: its name (a
  // char*), frame size (words), frame complete offset
  // (frame_complete_width bytes), code (a pointer, or where code_relative
  // is set an int offset from the blob) and kind (where has_kind is set,
  // a u8; kind_nmethod is CodeBlobKind::Nmethod); an nmethod's compile
  // id.
  u16 blob_name;
  u16 blob_frame_size;
  u16 blob_frame_complete;
  u16 blob_code;
  u16 blob_kind;
  u16 nmethod_compile_id;
  // Byte offset of an nmethod's _stub_offset: its stub section (exception
  // and deoptimization handlers) starts that far from the blob.
  u16 nmethod_stub_offset;
  // Byte offsets of Method::_constMethod and ConstMethod::_code_size (a
  // u16), and sizeof(ConstMethod), which the bytecodes follow.
  u16 method_const_method;
  u16 const_method_code_size;
  u16 const_method_size;
  u8 heaps;
  u8 segment_shift;
  // sizeof(HeapBlock), which precedes a blob in its heap.
  u8 heap_block_size;
  u8 frame_complete_width;
  u8 code_relative;
  u8 has_kind;
  u8 kind_nmethod;
  // The interpreted frame's slot of the bytecode pointer, in words below
  // its frame pointer (frame::interpreter_frame_bcp_offset, which no table
  // exports: user space knows it by version and architecture).
  u8 bcp_slot;
  // Where a virtual thread's frames return instead of into its frames
  // still frozen (JDK 21+, where libjvm.so names it; else 0): the address
  // of StubRoutines::_cont_returnBarrier, which holds the return barrier's
  // address, and the offset from it of ContinuationEntry::_return_pc, which
  // holds the return address into Continuation.enterSpecial the barrier
  // stands for.
  s32 cont_return_pc;
  u64 cont_barrier;
};
_Static_assert(sizeof(struct jvm_proc) <= RUNTIME_PROC_SIZE, "jvm_proc too large");

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum jvm_metric {
  // Frames reported by kind.
  METRIC_JVM_INTERPRETED_FRAMES,
  METRIC_JVM_COMPILED_FRAMES,
  METRIC_JVM_STUB_FRAMES,
  // Code of a JVM user space has not (yet) described: the frame is
  // walked with its frame pointer, and user space is told.
  METRIC_ERR_JVM_NO_PROC,
  // A PC in the code cache in no blob (free space, or the segment map
  // changed while it was read): the walk ends.
  METRIC_ERR_JVM_NO_BLOB,
  // A read of the JVM's memory failed: the walk ends.
  METRIC_ERR_JVM_READ,
  // An interpreted frame whose frame pointer is not above the stack
  // pointer (a frame being built), a compiled frame whose return address
  // is not in the code cache, or one interrupted in its handlers: the
  // walk ends.
  METRIC_ERR_JVM_BAD_FRAME,
  METRIC_JVM_COUNT,
};
_Static_assert(METRIC_JVM_COUNT <= RUNTIME_METRICS_MAX, "too many jvm metrics");

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct jvm_btf_exports {
  struct jvm_proc jvm_proc;
  enum jvm_metric jvm_metric;
  enum jvm_frame_type jvm_frame_type;
} jvm_btf_exports __attribute__((used));

// Java frames one run of this program walks before it tail-calls itself.
#define JVM_FRAMES_PER_PROGRAM 6
// Segment map hops followed to a blob's start: one per 254 segments
// (32 KiB of code with 128-byte segments), and a few for chains that
// freeing blocks left longer.
#define JVM_SEGMAP_HOPS 24

static __always_inline int jvm_read(void *dst, u32 size, u64 addr)
{
  return bpf_probe_read_user(dst, size, (void *)addr);
}

// The code heap of pc: its index, or -1.
static __always_inline int jvm_heap_of(const struct jvm_proc *p, u64 pc)
{
  for (int i = 0; i < JVM_HEAPS; i++)
    if (i < p->heaps && pc >= p->heap_lo[i] && pc < p->heap_hi[i])
      return i;
  return -1;
}

// The register the template interpreter keeps the bytecode pointer in
// (rbcp: r13 on x86_64, r22 on aarch64; register_<cpu>.hpp).
#if defined(__TARGET_ARCH_x86)
#  define JVM_BCP_REGISTER(r) ((r)->r13)
#elif defined(__TARGET_ARCH_arm64)
#  define JVM_BCP_REGISTER(r) ((r)->regs[22])
#endif

// The bytecode pointer of the interrupted interpreted frame: the template
// interpreter keeps it in a register and stores it in the frame (at
// bcp_slot) only when it calls out, so the frame's slot is stale. The
// register's value is taken where it points into the method's bytecodes
// (it does not in the method's entry code), the slot otherwise.
static __always_inline u64 jvm_top_bcp(const struct jvm_proc *p, u64 method, u64 slot, u64 reg)
{
  u64 cm;
  u16 code_size;
  if (jvm_read(&cm, sizeof(cm), method + p->method_const_method) ||
      jvm_read(&code_size, sizeof(code_size), cm + p->const_method_code_size))
    return slot;
  u64 code = cm + p->const_method_size;
  return reg >= code && reg < code + code_size ? reg : slot;
}

// The CodeBlob holding pc in heap h, or 0.
static __always_inline u64 jvm_find_blob(const struct jvm_proc *p, int h, u64 pc)
{
  if (h < 0 || h >= JVM_HEAPS)
    return 0;
  u64 lo = p->heap_lo[h], segmap = p->heap_segmap[h];
  u64 idx = (pc - lo) >> (p->segment_shift & 31);
  for (int i = 0; i < JVM_SEGMAP_HOPS; i++) {
    u8 hop;
    if (jvm_read(&hop, sizeof(hop), segmap + idx))
      return 0;
    if (hop == 0xff || hop > idx)
      return 0; // free, or a chain that runs off the heap
    if (hop == 0)
      return lo + (idx << (p->segment_shift & 31)) + p->heap_block_size;
    idx -= hop;
  }
  return 0;
}

// What the walk knows of the blob at a PC.
struct jvm_blob {
  u64 addr;
  u64 code;
  s32 frame_size;
  s32 frame_complete;
  u8 nmethod;
};

// The bytes of a CodeBlob's header the walk reads in one go: every field
// it needs lies in them (user space checks the offsets).
#define JVM_BLOB_HEADER 128

static __always_inline int jvm_read_blob(const struct jvm_proc *p, struct jvm_blob *b)
{
  u8 hdr[JVM_BLOB_HEADER];
  u64 a = b->addr;
  if (jvm_read(hdr, sizeof(hdr), a))
    return -1;
  // The masks keep each field inside hdr, at its alignment.
  b->frame_size = *(s32 *)(hdr + (p->blob_frame_size & (JVM_BLOB_HEADER - 4)));
  if (p->frame_complete_width == 2)
    b->frame_complete = *(short *)(hdr + (p->blob_frame_complete & (JVM_BLOB_HEADER - 2)));
  else
    b->frame_complete = *(s32 *)(hdr + (p->blob_frame_complete & (JVM_BLOB_HEADER - 4)));
  if (p->code_relative)
    b->code = a + *(s32 *)(hdr + (p->blob_code & (JVM_BLOB_HEADER - 4)));
  else
    b->code = *(u64 *)(hdr + (p->blob_code & (JVM_BLOB_HEADER - 8)));
  if (p->has_kind) {
    b->nmethod = hdr[p->blob_kind & (JVM_BLOB_HEADER - 1)] == p->kind_nmethod;
  } else {
    // Before JDK 23 the kind shows only in the name: "nmethod" for Java
    // methods, "native nmethod" for the wrappers of native ones.
    u64 name = *(u64 *)(hdr + (p->blob_name & (JVM_BLOB_HEADER - 8))), text;
    if (jvm_read(&text, sizeof(text), name))
      return -1;
    b->nmethod = text == 0x00646f6874656d6eULL /* "nmethod\0" */ ||
                 text == 0x6e2065766974616eULL /* "native n" */;
  }
  return 0;
}

// How the walk leaves a frame (jvm_top_frame).
enum jvm_walk {
  // By its layout: a compiled frame by its size, a stub by its frame
  // pointer.
  JVM_WALK_FRAME,
  // As jvm_top_frame found it.
  JVM_WALK_DONE,
  JVM_WALK_ERROR,
};

#if defined(__TARGET_ARCH_x86)

// x86-64 instruction bytes of the prologues (MacroAssembler::verified_entry
// for C2, C1_MacroAssembler::build_frame for C1, enter for stubs).
#  define X86_PUSH_RBP  0x55
#  define X86_POP_RBP   0x5d
#  define X86_RET       0xc3
#  define X86_REX_W     0x48
#  define X86_SUB_IMM8  0x83        // 48 83 ec ib: sub rsp, imm8
#  define X86_SUB_IMM32 0x81        // 48 81 ec id: sub rsp, imm32
#  define X86_MODRM_RSP 0xec        // the /5 (sub) form on rsp
#  define X86_MOV_RBP   0xe5894800U // 48 89 e5: mov rbp, rsp (the low three bytes)

// Where the prologue that ends at the blob's frame complete offset has got
// to at the PC, as the instructions just before it say (with a stack bang:
// push rbp, then sub rsp, imm8 or imm32; without: sub rsp, imm32, then rbp
// saved under the return address; a stub: push rbp; mov rbp, rsp): the
// offset from sp of the return address, and 1 if the caller's rbp is saved
// (in the word below it), else 0.
static __always_inline int x86_prologue(u64 at, u64 *ret_at)
{
  u8 w[8];
  *ret_at = 0;
  if (jvm_read(w, sizeof(w), at - 8))
    return 0;
  u32 imm32 = w[4] | (u32)w[5] << 8 | (u32)w[6] << 16 | (u32)w[7] << 24;
  if (w[7] == X86_PUSH_RBP) {
    *ret_at = 8;
    return 1;
  }
  if (w[4] == X86_REX_W && w[5] == X86_SUB_IMM8 && w[6] == X86_MODRM_RSP) {
    // After push rbp (C2 with a stack bang, C1).
    *ret_at = w[7] + 8;
    return 1;
  }
  if (w[1] == X86_REX_W && w[2] == X86_SUB_IMM32 && w[3] == X86_MODRM_RSP) {
    // After push rbp, or without it: rbp is saved by the next instruction.
    *ret_at = imm32 + (w[0] == X86_PUSH_RBP ? 8 : 0);
    return w[0] == X86_PUSH_RBP;
  }
  if (w[4] == X86_PUSH_RBP && (imm32 >> 8) == (X86_MOV_RBP >> 8)) {
    *ret_at = 8;
    return 1;
  }
  return 0; // nothing pushed yet: the return address is at sp
}

// The caller of the interrupted code of blob b, where its frame is not
// (yet, or any more) laid out as its size says: in its prologue (up to the
// frame complete offset: x86_prologue), or in its epilogue, at the pop of
// rbp or the ret. A stub without a frame size keeps rbp as its frame
// pointer once it made a frame record (enter); vtable and itable stubs,
// method handle intrinsics and most leaf stubs make none, and their return
// address, into the Java code that called them, is at rsp (rbp is then
// the caller's, an interpreted frame's or any value in compiled code).
// Java code is called from the code cache only: a return address found
// elsewhere says the guess was wrong, and the frame is walked by its size.
static __always_inline int jvm_top_frame(const struct jvm_proc *p, const struct unwind_state *state,
                                         const struct jvm_blob *b, u64 *pc, u64 *sp, u64 *fp)
{
  u64 at = state->pc, ret_at = 0;
  int saved = 0;
  if (b->frame_size <= 0) {
    if (state->fp == state->sp)
      return JVM_WALK_FRAME;
  } else if (b->frame_complete > 0 && at < b->code + b->frame_complete) {
    saved = x86_prologue(at, &ret_at);
    if (ret_at + 8 > (u64)b->frame_size * 8)
      return JVM_WALK_FRAME;
  } else {
    u8 insn = 0;
    jvm_read(&insn, sizeof(insn), at);
    if (insn == X86_POP_RBP) {
      ret_at = 8;
      saved = 1;
    } else if (insn != X86_RET) {
      return JVM_WALK_FRAME;
    }
  }
  u64 ret;
  if (jvm_read(&ret, sizeof(ret), state->sp + ret_at) ||
      jvm_heap_of(p, ret & USER_ADDRESS_MASK) < 0)
    return JVM_WALK_FRAME;
  *fp = state->fp;
  if (saved && jvm_read(fp, 8, state->sp + ret_at - 8))
    return JVM_WALK_ERROR;
  *pc = ret;
  *sp = state->sp + ret_at + 8;
  return JVM_WALK_DONE;
}

// What a call from compiled code left on the stack below its frame: none.
static __always_inline u64 jvm_call_padding(u64 pc) { return 0; }

#elif defined(__TARGET_ARCH_arm64)

// A64 instruction words the walk recognises (internals.md, arm64 A.8).
#  define A64_RET              0xd65f03c0U
#  define A64_AUTIAZ           0xd503239fU
#  define A64_CMP_SP_X8        0xeb2863ffU
#  define A64_STP_FP_LR_PRE16  0xa9bf7bfdU // stp x29, x30, [sp, #-16]!
#  define A64_LDP_FP_LR_POST16 0xa8c17bfdU // ldp x29, x30, [sp], #16
#  define A64_LDP_FP_LR_SP     0xa9407bfdU // ldp x29, x30, [sp, #imm7 * 8]
#  define A64_PAIR_IMM_MASK    0xffc07fffU
#  define A64_SUB_SP_IMM       0xd10003ffU // sub sp, sp, #imm12
#  define A64_ADD_SP_IMM       0x910003ffU // add sp, sp, #imm12
#  define A64_SP_IMM_MASK      0xffc003ffU
#  define A64_LDR_X8_X28       0xf9400388U // ldr x8, [x28, #imm12 * 8]: a poll
#  define A64_LDR_IMM_MASK     0xffc003ffU
#  define A64_LDR_WZR_X8       0xb940011fU // ldr wzr, [x8]: JDK 11's poll
#  define A64_B_HI             0x54000008U // b.hi
#  define A64_B_COND_MASK      0xff00001fU
// stp xzr, x9, [sp, #-16]!; blr x8 (as one little-endian u64): C2's call
// of a C function outside the code cache leaves this "breadcrumb" pair
// below its frame (JDK 11-21).
#  define A64_BREADCRUMB_CALL  0xd63f0100a9bf27ffULL

// Words of a prologue scanned for the instructions that move sp.
#  define JVM_PROLOGUE_WORDS   32
// Words before the PC scanned for the end of an epilogue.
#  define JVM_EPILOGUE_WORDS   6

// Whether word w is part of the return poll after an epilogue (or its
// pointer authentication).
static __always_inline int a64_return_poll(u32 w)
{
  return w == A64_AUTIAZ || w == A64_CMP_SP_X8 || w == A64_LDR_WZR_X8 ||
         (w & A64_LDR_IMM_MASK) == A64_LDR_X8_X28 || (w & A64_B_COND_MASK) == A64_B_HI;
}

// The caller of the interrupted code of blob b, where its return address
// is in the link register (internals.md, arm64 A.4 and A.5):
// - a stub or adapter without a frame size, unless it made a frame record
//   (enter): the record holds the link register's value if it was just
//   made, and the link register points back into the blob once it called;
// - a frame in its prologue: sp moved by the instructions before the PC,
//   unless the link register points back into the blob (the nmethod entry
//   barrier called out, the frame complete);
// - a frame past its epilogue (ldp x29, x30; add sp, or add sp; ldp ...,
//   #16), in its return poll or at its ret: sp is the caller's; on the
//   large form's ldp the record is still at sp.
static __always_inline int jvm_top_frame(const struct jvm_proc *p, const struct unwind_state *state,
                                         const struct jvm_blob *b, u64 *pc, u64 *sp, u64 *fp)
{
  u64 at = state->pc, lr = state->lr & USER_ADDRESS_MASK;
  int called = lr >= b->code && lr <= at;
  *fp = state->fp;
  if (b->frame_size <= 0) {
    u64 saved = 0;
    if (called ||
        (state->fp >= state->sp && state->fp < state->sp + 4096 &&
         !jvm_read(&saved, sizeof(saved), state->fp + 8) && (saved & USER_ADDRESS_MASK) == lr))
      return JVM_WALK_FRAME;
    *pc = lr;
    *sp = state->sp;
    return JVM_WALK_DONE;
  }
  if (b->frame_complete > 0 && at < b->code + b->frame_complete) {
    if (called)
      return JVM_WALK_FRAME;
    u32 words[JVM_PROLOGUE_WORDS];
    if (jvm_read(words, sizeof(words), b->code))
      return JVM_WALK_ERROR;
    u64 n = (at - b->code) / 4, moved = 0;
    for (int i = 0; i < JVM_PROLOGUE_WORDS && i < n; i++) {
      u32 w = words[i];
      if ((w & A64_SP_IMM_MASK) == A64_SUB_SP_IMM)
        moved += (w >> 10) & 0xfff;
      else if (w == A64_STP_FP_LR_PRE16)
        moved += 16;
    }
    *pc = lr;
    *sp = state->sp + moved;
    return JVM_WALK_DONE;
  }
  // words[JVM_EPILOGUE_WORDS] is the word at the PC.
  u32 words[JVM_EPILOGUE_WORDS + 1];
  if (jvm_read(words, sizeof(words), at - 4 * JVM_EPILOGUE_WORDS))
    return JVM_WALK_ERROR;
  u32 w = words[JVM_EPILOGUE_WORDS];
  if (w == A64_LDP_FP_LR_POST16) {
    if (jvm_read(fp, 8, state->sp) || jvm_read(pc, 8, state->sp + 8))
      return JVM_WALK_ERROR;
    *sp = state->sp + 16;
    return JVM_WALK_DONE;
  }
  int gone = w == A64_RET || w == A64_CMP_SP_X8;
  for (int i = JVM_EPILOGUE_WORDS - 1; i > 0 && !gone; i--) {
    w = words[i];
    if (w == A64_LDP_FP_LR_POST16 || ((w & A64_SP_IMM_MASK) == A64_ADD_SP_IMM &&
                                      (words[i - 1] & A64_PAIR_IMM_MASK) == A64_LDP_FP_LR_SP))
      gone = 1;
    else if (!a64_return_poll(w))
      break;
  }
  if (!gone)
    return JVM_WALK_FRAME;
  *pc = lr;
  *sp = state->sp;
  return JVM_WALK_DONE;
}

// What a call from compiled code at return address pc left on the stack
// below its frame: the breadcrumb pair of C2's calls out of the code
// cache.
static __always_inline u64 jvm_call_padding(u64 pc)
{
  u64 call = 0;
  jvm_read(&call, sizeof(call), pc - 8);
  return call == A64_BREADCRUMB_CALL ? 16 : 0;
}

#endif

// The caller of the frame that returned into pc with its caller's sp at
// sp, if pc is the continuation return barrier: a virtual thread's frames
// thawed onto its carrier's stack return there in place of the frames
// still frozen in the heap, onto the Continuation.enterSpecial frame
// (whose ContinuationEntry is at sp, internals.md 4.7). The walk goes on
// as HotSpot's does, with that frame at ContinuationEntry::_return_pc,
// then the carrier's own frames; the frozen ones are not on the stack.
// Returns 1 if so.
static __always_inline int jvm_cont_bottom(const struct jvm_proc *p, u64 pc, u64 *next_pc)
{
  u64 barrier = 0, ret = 0;
  if (!p->cont_barrier || jvm_read(&barrier, sizeof(barrier), p->cont_barrier) || !barrier ||
      barrier != pc || jvm_read(&ret, sizeof(ret), p->cont_barrier + (s64)p->cont_return_pc) ||
      jvm_heap_of(p, ret) < 0)
    return 0;
  *next_pc = ret;
  return 1;
}

SEC("perf_event")
int unwind_jvm(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;
  const struct jvm_proc *p = runtime_config(t->pid, RUNTIME_JVM);
  if (!p) {
    runtime_missing(state, t->pid, RUNTIME_JVM, METRIC_ERR_JVM_NO_PROC);
    return runtime_return(ctx, r);
  }
  for (int i = 0; i < JVM_FRAMES_PER_PROGRAM; i++) {
    u64 pc = state->pc, sp = state->sp, fp = state->fp;
    int top = !state->return_address;
    int h = jvm_heap_of(p, pc);
    if (h < 0)
      // Left the code cache: native code again.
      return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
    u64 next_pc, next_sp, next_fp;
    if (pc >= p->interp_lo && pc < p->interp_hi) {
      u64 slots[2]; // fp-bcp_slot words: bcp; fp-3: Method*
      u64 sender_sp;
      if (fp <= sp || jvm_read(&sender_sp, sizeof(sender_sp), fp - 8)) {
        increment_runtime_metric(RUNTIME_JVM, METRIC_ERR_JVM_BAD_FRAME);
        goto give_up;
      }
      if (jvm_read(&slots[0], sizeof(slots[0]), fp - 8 * (u64)(p->bcp_slot & 15)) ||
          jvm_read(&slots[1], sizeof(slots[1]), fp - 24) || jvm_read(&next_fp, 8, fp) ||
          jvm_read(&next_pc, 8, fp + 8))
        goto read_error;
      increment_runtime_metric(RUNTIME_JVM, METRIC_JVM_INTERPRETED_FRAMES);
      u64 bcp =
        top ? jvm_top_bcp(p, slots[1], slots[0], JVM_BCP_REGISTER(&state->user_regs)) : slots[0];
      if (push_runtime_frame(t, RUNTIME_JVM, slots[1], bcp & ~(3ULL << JVM_FRAME_TYPE_SHIFT)))
        goto full;
      // The caller's sp before the interpreter extended its frame for
      // the callee's locals: what a compiled caller's frame size counts
      // from.
      next_sp = sender_sp > fp ? sender_sp : fp + 16;
    } else {
      struct jvm_blob b = {.addr = jvm_find_blob(p, h, pc)};
      if (!b.addr) {
        increment_runtime_metric(RUNTIME_JVM, METRIC_ERR_JVM_NO_BLOB);
        goto give_up;
      }
      if (jvm_read_blob(p, &b))
        goto read_error;
      u64 addr;
      u64 file_id = b.addr;
      int in_handler = 0;
      if (b.nmethod) {
        s32 compile_id = 0, stub_offset = 0;
        jvm_read(&compile_id, sizeof(compile_id), b.addr + p->nmethod_compile_id);
        // The interrupted PC in the nmethod's handlers (deoptimization
        // or exception dispatch) runs with a frame that is not laid out
        // as its frame size says.
        if (top && (jvm_read(&stub_offset, sizeof(stub_offset), b.addr + p->nmethod_stub_offset) ||
                    stub_offset <= 0 || pc >= b.addr + stub_offset))
          in_handler = 1;
        addr = ((u64)JVM_FRAME_COMPILED << JVM_FRAME_TYPE_SHIFT) | (top ? JVM_FRAME_TOP : 0) |
               ((u64)(compile_id & 0x1fffffff) << 32) | (u32)(pc - b.code);
        increment_runtime_metric(RUNTIME_JVM, METRIC_JVM_COMPILED_FRAMES);
      } else {
        addr = ((u64)JVM_FRAME_STUB << JVM_FRAME_TYPE_SHIFT) | (u32)(pc - b.addr);
        increment_runtime_metric(RUNTIME_JVM, METRIC_JVM_STUB_FRAMES);
      }
      if (push_runtime_frame(t, RUNTIME_JVM, file_id, addr))
        goto full;
      if (in_handler) {
        increment_runtime_metric(RUNTIME_JVM, METRIC_ERR_JVM_BAD_FRAME);
        goto give_up_after;
      }
      int walk = top ? jvm_top_frame(p, state, &b, &next_pc, &next_sp, &next_fp) : JVM_WALK_FRAME;
      if (walk == JVM_WALK_ERROR)
        goto read_error;
      if (walk == JVM_WALK_DONE) {
        // next_* set.
      } else if (b.frame_size <= 0) {
        if (!top && jvm_cont_bottom(p, pc, &next_pc)) {
          next_sp = sp;
          next_fp = fp;
        } else {
          // Hand-written stubs (the call stub, adapters) keep a frame
          // pointer when they have a frame at all (fp == sp: just made).
          if (fp < sp)
            goto give_up;
          if (jvm_read(&next_fp, 8, fp) || jvm_read(&next_pc, 8, fp + 8))
            goto read_error;
          next_sp = fp + 16;
        }
      } else {
        next_sp = sp + jvm_call_padding(pc) + (u64)b.frame_size * 8;
        if (jvm_read(&next_pc, 8, next_sp - 8) || jvm_read(&next_fp, 8, next_sp - 16))
          goto read_error;
        // Java code is called only from code in the code cache (other
        // methods, the interpreter, the call stub, adapters): a return
        // address elsewhere says the interrupted frame is being torn
        // down (a safepoint poll between its epilogue and its return),
        // so it returns as code without a frame.
        if (b.nmethod && jvm_heap_of(p, next_pc & USER_ADDRESS_MASK) < 0) {
          if (!top || frameless_return(state, &next_pc, &next_sp) ||
              jvm_heap_of(p, next_pc & USER_ADDRESS_MASK) < 0) {
            increment_runtime_metric(RUNTIME_JVM, METRIC_ERR_JVM_BAD_FRAME);
            goto give_up_after;
          }
          next_fp = fp;
        }
      }
    }
    state->pc = next_pc & USER_ADDRESS_MASK;
    state->sp = next_sp;
    state->fp = next_fp;
    state->return_address = 1;
    if (state->pc < MIN_CODE_ADDRESS)
      return tail_call_stop(ctx);
  }
  return tail_call_next(ctx, r, RUNTIME_JVM);

give_up_after:
  // The frame was reported; what follows it cannot be found.
  push_frame(t, FRAME_KIND_ABORT, 0, 0, UNWIND_ERROR_RUNTIME_CALLER);
  return tail_call_stop(ctx);
read_error:
  increment_runtime_metric(RUNTIME_JVM, METRIC_ERR_JVM_READ);
give_up:
  // The rest of the stack cannot be trusted to Java frames: the native
  // unwinder walks on with frame pointers from the frame reached.
  runtime_give_up(state, RUNTIME_JVM);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
full:
  increment_metric(METRIC_TRUNCATED_TRACES);
  return tail_call_stop(ctx);
}

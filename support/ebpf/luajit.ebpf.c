// The LuaJIT unwinder (runtime RUNTIME_LUAJIT), for OpenResty's LuaJIT 2.1
// as Debian builds it (GC64, two-slot frames); x86_64 and arm64. User space
// claims the VM (the interpreter and its subroutines, found by its unwind
// entry) and every machine-code area of the JIT; the native unwinder hands
// over at the PC there, as the leaf or as a return address. This program
// reports the Lua frames of that one VM activation (one entry of the VM
// from C: lua_call, lua_pcall, lua_resume, ...), innermost first, and
// hands back at the C frame the activation's entry built, never at the
// stack pointer: the VM's own unwind entry is wrong in its subroutines and
// trace code has none (interpreter/luajit/internals.md §6.2, §11.5).
//
// The state (§2): G, the VM instance's global_State, is in a register
// while the VM or a trace runs (x86_64: DISPATCH, r14, at a fixed distance
// from G; arm64: x22 holds G); its cur_L is the running lua_State. Each
// activation's C frame (L->cframe, low 2 bits flags) holds the
// activation's lua_State (SAVE_L), the PC of its innermost Lua frame
// (SAVE_PC) and the C frame of the activation outside it (SAVE_CFRAME).
//
// The Lua stack (§3): a frame is two slots below its base, the function
// (a tagged GC pointer) and the link: the caller's PC after its CALL (a
// Lua frame, low 3 bits 0; the caller's base is A(CALL)+2 slots below) or
// a byte delta tagged with the frame type. A C or C-protected link ends the
// activation (the function below was called from C); a vararg link leads
// to the same function's own slot; a continuation frame (a metamethod)
// keeps the PC of the Lua frame below it in its slot base-3; pcall's frame
// leaves a pcall link.
//
// Its frames (the frame encoding, decoded by interpreter/luajit/symbolize.go):
//   Lua frame:   file_id = the GCproto's address, addr = the PC saved for
//                the frame (the bytecode after the current one, as LuaJIT
//                saves it), 0 when unknown.
//   Trace frame: file_id = LUAJIT_TRACE_TAG | G, addr = the machine-code
//                address in the trace (less 1 for a return address, to
//                fall in the call): the frames the trace runs, of which
//                the one it started in is on the Lua stack at G->jit_base
//                and not reported apart.
// C functions (lua_CFunction, FFI callees) and the VM's C fast functions
// are native frames between them; fast functions are not reported.
#include "tracemgmt.h"

#define LUAJIT_TRACE_TAG (1ULL << 63)
// LJ_GCVMASK: a tagged slot's GC pointer; the tag above it of a function
// (LJ_TFUNC, ~8, in 17 bits).
#define LUAJIT_GCVMASK  ((1ULL << 47) - 1)
#define LUAJIT_FUNC_TAG 0x1fff7
// Frame link types (lj_frame.h).
#define LUAJIT_FRAME_TYPE  3
#define LUAJIT_FRAME_TYPEP 7
#define LUAJIT_FRAME_LUA   0
#define LUAJIT_FRAME_C     1
#define LUAJIT_FRAME_CONT  2
#define LUAJIT_FRAME_VARG  3
// vmstate while the interpreter runs (~LJ_VMST_INTERP).
#define LUAJIT_VMST_INTERP (-1)
// frame_contv of a continuation frame an FFI callback entered.
#define LUAJIT_CONT_FFI_CALLBACK 1
// A frame delta larger than this is garbage (LuaJIT's stack is at most
// LJ_STACK_MAXEX slots of 8 bytes, about 1M).
#define LUAJIT_MAX_DELTA (8ULL << 20)
// Lua frames one run of this program looks at before it tail-calls itself.
#define LUAJIT_FRAMES_PER_RUN 12

#if defined(__TARGET_ARCH_x86)
// DISPATCH, BASE and PC of vm_x64.dasc.
#  define LUAJIT_G_REGISTER(r)    ((r)->r14)
#  define LUAJIT_BASE_REGISTER(r) ((r)->dx)
#  define LUAJIT_PC_REGISTER(r)   ((r)->bx)
#elif defined(__TARGET_ARCH_arm64)
// GL, BASE and PC of vm_arm64.dasc.
#  define LUAJIT_G_REGISTER(r)    ((r)->regs[22])
#  define LUAJIT_BASE_REGISTER(r) ((r)->regs[19])
#  define LUAJIT_PC_REGISTER(r)   ((r)->regs[21])
#endif

// What the LuaJIT unwinder needs of a process (its entry in runtime_procs):
// byte offsets of the build's layout (interpreter/luajit/layout.go).
struct luajit_proc {
  // The VM's code, [vm_start, vm_end): other code handed over is a
  // trace's.
  u64 vm_start;
  u64 vm_end;
  // G = LUAJIT_G_REGISTER + g_from_register.
  s64 g_from_register;
  // global_State: vmstate, cur_L, jit_base.
  u16 g_vmstate;
  u16 g_cur_l;
  u16 g_jit_base;
  // lua_State: glref, base, maxstack, stack, cframe.
  u16 l_glref;
  u16 l_base;
  u16 l_maxstack;
  u16 l_stack;
  u16 l_cframe;
  // The C frame: SAVE_L, SAVE_PC, SAVE_CFRAME, CFRAME_SIZE (the caller's
  // return address and frame pointer are the frame's last two words).
  u16 cf_l;
  u16 cf_pc;
  u16 cf_prev;
  u16 cf_size;
  // GCfuncL: ffid, pc (the first bytecode, sizeof(GCproto) after the
  // prototype).
  u16 fn_ffid;
  u16 fn_pc;
  u16 proto_size;
  u16 pad;
};
_Static_assert(sizeof(struct luajit_proc) <= RUNTIME_PROC_SIZE, "luajit_proc too large");

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum luajit_metric {
  // Lua frames reported.
  METRIC_LUAJIT_FRAMES,
  // Trace frames reported.
  METRIC_LUAJIT_TRACE_FRAMES,
  // VM or trace code in a process user space has not described (yet).
  METRIC_ERR_LUAJIT_NO_PROC,
  // The VM's state (G, the lua_State, its C frame) could not be found or
  // did not check out: the frame is unwound as native code.
  METRIC_ERR_LUAJIT_STATE,
  // Trace code ran without jit_base (an exit stub): native.
  METRIC_ERR_LUAJIT_NO_JIT_BASE,
  // A Lua stack slot or function could not be read or made no sense: the
  // walk ends there and native unwinding goes on from the C frame.
  METRIC_ERR_LUAJIT_STACK,
  // Activations without a Lua frame (a lua_CFunction called from C, as
  // luajit's pmain is): nothing is reported for them, the C function
  // being a native frame of its own.
  METRIC_LUAJIT_EMPTY_ACTIVATIONS,
  METRIC_LUAJIT_COUNT,
};
_Static_assert(METRIC_LUAJIT_COUNT <= RUNTIME_METRICS_MAX, "too many luajit metrics");

// Where the LuaJIT unwinder is in a sample.
struct luajit_walk {
  // The sample (its ktime) and the hand-over (its sp) being walked.
  u64 sample;
  u64 sp;
  // The activation's lua_State and raw C frame.
  u64 l;
  u64 cframe;
  // The next frame to look at (its base) and its PC (0: unknown).
  u64 base;
  u64 pc;
  // Frames at or below bot are past the stack's bottom (L->stack + 2
  // slots); top is L->maxstack.
  u64 bot;
  u64 top;
  // Where the activation outside goes on, for the next hand-over of this
  // sample: its C frame, its lua_State and the base of its innermost
  // frame (0 for none: it starts at its L->base).
  u64 next_cframe;
  u64 next_l;
  u64 next_base;
  u32 frames;
  // An activation is being walked (a tail call goes on with it).
  u8 walking;
  // The frame at base is not reported (a vararg function's copy, a
  // trace's start frame).
  u8 skip;
  u8 pad[2];
};

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct luajit_btf_exports {
  struct luajit_proc luajit_proc;
  enum luajit_metric luajit_metric;
} luajit_btf_exports __attribute__((used));

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct luajit_walk);
} luajit_walks SEC(".maps");

static __always_inline int luajit_read(u64 *v, u64 addr)
{
  return bpf_probe_read_user(v, sizeof(*v), (void *)addr);
}

// Reads the lua_State l of G g (0: any) into the walk, checking that it
// belongs to its G. Returns 0 when it does.
static __always_inline int luajit_enter_l(struct luajit_walk *w, const struct luajit_proc *p, u64 l,
                                          u64 g)
{
  u64 glref, stack, top;
  if (!l || luajit_read(&glref, l + p->l_glref) || !glref || (g && glref != g) ||
      luajit_read(&stack, l + p->l_stack) || luajit_read(&top, l + p->l_maxstack) || stack >= top)
    return -1;
  w->l = l;
  w->bot = stack + 16;
  w->top = top;
  return 0;
}

// The running lua_State of G, checked (its G is g).
static __always_inline u64 luajit_cur_l(const struct luajit_proc *p, u64 g)
{
  u64 l;
  if (!g || luajit_read(&l, g + p->g_cur_l))
    return 0;
  return l;
}

#if defined(__TARGET_ARCH_x86)
// Whether fp, the frame pointer register the native unwinder carried to a
// VM frame, is the base of a frame above base, L->base, within two Lua
// links: the VM keeps its BASE in rbp (callee-saved) around some calls
// without syncing L->base (the math fast functions' libm calls,
// internals.md §3.2), so that L->base is older.
static __always_inline int luajit_fp_above(const struct luajit_walk *w, u64 fp, u64 base)
{
  if (fp <= base || fp > w->top || (fp & 7))
    return 0;
  u64 f = fp;
  for (int i = 0; i < 2; i++) {
    u64 link;
    u32 ins;
    if (luajit_read(&link, f - 8) || (link & LUAJIT_FRAME_TYPE) != LUAJIT_FRAME_LUA || link < 4 ||
        bpf_probe_read_user(&ins, sizeof(ins), (void *)(link - 4)))
      return 0;
    f -= 8 * (2 + ((ins >> 8) & 0xff));
    if (f == base)
      return 1;
    if (f < base)
      return 0;
  }
  return 0;
}
#endif

// Finds the activation the hand-over is in and where its walk starts;
// pushes the trace frame of trace code. Returns 0 when found, 1 when the
// trace is full, -1 when not found (counted).
static __always_inline int luajit_start(struct luajit_walk *w, struct unwind_state *state,
                                        struct trace *t, const struct luajit_proc *p)
{
  int in_vm = state->pc >= p->vm_start && state->pc < p->vm_end;
  int leaf = !state->return_address;
  u64 g = 0, l, cframe, base, pc = 0, jit_base = 0;
  w->skip = 0;
  w->frames = 0;
  if (in_vm && !leaf) {
    // The VM called C: it did so from its main body, whose stack pointer
    // is its C frame.
    if (luajit_read(&l, state->sp + p->cf_l) || luajit_enter_l(w, p, l, 0) ||
        luajit_read(&pc, state->sp + p->cf_pc))
      goto fail;
    cframe = state->sp;
    if (w->next_cframe == cframe && w->next_l == l && w->next_base) {
      // The activation outside the one walked before in this sample.
      base = w->next_base;
    } else {
      u64 own;
      if (luajit_read(&own, l + p->l_cframe) || (own & ~3ULL) != cframe ||
          luajit_read(&base, l + p->l_base))
        goto fail;
#if defined(__TARGET_ARCH_x86)
      if (luajit_fp_above(w, state->fp, base))
        base = state->fp;
#endif
    }
  } else {
    // The VM or a trace at the PC, or a trace that called C, which keeps
    // the register (callee-saved) unless it saved it: checked by cur_L.
    s32 vmstate;
    g = LUAJIT_G_REGISTER(&state->user_regs) + p->g_from_register;
    l = luajit_cur_l(p, g);
    if (luajit_enter_l(w, p, l, g) || luajit_read(&cframe, l + p->l_cframe) ||
        luajit_read(&jit_base, g + p->g_jit_base) ||
        bpf_probe_read_user(&vmstate, sizeof(vmstate), (void *)(g + p->g_vmstate)))
      goto fail;
    cframe &= ~3ULL;
    if (!cframe)
      goto fail;
    if (!in_vm) {
      if (!jit_base) {
        increment_runtime_metric(RUNTIME_LUAJIT, METRIC_ERR_LUAJIT_NO_JIT_BASE);
        return -1;
      }
      // The trace's frame stands for the frame it started in.
      increment_runtime_metric(RUNTIME_LUAJIT, METRIC_LUAJIT_TRACE_FRAMES);
      w->frames++;
      // A return address (the trace called C) is looked up in the call.
      if (push_runtime_frame(t, RUNTIME_LUAJIT, LUAJIT_TRACE_TAG | g,
                             state->pc - (state->return_address ? 1 : 0)))
        return 1;
      base = jit_base;
      w->skip = 1;
    } else if (jit_base) {
      // A VM subroutine a trace called (arm64's vm_modi for an integer
      // %, x86_64's rounding without SSE4.1): the trace's frame is at its
      // return address.
      u64 ret, caller_sp;
      if (!frameless_return(state, &ret, &caller_sp) && ret > 1 &&
          (ret < p->vm_start || ret >= p->vm_end)) {
        increment_runtime_metric(RUNTIME_LUAJIT, METRIC_LUAJIT_TRACE_FRAMES);
        w->frames++;
        if (push_runtime_frame(t, RUNTIME_LUAJIT, LUAJIT_TRACE_TAG | g, ret - 1))
          return 1;
        w->skip = 1;
      }
      base = jit_base;
    } else if (vmstate == LUAJIT_VMST_INTERP) {
      base = LUAJIT_BASE_REGISTER(&state->user_regs);
      pc = LUAJIT_PC_REGISTER(&state->user_regs);
      if (base <= w->bot || base > w->top || (base & 7)) {
        // Not in the VM's main body: what the VM last synced.
        if (luajit_read(&base, l + p->l_base) || luajit_read(&pc, cframe + p->cf_pc))
          goto fail;
      }
    } else {
      if (luajit_read(&base, l + p->l_base) || luajit_read(&pc, cframe + p->cf_pc))
        goto fail;
    }
  }
  w->cframe = cframe;
  w->base = base;
  w->pc = pc;
  w->next_cframe = 0;
  w->next_l = 0;
  w->next_base = 0;
  w->walking = 1;
  return 0;
fail:
  increment_runtime_metric(RUNTIME_LUAJIT, METRIC_ERR_LUAJIT_STATE);
  return -1;
}

// Ends the activation: native unwinding goes on at its C frame's caller,
// the activation outside it at next_base of the same lua_State (0: its
// own L->base).
static __always_inline void luajit_end(struct luajit_walk *w, struct unwind_state *state,
                                       const struct luajit_proc *p, u64 next_base)
{
  u64 cfa = w->cframe + p->cf_size, ra = 0, fp = 0, prev = 0;
  luajit_read(&ra, cfa - 8);
  luajit_read(&fp, cfa - 16);
  luajit_read(&prev, w->cframe + p->cf_prev);
  w->walking = 0;
  w->next_cframe = prev & ~3ULL;
  w->next_l = w->l;
  w->next_base = next_base;
  state->pc = ra & USER_ADDRESS_MASK;
  state->sp = cfa;
  state->fp = fp;
  state->return_address = 1;
}

// Walks the Lua frames of the activation. Returns a runtime_walk.
static __always_inline int luajit_walk_frames(struct luajit_walk *w, struct unwind_state *state,
                                              struct trace *t, const struct luajit_proc *p)
{
  for (int i = 0; i < LUAJIT_FRAMES_PER_RUN; i++) {
    u64 base = w->base;
    if (base <= w->bot) {
      luajit_end(w, state, p, 0);
      return RUNTIME_WALK_DONE;
    }
    u64 slots[2];
    if (base > w->top || (base & 7) ||
        bpf_probe_read_user(slots, sizeof(slots), (void *)(base - 16)))
      goto bad;
    u64 fn = slots[0] & LUAJIT_GCVMASK, link = slots[1];
    // A slot that holds no function is a frame being torn down (a fast
    // function storing its results over it): not reported, its link
    // still leads on.
    if (!w->skip && fn != w->l && (slots[0] >> 47) == LUAJIT_FUNC_TAG) {
      u8 ffid;
      u64 bc;
      if (!fn || bpf_probe_read_user(&ffid, sizeof(ffid), (void *)(fn + p->fn_ffid)))
        goto bad;
      if (ffid == 0) {
        if (luajit_read(&bc, fn + p->fn_pc) || bc < p->proto_size)
          goto bad;
        increment_runtime_metric(RUNTIME_LUAJIT, METRIC_LUAJIT_FRAMES);
        w->frames++;
        if (push_runtime_frame(t, RUNTIME_LUAJIT, bc - p->proto_size, w->pc))
          return RUNTIME_WALK_FULL;
      }
    }
    w->skip = 0;
    u64 delta = link & ~(u64)LUAJIT_FRAME_TYPEP, prev;
    if ((link & LUAJIT_FRAME_TYPE) == LUAJIT_FRAME_LUA) {
      // The caller's PC: its CALL's A operand says where its base is.
      u32 ins;
      if (link < 4 || bpf_probe_read_user(&ins, sizeof(ins), (void *)(link - 4)))
        goto bad;
      prev = base - 8 * (2 + ((ins >> 8) & 0xff));
      w->pc = link;
    } else {
      if (!delta || delta > LUAJIT_MAX_DELTA || delta >= base)
        goto bad;
      prev = base - delta;
      u8 type = link & LUAJIT_FRAME_TYPEP;
      if ((link & LUAJIT_FRAME_TYPE) == LUAJIT_FRAME_C) {
        // Called from C: the activation ends; the frame below is the
        // outer activation's, at the PC its C frame saved.
        luajit_end(w, state, p, prev);
        return RUNTIME_WALK_DONE;
      } else if (type == LUAJIT_FRAME_CONT) {
        u64 cont[2];
        if (bpf_probe_read_user(cont, sizeof(cont), (void *)(base - 32)))
          goto bad;
        if (cont[0] == LUAJIT_CONT_FFI_CALLBACK) {
          luajit_end(w, state, p, prev);
          return RUNTIME_WALK_DONE;
        }
        w->pc = cont[1];
      } else if (type == LUAJIT_FRAME_VARG) {
        // The same function, at its own slot: not reported again.
        w->skip = 1;
      } else {
        // pcall: the frame below is pcall's own, whose link is Lua.
        w->pc = 0;
      }
    }
    if (prev >= base)
      goto bad;
    w->base = prev;
  }
  return RUNTIME_WALK_MORE;
bad:
  increment_runtime_metric(RUNTIME_LUAJIT, METRIC_ERR_LUAJIT_STACK);
  luajit_end(w, state, p, 0);
  w->next_cframe = 0;
  return RUNTIME_WALK_DONE;
}

// The walk of the sample being unwound, reset for a new sample.
static __always_inline struct luajit_walk *luajit_walk_of(const struct trace *t)
{
  u32 zero = 0;
  struct luajit_walk *w = bpf_map_lookup_elem(&luajit_walks, &zero);
  if (w && w->sample != t->ktime) {
    w->sample = t->ktime;
    w->walking = 0;
    w->sp = 0;
    w->next_cframe = 0;
    w->next_l = 0;
    w->next_base = 0;
  }
  return w;
}

SEC("perf_event")
int unwind_luajit(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  struct unwind_state *state = &r->state;
  struct trace *t = &r->trace;
  const struct luajit_proc *p = runtime_config(t->pid, RUNTIME_LUAJIT);
  if (!p) {
    runtime_missing(state, t->pid, RUNTIME_LUAJIT, METRIC_ERR_LUAJIT_NO_PROC);
    return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
  }
  struct luajit_walk *w = luajit_walk_of(t);
  if (!w)
    goto give_up;
  if (!w->walking || w->sp != state->sp) {
    w->sp = state->sp;
    int rc = luajit_start(w, state, t, p);
    if (rc > 0)
      goto full;
    if (rc < 0)
      goto give_up;
  }
  int walk = luajit_walk_frames(w, state, t, p);
  if (walk == RUNTIME_WALK_FULL)
    goto full;
  if (walk == RUNTIME_WALK_MORE)
    return tail_call_next(ctx, r, RUNTIME_LUAJIT);
  if (!w->frames)
    increment_runtime_metric(RUNTIME_LUAJIT, METRIC_LUAJIT_EMPTY_ACTIVATIONS);
  if (state->pc < MIN_CODE_ADDRESS)
    return tail_call_stop(ctx);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
give_up:
  // The native unwinder unwinds the frame at the PC as native code.
  runtime_give_up(state, RUNTIME_LUAJIT);
  return tail_call_next(ctx, r, PROG_UNWIND_NATIVE);
full:
  increment_metric(METRIC_TRUNCATED_TRACES);
  return tail_call_stop(ctx);
}

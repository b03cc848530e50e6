// The Perl 5 unwinder (runtime RUNTIME_PERL), for threaded perls
// (ithreads, as Debian builds them); user space offers x86_64 only. The
// native unwinder hands over at each frame of the runops loop
// (Perl_runops_standard, or Perl_runops_debug) after stepping past it; this
// program reports the Perl frames that call of the loop runs, innermost
// first, and hands back.
//
// Perl keeps no frame list of its own: a sub call pushes a context (struct
// context, cop.h) on the context stack of the current run level (struct
// stackinfo), and run levels are linked outward by si_prev. A call from
// Perl to Perl stays in the same runops loop; a new loop starts only where
// C calls back into Perl (call_sv, MULTICALL, sort, magic, signal
// handlers), and the sub context it pushes has no return op (retop NULL),
// its run level possibly new. So a call of the loop owns the contexts from
// where the previous one stopped down to and including the first sub or
// eval context with retop NULL (with the eval {} scope call_sv(G_EVAL)
// pushes right below it) or to the bottom of its run level; the outermost
// also reports the file-level code, "main". XS code, the parser and the
// regex engine show as native frames between those groups
// (interpreter/perl/internals.md §7).
//
// Each frame's position is a COP (the statement): the innermost frame's is
// PL_curcop, a context's blk_oldcop is the statement of the frame that
// pushed it (§5). The interpreter (my_perl, the thread's context) is the
// value bound to the pthread key PL_thr_key in every version (§1.4).
//
// Its frames: file_id is the sub's CV for a sub or format frame, or a
// perl_frame_tag; addr is the COP of the frame's current statement.
#include "tracemgmt.h"

// file_id of the frames that are not subs (user space names them).
enum perl_frame_tag {
  // The file-level code at the bottom of the main run level.
  PERL_FRAME_MAIN = 1,
  // An eval context: PERL_FRAME_EVAL | its cx_type (0x0b require or do
  // FILE, 0x2b eval STRING, 0x4b eval BLOCK or call_sv(G_EVAL)).
  PERL_FRAME_EVAL = 0x100,
};

// Context types and flags (cop.h, the same in 5.32-5.40).
#define PERL_CXTYPEMASK 0x0f
#define PERL_CXT_SUB    9
#define PERL_CXT_FORMAT 10
#define PERL_CXT_EVAL   11
// CXp_SUB_RE_FAKE on a sub (a regex code block's fake re-entry) and CXp_TRY
// on an eval (try {}): no frame of their own, as caller() shows none.
#define PERL_CXP_NO_FRAME 0x80
// CXp_EVALBLOCK (CXp_TRYBLOCK in 5.32): eval {} or call_sv(G_EVAL).
#define PERL_CXP_EVALBLOCK 0x40
// si_type of the main run level (PERLSI_MAIN).
#define PERL_SI_MAIN 1
// A context stack holds at most this many contexts (a sanity bound: deep
// recursion reaches thousands).
#define PERL_MAX_CONTEXTS (1 << 20)
// Run levels walked at most in one sample.
#define PERL_MAX_RUN_LEVELS 64
// Contexts one run of this program looks at before it tail-calls itself.
#define PERL_CONTEXTS_PER_RUN 24

// What the Perl unwinder needs of a perl process (its entry in
// runtime_procs); user space fills it from package perl's tables.
struct perl_proc {
  // The process address of PL_thr_key (a u32), read per sample: perl
  // creates the key first thing, maybe after user space looked.
  u64 thr_key_addr;
  // The interrupted thread's interpreter is the value bound to the key,
  // found as the C library's pthread_getspecific does, from the thread
  // pointer tp, for keys below tsd_max_key:
  //   base = tsd_self_deref ? *(tp + tsd_self_offset) : tp
  //   block = base + tsd_block_offset, then *block if tsd_block_deref
  //   my_perl = *(block + key * tsd_entry_size + tsd_data_offset)
  s64 tsd_self_offset;
  s64 tsd_block_offset;
  s64 tsd_data_offset;
  u32 tsd_entry_size;
  u32 tsd_max_key;
  u8 tsd_self_deref;
  u8 tsd_block_deref;
  u8 pad[2];
  // Byte offsets in struct interpreter: Icurcop and Icurstackinfo.
  u16 interp_curcop;
  u16 interp_curstackinfo;
};
_Static_assert(sizeof(struct perl_proc) <= RUNTIME_PROC_SIZE, "perl_proc too large");

// struct stackinfo (PERL_SI), the same in 5.32-5.40 (user space checks its
// layouts against it).
struct perl_si {
  u64 stack;
  u64 cxstack;
  u64 prev;
  u64 next;
  s32 cxix;
  s32 cxmax;
  s32 cxsubix;
  s32 type;
};

// The first bytes of struct context (PERL_CONTEXT) as the unwinder reads
// them: cx_type, blk_oldcop, blk_sub.retop (blk_eval.retop) and
// blk_sub.cv. stride is sizeof(PERL_CONTEXT).
struct perl_cx {
  u8 type;
  u8 gimme;
  u16 u16;
  u32 pad;
  u64 oldsp;
  u64 oldcop;
  u64 blk_u[3];
  u64 retop;
  u64 old_cxsubix;
  u64 old_namesv;
  u64 cv;
};
#define PERL_CX_STRIDE 104

// The runtime's counters (runtime_metrics), reported by user space under the
// lower-case name without the METRIC_ prefix.
enum perl_metric {
  // Perl frames reported (main included).
  METRIC_PERL_FRAMES,
  // A runops frame in a process user space has not (yet) described: the
  // native frame is reported, and user space is told.
  METRIC_ERR_PERL_NO_PROC,
  // The thread's interpreter (or its current run level) could not be read:
  // a thread that never ran perl, a key not created yet.
  METRIC_ERR_PERL_INTERPRETER,
  // Reading a run level or a context failed, or one was out of bounds.
  METRIC_ERR_PERL_CONTEXT_READ,
  // A runops frame had no Perl frame left to report (a sort block's loop,
  // or the walk already ended): the native frame is reported.
  METRIC_ERR_PERL_NO_FRAME,
  // More run levels than PERL_MAX_RUN_LEVELS.
  METRIC_ERR_PERL_RUN_LEVELS,
  METRIC_PERL_COUNT,
};
_Static_assert(METRIC_PERL_COUNT <= RUNTIME_METRICS_MAX, "too many perl metrics");

// Where the Perl unwinder is in a sample.
struct perl_walk {
  // The sample (its ktime) this walk belongs to: a walk of an earlier
  // sample is started afresh.
  u64 sample;
  // The current run level's context stack and type, the index of the next
  // context to look at (-1 past the bottom), the statement the next frame
  // is at.
  u64 si;
  u64 cxstack;
  u64 cop;
  s32 ix;
  s32 si_type;
  // The CFA of the runops frame being reported, and the frames reported
  // for it.
  u64 call_cfa;
  u32 call_frames;
  // Contexts looked at for it.
  u32 call_looked;
  u32 run_levels;
  // The thread's interpreter was found; the walk reported main; the call
  // being reported met its entry context (retop NULL): it ends unless the
  // next context is call_sv's eval {} scope.
  u8 started;
  u8 done;
  u8 entry_seen;
  u8 pad;
};

// Never read: puts the structs user space mirrors into the BTF.
volatile const struct perl_btf_exports {
  struct perl_proc perl_proc;
  struct perl_si perl_si;
  struct perl_cx perl_cx;
  enum perl_metric perl_metric;
  enum perl_frame_tag perl_frame_tag;
} perl_btf_exports __attribute__((used));

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, u32);
  __type(value, struct perl_walk);
} perl_walks SEC(".maps");

// Makes si the current run level. Returns 0 when it could be read.
static __always_inline int perl_enter_si(struct perl_walk *w, u64 si)
{
  struct perl_si s;
  if (!si || bpf_probe_read_user(&s, sizeof(s), (void *)si))
    return -1;
  if (s.cxix < -1 || s.cxix > s.cxmax || s.cxmax >= PERL_MAX_CONTEXTS || !s.cxstack)
    return -1;
  if (++w->run_levels > PERL_MAX_RUN_LEVELS) {
    increment_runtime_metric(RUNTIME_PERL, METRIC_ERR_PERL_RUN_LEVELS);
    return -1;
  }
  w->si = si;
  w->cxstack = s.cxstack;
  w->ix = s.cxix;
  w->si_type = s.type;
  return 0;
}

// Finds the interrupted thread's interpreter, its current statement and
// run level. Returns 0 when found.
static __always_inline int perl_start(struct perl_walk *w, const struct perl_proc *proc)
{
  u64 tp = thread_pointer(), base = tp, block, my_perl, cop, si;
  u32 key;
  if (!tp || bpf_probe_read_user(&key, sizeof(key), (void *)proc->thr_key_addr) ||
      key >= proc->tsd_max_key)
    goto fail;
  if (proc->tsd_self_deref &&
      bpf_probe_read_user(&base, sizeof(base), (void *)(tp + proc->tsd_self_offset)))
    goto fail;
  block = base + proc->tsd_block_offset;
  if (proc->tsd_block_deref && bpf_probe_read_user(&block, sizeof(block), (void *)block))
    goto fail;
  block += (u64)key * proc->tsd_entry_size + proc->tsd_data_offset;
  if (bpf_probe_read_user(&my_perl, sizeof(my_perl), (void *)block) || !my_perl)
    goto fail;
  if (bpf_probe_read_user(&cop, sizeof(cop), (void *)(my_perl + proc->interp_curcop)) ||
      bpf_probe_read_user(&si, sizeof(si), (void *)(my_perl + proc->interp_curstackinfo)) || !si)
    goto fail;
  w->run_levels = 0;
  if (perl_enter_si(w, si))
    goto fail;
  w->cop = cop;
  w->started = 1;
  return 0;
fail:
  increment_runtime_metric(RUNTIME_PERL, METRIC_ERR_PERL_INTERPRETER);
  return -1;
}

// Pushes a Perl frame at the pending statement; returns RUNTIME_WALK_FULL
// when the trace is full.
static __always_inline int perl_push(struct perl_walk *w, struct trace *t, u64 id)
{
  w->call_frames++;
  increment_runtime_metric(RUNTIME_PERL, METRIC_PERL_FRAMES);
  return push_runtime_frame(t, RUNTIME_PERL, id, w->cop) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

// Reports the file-level code below every context of the main run level:
// the walk ends.
static __always_inline int perl_push_main(struct perl_walk *w, struct trace *t)
{
  w->done = 1;
  return perl_push(w, t, PERL_FRAME_MAIN);
}

// Reports the contexts of one runops call (see the top of this file).
static __always_inline int perl_walk_call(struct perl_walk *w, struct unwind_state *state,
                                          struct trace *t)
{
  for (int i = 0; i < PERL_CONTEXTS_PER_RUN; i++) {
    if (w->ix < 0) {
      if (w->si_type == PERL_SI_MAIN)
        return perl_push_main(w, t);
      // The bottom of a run level pushed for C code calling back: the
      // next runops call down runs the outer one, unless this call has
      // not looked at a context yet.
      u64 si;
      if (bpf_probe_read_user(&si, sizeof(si), (void *)(w->si + 16)) || perl_enter_si(w, si))
        goto fail;
      if (w->call_looked)
        return RUNTIME_WALK_DONE;
      continue;
    }
    struct perl_cx cx;
    if (bpf_probe_read_user(&cx, sizeof(cx),
                            (void *)(w->cxstack + (u64)(u32)w->ix * PERL_CX_STRIDE)))
      goto fail;
    u8 type = cx.type & PERL_CXTYPEMASK;
    int sub = (type == PERL_CXT_SUB || type == PERL_CXT_FORMAT) && !(cx.type & PERL_CXP_NO_FRAME);
    int eval = type == PERL_CXT_EVAL && !(cx.type & PERL_CXP_NO_FRAME);
    int entry = !cx.retop;
    if (w->entry_seen) {
      // call_sv(G_EVAL) pushes its eval {} scope before the sub: it goes
      // with the sub's runops call; anything else belongs to the next.
      if (!eval || !entry || !(cx.type & PERL_CXP_EVALBLOCK))
        return RUNTIME_WALK_DONE;
      sub = 0;
    }
    w->call_looked++;
    w->ix--;
    if (!sub && !eval)
      continue;
    if (!cx.oldcop)
      goto fail;
    if (perl_push(w, t, sub ? cx.cv : PERL_FRAME_EVAL | cx.type) == RUNTIME_WALK_FULL)
      return RUNTIME_WALK_FULL;
    w->cop = cx.oldcop;
    if (entry) {
      // The context C code pushed when it called back into Perl.
      if (!sub)
        return RUNTIME_WALK_DONE;
      w->entry_seen = 1;
    }
  }
  return RUNTIME_WALK_MORE;
fail:
  // What is left of the context stack cannot be trusted: the runops
  // frames from here on are reported as native.
  increment_runtime_metric(RUNTIME_PERL, METRIC_ERR_PERL_CONTEXT_READ);
  runtime_give_up(state, RUNTIME_PERL);
  return RUNTIME_WALK_DONE;
}

// The walk of the sample being unwound, started afresh for a new sample.
static __always_inline struct perl_walk *perl_walk_of(const struct trace *t)
{
  u32 zero = 0;
  struct perl_walk *w = bpf_map_lookup_elem(&perl_walks, &zero);
  if (w && w->sample != t->ktime) {
    w->sample = t->ktime;
    w->started = 0;
    w->done = 0;
    w->call_cfa = 0;
  }
  return w;
}

static __always_inline int perl_unwind_call(struct unwind_state *state, struct trace *t,
                                            const struct perl_proc *proc)
{
  const struct runtime_handoff *h = &state->handoff;
  if (!proc) {
    runtime_missing(state, t->pid, RUNTIME_PERL, METRIC_ERR_PERL_NO_PROC);
    return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
  }
  struct perl_walk *w = perl_walk_of(t);
  if (!w || (!w->started && perl_start(w, proc))) {
    runtime_give_up(state, RUNTIME_PERL);
    return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
  }
  if (w->call_cfa != h->cfa) {
    // The first run for this runops frame (not a continuation).
    w->call_cfa = h->cfa;
    w->call_frames = 0;
    w->call_looked = 0;
    w->entry_seen = 0;
  }
  int rc = RUNTIME_WALK_DONE;
  if (!w->done)
    rc = perl_walk_call(w, state, t);
  if (rc != RUNTIME_WALK_DONE)
    return rc;
  // The main run level is left with no context: no runops call runs
  // below (an ithread's entry sub, END blocks), the file-level code goes
  // with this one.
  if (!w->done && w->ix < 0 && w->si_type == PERL_SI_MAIN && runtime_active(state, RUNTIME_PERL) &&
      perl_push_main(w, t) == RUNTIME_WALK_FULL)
    return RUNTIME_WALK_FULL;
  if (w->call_frames)
    return RUNTIME_WALK_DONE;
  if (runtime_active(state, RUNTIME_PERL))
    increment_runtime_metric(RUNTIME_PERL, METRIC_ERR_PERL_NO_FRAME);
  return runtime_report_native(h, t) ? RUNTIME_WALK_FULL : RUNTIME_WALK_DONE;
}

SEC("perf_event")
int unwind_perl(struct bpf_perf_event_data *ctx)
{
  struct record *r = get_record();
  if (!r)
    return 0;
  const struct perl_proc *proc = runtime_config(r->trace.pid, RUNTIME_PERL);
  int walk = perl_unwind_call(&r->state, &r->trace, proc);
  if (walk != RUNTIME_WALK_DONE)
    return runtime_walk_on(ctx, r, RUNTIME_PERL, walk);
  return runtime_return(ctx, r);
}

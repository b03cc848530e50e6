// Minimal, self-contained BPF definitions: types, map declaration macros and
// the helpers we call. We avoid the host's kernel and libbpf headers so that
// the objects build the same for x86_64 and arm64 on any machine with the
// pinned clang (see the Makefile).
#ifndef BPFDEFS_H
#define BPFDEFS_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed int s32;
typedef signed long long s64;

#define SEC(name)         __attribute__((section(name), used))
#define __always_inline   inline __attribute__((always_inline))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name
#define likely(x)         __builtin_expect(!!(x), 1)
#define unlikely(x)       __builtin_expect(!!(x), 0)

// Map types and flags from include/uapi/linux/bpf.h.
enum {
  BPF_MAP_TYPE_HASH = 1,
  BPF_MAP_TYPE_ARRAY = 2,
  BPF_MAP_TYPE_PROG_ARRAY = 3,
  BPF_MAP_TYPE_PERCPU_ARRAY = 6,
  BPF_MAP_TYPE_LPM_TRIE = 11,
  BPF_MAP_TYPE_LRU_HASH = 9,
  BPF_MAP_TYPE_RINGBUF = 27,
};
#define BPF_ANY           0
#define BPF_F_NO_PREALLOC 1
#define BPF_F_MMAPABLE    (1U << 10)
// bpf_ringbuf_output flags and bpf_ringbuf_query selectors.
#define BPF_RB_NO_WAKEUP    1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA   0

// Helper ids from include/uapi/linux/bpf.h (enum bpf_func_id).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value,
                                   u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static u32 (*bpf_get_prandom_u32)(void) = (void *)7;
static u32 (*bpf_get_smp_processor_id)(void) = (void *)8;
static long (*bpf_tail_call)(void *ctx, void *prog_array_map, u32 index) = (void *)12;
static u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_get_current_comm)(void *buf, u32 size_of_buf) = (void *)16;
static u64 (*bpf_get_current_task)(void) = (void *)35;
static long (*bpf_get_stack)(void *ctx, void *buf, u32 size, u64 flags) = (void *)67;
static long (*bpf_probe_read_user)(void *dst, u32 size, const void *unsafe_ptr) = (void *)112;
static long (*bpf_probe_read_kernel)(void *dst, u32 size, const void *unsafe_ptr) = (void *)113;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, u64 size, u64 flags) = (void *)130;
static u64 (*bpf_ringbuf_query)(void *ringbuf, u64 flags) = (void *)134;
static struct task_struct *(*bpf_get_current_task_btf)(void) = (void *)158;
static long (*bpf_task_pt_regs)(struct task_struct *task) = (void *)175;
static long (*bpf_find_vma)(struct task_struct *task, u64 addr, void *callback_fn,
                            void *callback_ctx, u64 flags) = (void *)180;

// The kernel fields we read, relocated by CO-RE against the running kernel's
// BTF when the object is loaded.
#define PF_KTHREAD 0x00200000
#define PF_EXITING 0x00000004
typedef struct {
  int counter;
} atomic_t;
struct signal_struct {
  // Live threads of the group; zero once the last one is exiting.
  atomic_t live;
} __attribute__((preserve_access_index));
// The task's saved thread pointer (arch/x86/include/asm/processor.h;
// arch/arm64/include/asm/processor.h, where it is in an anonymous struct).
#if defined(__TARGET_ARCH_x86)
struct thread_struct {
  unsigned long fsbase;
} __attribute__((preserve_access_index));
#  define TASK_THREAD_POINTER fsbase
#else
struct thread_struct {
  struct {
    unsigned long tp_value;
  } uw;
} __attribute__((preserve_access_index));
#  define TASK_THREAD_POINTER uw.tp_value
#endif
// What bpf_find_vma's callback reads of a VMA and its file.
struct super_block {
  u32 s_dev;
} __attribute__((preserve_access_index));
struct inode {
  unsigned long i_ino;
  struct super_block *i_sb;
} __attribute__((preserve_access_index));
struct file {
  struct inode *f_inode;
} __attribute__((preserve_access_index));
// The program a process runs: its file and where the kernel's ELF loader
// put its executable segments (fs/binfmt_elf.c, load_elf_binary: the
// lowest PF_X p_vaddr and the highest PF_X p_vaddr + p_filesz, plus the
// load bias).
struct mm_struct {
  unsigned long start_code;
  unsigned long end_code;
  struct file *exe_file;
} __attribute__((preserve_access_index));
struct task_struct {
  unsigned int flags;
  void *stack;
  struct signal_struct *signal;
  struct thread_struct thread;
  struct mm_struct *mm;
  int pid;
  int tgid;
  // The task's state (0: TASK_RUNNING), since 5.14; state before.
  unsigned int __state;
  struct task_struct *real_parent;
} __attribute__((preserve_access_index));
struct task_struct___before_5_14 {
  long state;
} __attribute__((preserve_access_index));
struct vm_area_struct {
  unsigned long vm_start;
  unsigned long vm_end;
  // A member of an anonymous union since 6.3; CO-RE finds it there.
  unsigned long vm_flags;
  unsigned long vm_pgoff;
  struct file *vm_file;
} __attribute__((preserve_access_index));
#define VM_EXEC 0x4

// Whether the running kernel has the field (a CO-RE relocation: a
// branch on it that the kernel lacks is dead code to the verifier).
#define CORE_FIELD_EXISTS(field) __builtin_preserve_field_info(field, 2)

// Reads a kernel field through a CO-RE relocated address.
#define CORE_READ_KERNEL(dst, src)                                                                 \
  bpf_probe_read_kernel(dst, sizeof(*(dst)), __builtin_preserve_access_index(src))

// User-space register sets, as the kernel saves them on entry, for the
// architectures we build for. bpf_perf_event_data starts with these.
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
  u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax;
  u64 ip, cs, flags, sp, ss;
};
#  define THREAD_SIZE (16 * 1024)
static __always_inline int regs_in_kernel(const struct pt_regs *r) { return (r->cs & 3) == 0; }
#  define REGS_PC(r)        ((r)->ip)
#  define REGS_SP(r)        ((r)->sp)
#  define REGS_FP(r)        ((r)->bp)
#  define REGS_LR(r)        0
#  define REGS_PARM1(r)     ((r)->di)
#  define USER_ADDRESS_MASK (~0ULL)
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
  u64 regs[31];
  u64 sp, pc, pstate;
};
#  define THREAD_SIZE       (16 * 1024)
// PSR_MODE_MASK is 0xf; EL0t (user mode) is 0.
static __always_inline int regs_in_kernel(const struct pt_regs *r)
{
  return (r->pstate & 0xf) != 0;
}
#  define REGS_PC(r)        ((r)->pc)
#  define REGS_SP(r)        ((r)->sp)
#  define REGS_FP(r)        ((r)->regs[29])
#  define REGS_LR(r)        ((r)->regs[30])
#  define REGS_PARM1(r)     ((r)->regs[0])
// User addresses fit in 48 bits; a signed pointer carries its PAC above.
#  define USER_ADDRESS_MASK 0x0000ffffffffffffULL
#else
#  error "define __TARGET_ARCH_x86 or __TARGET_ARCH_arm64"
#endif

struct bpf_perf_event_data {
  struct pt_regs regs;
  u64 sample_period;
  u64 addr;
};

// A raw tracepoint's arguments (the tracepoint's TP_PROTO).
struct bpf_raw_tracepoint_args {
  u64 args[0];
};

#endif // BPFDEFS_H

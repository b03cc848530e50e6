/* Compiled without unwind tables but with -g: its CFI is in .debug_frame. */
extern int mid(int);
__attribute__((noinline)) int dbg_callee(int x) { return mid(x) * 2; }
int dbg_caller(int x) { volatile int a[8]; a[x & 7] = x; return dbg_callee(a[1]) + 1; }

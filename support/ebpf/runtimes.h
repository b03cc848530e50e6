// The registry of language runtimes with a BPF unwinder: one line each in
// enum runtime_id, and its unwinder <name>.ebpf.c included by tracer.ebpf.c.
// The core (the native unwinder, the maps) knows a runtime only by its id.
#ifndef RUNTIMES_H
#define RUNTIMES_H

// A runtime's id is at once the frame kind of its frames (enum frame_kind
// takes 0-3), its slot in the progs map (the program unwind_<name>, for
// RUNTIME_<NAME>; enum prog_id takes 0-3) and its half of the key of its
// per-process configuration in runtime_procs. Ids are never reused; the Go
// registry (package interpreter) names the same ids.
enum runtime_id {
  RUNTIME_FIRST = 4,
  RUNTIME_CPYTHON = 4,
  RUNTIME_JVM = 5,
  RUNTIME_V8 = 6,
  RUNTIME_RUBY = 7,
  RUNTIME_PHP = 8,
  RUNTIME_PERL = 9,
  RUNTIME_BEAM = 10,
  RUNTIME_LUAJIT = 11,
  // Ids stay below this: a u32 bit mask holds one bit per runtime.
  RUNTIME_MAX = 32,
};

// The room for one runtime's per-process configuration in runtime_procs; a
// runtime's struct asserts that it fits.
#define RUNTIME_PROC_SIZE 128
// Counters per runtime in runtime_metrics (its enum <name>_metric).
#define RUNTIME_METRICS_MAX 16

#endif // RUNTIMES_H

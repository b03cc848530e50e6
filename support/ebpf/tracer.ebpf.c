// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// The one compilation unit of the BPF object: every program of the unwind
// chain plus the process exit and exec probes, sharing the maps of tracemgmt.h.
#include "sample_entry.ebpf.c"
#include "native_stack.ebpf.c"
#include "unwind_stop.ebpf.c"
#include "process_events.ebpf.c"
#include "off_cpu.ebpf.c"

// The runtimes' unwinders (registry: runtimes.h), one line each.
#include "cpython.ebpf.c"
#include "jvm.ebpf.c"
#include "v8.ebpf.c"
#include "ruby.ebpf.c"
#include "php.ebpf.c"
#include "perl.ebpf.c"
#include "beam.ebpf.c"
#include "luajit.ebpf.c"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

package integration

import (
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// stackString renders a trace leaf first as "name;name;...", kernel frames
// as "k:name". A frame the profiler could not name shows as "?" followed
// by its file's base name, e.g. "?libc.so.6", except that frames of the
// stripped binary the profiler cannot name are named with the symbols it
// had.
func stackString(tr *libpf.Trace, stripped string, syms *symbolTable) string {
	parts := make([]string, len(tr.Frames))
	for i, f := range tr.Frames {
		name := f.FunctionName
		if name == "" && f.Mapping != nil && f.Mapping.Path == stripped && syms != nil {
			name = syms.lookup(f.Address)
		}
		if name == "" {
			name = "?"
			if f.Mapping != nil {
				name += filepath.Base(f.Mapping.Path)
			}
		}
		if f.Kind == libpf.FrameKernel {
			name = "k:" + name
		}
		parts[i] = name
	}
	return strings.Join(parts, ";")
}

// unwindCase is a workload without frame pointers and the stack its hot
// path must show.
type unwindCase struct {
	name string
	// build returns the binary to run; when it strips the binary it also
	// returns the symbols to name its frames in the test.
	build func(t *testing.T) (bin string, syms *symbolTable)
	// stack matches stackString of a sample on the hot path, from the leaf
	// down to the root of the thread (userStack).
	stack *regexp.Regexp
	// minShare is the share of the process's samples that must match.
	minShare float64
	// elsewhere matches whole stacks of the process's other work (the Go
	// runtime's scheduler and system threads), left out of the share:
	// how many there are depends on the machine's speed, not on the
	// unwinder.
	elsewhere *regexp.Regexp
	// arches are the architectures the case runs on; nil: all.
	arches []string
}

// userStack matches a whole stack whose user part matches pattern, under
// any kernel frames: a sample taken while the kernel ran on the workload's
// behalf (an interrupt, a system call) has the same user stack.
func userStack(pattern string) *regexp.Regexp {
	return regexp.MustCompile(`^(k:[^;]*;)*` + pattern + `$`)
}

// cRoot is the bottom of a C program's main thread: glibc's start code,
// named from .dynsym where Debian's stripped libc exports it, then the
// executable's _start.
const cRoot = `main;(__libc_start_call_main|\?libc\.so\.6);__libc_start_main[^;]*;_start`

var unwindCases = []unwindCase{
	{
		name: "C -O2 -fomit-frame-pointer, stripped",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    userStack(`cf_leaf;cf_mid;cf_top;` + cRoot),
		minShare: 0.95,
	},
	{
		// libc's qsort has no frame pointers and no .symtab on Debian: its
		// frames are unwound with its .eh_frame and may be unnamed. Samples
		// in qsort's own code (more of them under emulation, where memory
		// moves cost more than the comparison) have no qs_compare.
		name: "libc qsort calling back",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "qsortcb", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    userStack(`(qs_compare;)?([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*)(;([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*))*;qs_top;` + cRoot),
		minShare: 0.90,
	},
	{
		// The vDSO is no file: its deltas come from its image in memory
		// (x86_64 names its entry __vdso_clock_gettime, arm64
		// __kernel_clock_gettime).
		// Where the clock source has no vDSO support (HPET in the kernel
		// matrix's VMs), the vDSO makes the system call: kernel frames on
		// top.
		name: "vDSO clock_gettime",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "vdsoclock", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    userStack(`(([^;]*vdso[^;]*|__kernel_clock_gettime);)*((__)?clock_gettime[^;]*;|\?libc\.so\.6;)?vc_top;` + cRoot),
		minShare: 0.95,
	},
	{
		name:     "C++ recursion 50 deep through its own library",
		build:    buildRecursion,
		stack:    userStack(`rec_leaf;(rec_lib;rec_exe;){25}` + cRoot),
		minShare: 0.95,
	},
	{
		name:      "Go, stripped",
		build:     func(t *testing.T) (string, *symbolTable) { return buildGo(t, "gochain") },
		stack:     userStack(`main\.goLeaf;main\.goMid;main\.goTop;main\.main;runtime\.main;runtime\.goexit`),
		minShare:  0.95,
		elsewhere: goRuntimeStack,
	},
	{
		// The C leaf runs on the system stack; the unwinder must cross
		// back to the goroutine's stack in runtime.asmcgocall. Samples in
		// the runtime's return from the call (exitsyscall: more of them
		// under emulation, where reading the clock is slow) are whole
		// too. On arm64 asmcgocall loads the system stack's frame
		// pointer before the call, so the way back is the goroutine's SP
		// it saved on the system stack (CFAGoCgo). So are the samples in
		// the loop's reading of the clock (time.Now from main.main),
		// which an emulated HPET makes slow.
		name:  "cgo, stripped",
		build: func(t *testing.T) (string, *symbolTable) { return buildGo(t, "cgochain") },
		stack: userStack(`(((c_leaf;([^;]*Cfunc_c_leaf[^;]*;)?|gosave_systemstack_switch;)runtime\.asmcgocall;|([^;]*;)*runtime\.exitsyscall;)(runtime\.cgocall;)?main\._Cfunc_c_leaf;main\.goTop|` +
			`([^;]*;)*time\.Now);main\.main;runtime\.main;runtime\.goexit`),
		minShare:  0.95,
		elsewhere: goRuntimeStack,
	},
	{
		// Rust's standard library is built without frame pointers; its
		// names are mangled (legacy scheme: _ZN9rustchain7rs_leaf17h…E)
		// and shown demangled.
		name:     "Rust release build",
		build:    buildRust,
		stack:    userStack(`rustchain::rs_leaf;rustchain::rs_mid;rustchain::rs_top;rustchain::main;.*;` + cRoot),
		minShare: 0.90,
	},
	{
		// The return addresses signed (arm64 pointer authentication; the
		// kernel matrix's arm64 VMs emulate a CPU that has it): the
		// unwinder must strip the signature from each one it reads.
		name: "C -O2 -fomit-frame-pointer, return addresses signed, stripped",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer", "-mbranch-protection=pac-ret+leaf")
			return bin, stripCopy(t, bin)
		},
		stack:    userStack(`cf_leaf;cf_mid;cf_top;` + cRoot),
		minShare: 0.95,
		arches:   []string{"arm64"},
	},
}

// goRuntimeStack matches a whole stack of the Go runtime's own: a system
// thread's (from runtime.mstart, sysmon's reading the clock through the
// vDSO), the scheduler's after a goroutine switch or stack growth (from
// runtime.mcall or runtime.morestack, where unwinding stops by design),
// or an asynchronous preemption's signal handler over a goroutine (the
// handler's frames, libc's signal return, then the goroutine's down to
// runtime.goexit). Under emulation, where the clock is slow, these were
// 4.8% of a cgo workload's samples (amd64 5.10 and 6.1 VMs, 94.9%).
var goRuntimeStack = userStack(`(((internal/)?runtime[./][^;]*;|__vdso_[^;]*;)*runtime\.(mstart|mcall|morestack)|` +
	`((internal/)?runtime[./][^;]*;)*runtime\.sigtramp;\?libc\.so\.6;([^;]*;)*runtime\.goexit)`)

// maxWarmupSamples bounds the samples of a new process before its first
// fully unwound one: a second of CPU at testHz; two in a kernel-matrix VM,
// where the emulated daemon sets a process up many times slower and the
// amd64 VMs share the host's CPUs two at a time (two VMs at once: up to
// 109 samples, against 30 with one VM alone).
var maxWarmupSamples = func() int {
	if inVM() {
		return 2 * testHz
	}
	return testHz
}()

// TestUnwindWithoutFramePointers profiles each workload built without
// frame pointers: only stack deltas from .eh_frame or .gopclntab can
// unwind them. It logs one line per workload for the accuracy table.
func TestUnwindWithoutFramePointers(t *testing.T) {
	requireRoot(t)
	// One session for all workloads (each one's samples are its
	// process's): loading the programs takes seconds under emulation.
	var s *session
	if !preparing() {
		s = startSession(t, testHz)
	}
	for _, c := range unwindCases {
		if c.arches != nil && !slices.Contains(c.arches, targetArch()) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if s != nil {
				s.setSampling(t, false) // the compilers are not profiled
			}
			bin, syms := c.build(t)
			skipIfPreparing(t)
			s.setSampling(t, true)
			before, _ := s.tr.Metrics()
			pid, cpu := runWorkload(t, bin, 4*time.Second)
			s.waitExited(t, pid)
			metrics, _ := s.tr.Metrics()
			for k := range metrics {
				metrics[k] -= before[k]
			}

			samples := s.rec.ofPID(pid)
			warm := warmup(t, samples, bin, syms, c.stack)
			samples = samples[warm:]
			full, elsewhere := 0, 0
			misses := map[string]int{}
			for _, smp := range samples {
				switch stack := stackString(smp.trace, bin, syms); {
				case c.stack.MatchString(stack):
					full++
				case c.elsewhere != nil && c.elsewhere.MatchString(stack):
					elsewhere++
				default:
					misses[stack]++
				}
			}
			logTopStacks(t, misses, 5)
			t.Logf("BPF: %d delta frames, %d fp frames, no mapping %d, no deltas %d, stop %d, read errors %d",
				metrics["delta_frames"], metrics["fp_frames"], metrics["err_no_mapping"], metrics["err_no_deltas"],
				metrics["stop_deltas"], metrics["err_delta_read"])
			share := float64(full) / float64(max(len(samples)-elsewhere, 1))
			t.Logf("accuracy: %s: %d samples after %d of warm-up (%d of them the runtime's own), %.1f%% with the full stack",
				c.name, len(samples), warm, elsewhere, 100*share)
			if float64(len(samples)+warm) < 0.8*testHz*cpu.Seconds() {
				t.Errorf("%d samples for %.2f CPU-seconds at %d Hz", len(samples)+warm, cpu.Seconds(), testHz)
			}
			if share < c.minShare {
				t.Errorf("%.1f%% of %d samples match %s, want >= %.0f%%", 100*share, len(samples)-elsewhere, c.stack, 100*c.minShare)
			}
		})
	}
}

// logTopStacks logs the most frequent of the stacks that did not match.
func logTopStacks(t *testing.T, counts map[string]int, n int) {
	t.Helper()
	stacks := make([]string, 0, len(counts))
	for s := range counts {
		stacks = append(stacks, s)
	}
	sort.Slice(stacks, func(i, j int) bool { return counts[stacks[i]] > counts[stacks[j]] })
	for _, s := range stacks[:min(n, len(stacks))] {
		t.Logf("%d samples without the expected stack: %s", counts[s], s)
	}
}

package integration

import (
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// stackString renders a trace leaf first as "name;name;...". A frame the
// profiler could not name shows as "?" followed by its file's base name,
// e.g. "?libc.so.6", except that frames of the stripped binary the
// profiler cannot name are named with the symbols it had.
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
	// down to the root of the thread.
	stack *regexp.Regexp
	// minShare is the share of the process's samples that must match.
	minShare float64
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
		stack:    regexp.MustCompile(`^cf_leaf;cf_mid;cf_top;` + cRoot + `$`),
		minShare: 0.95,
	},
	{
		// libc's qsort has no frame pointers and no .symtab on Debian: its
		// frames are unwound with its .eh_frame and may be unnamed.
		name: "libc qsort calling back",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "qsortcb", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    regexp.MustCompile(`^qs_compare;([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*)(;([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*))*;qs_top;` + cRoot + `$`),
		minShare: 0.90,
	},
	{
		// The vDSO is no file: its deltas come from its image in memory.
		name: "vDSO clock_gettime",
		build: func(t *testing.T) (string, *symbolTable) {
			bin := buildWorkload(t, "vdsoclock", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    regexp.MustCompile(`^(([^;]*vdso[^;]*);)*((__)?clock_gettime[^;]*;|\?libc\.so\.6;)?vc_top;` + cRoot + `$`),
		minShare: 0.95,
	},
	{
		name:     "C++ recursion 50 deep through its own library",
		build:    buildRecursion,
		stack:    regexp.MustCompile(`^rec_leaf;(rec_lib;rec_exe;){25}` + cRoot + `$`),
		minShare: 0.95,
	},
	{
		name:     "Go, stripped",
		build:    func(t *testing.T) (string, *symbolTable) { return buildGo(t, "gochain") },
		stack:    regexp.MustCompile(`^main\.goLeaf;main\.goMid;main\.goTop;main\.main;runtime\.main;runtime\.goexit$`),
		minShare: 0.95,
	},
	{
		// The C leaf runs on the system stack; the unwinder must cross
		// back to the goroutine's stack in runtime.asmcgocall.
		name:     "cgo, stripped",
		build:    func(t *testing.T) (string, *symbolTable) { return buildGo(t, "cgochain") },
		stack:    regexp.MustCompile(`^c_leaf;([^;]*Cfunc_c_leaf[^;]*;)?runtime\.asmcgocall;(runtime\.cgocall;)?main\._Cfunc_c_leaf;main\.goTop;main\.main;runtime\.main;runtime\.goexit$`),
		minShare: 0.95,
	},
	{
		// Rust's standard library is built without frame pointers; its
		// names are mangled (legacy scheme: _ZN9rustchain7rs_leaf17h…E).
		name:     "Rust release build",
		build:    buildRust,
		stack:    regexp.MustCompile(`^[^;]*rs_leaf[^;]*;[^;]*rs_mid[^;]*;[^;]*rs_top[^;]*;[^;]*rustchain4main[^;]*;.*;` + cRoot + `$`),
		minShare: 0.90,
	},
}

// TestUnwindWithoutFramePointers profiles each workload built without
// frame pointers: only stack deltas from .eh_frame or .gopclntab can
// unwind them. It logs one line per workload for the accuracy table.
func TestUnwindWithoutFramePointers(t *testing.T) {
	requireRoot(t)
	for _, c := range unwindCases {
		t.Run(c.name, func(t *testing.T) {
			bin, syms := c.build(t)
			s := startSession(t, testHz)
			pid, cpu := runWorkload(t, bin, 4*time.Second)
			metrics, _ := s.tr.Metrics()
			s.stop(t)

			samples := s.rec.ofPID(pid)
			full := 0
			misses := map[string]int{}
			for _, smp := range samples {
				stack := stackString(smp.trace, bin, syms)
				if c.stack.MatchString(stack) {
					full++
				} else {
					misses[stack]++
				}
			}
			logTopStacks(t, misses, 5)
			t.Logf("BPF: %d delta frames, %d fp frames, no mapping %d, no deltas %d, stop %d, read errors %d",
				metrics["delta_frames"], metrics["fp_frames"], metrics["err_no_mapping"], metrics["err_no_deltas"],
				metrics["stop_deltas"], metrics["err_delta_read"])
			share := float64(full) / float64(max(len(samples), 1))
			t.Logf("accuracy: %s: %d samples, %.1f%% with the full stack", c.name, len(samples), 100*share)
			if float64(len(samples)) < 0.8*testHz*cpu.Seconds() {
				t.Errorf("%d samples for %.2f CPU-seconds at %d Hz", len(samples), cpu.Seconds(), testHz)
			}
			if share < c.minShare {
				t.Errorf("%.1f%% of %d samples match %s, want >= %.0f%%", 100*share, len(samples), c.stack, 100*c.minShare)
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

package integration

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// nmSymbols are a binary's function symbols from nm, to name frames of a
// stripped copy of it.
type nmSymbols struct {
	addrs []uint64
	names []string
}

func readNM(t *testing.T, bin string) *nmSymbols {
	t.Helper()
	out, err := exec.Command("nm", "-n", "--defined-only", bin).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", bin, err)
	}
	s := &nmSymbols{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || (f[1] != "T" && f[1] != "t") {
			continue
		}
		addr, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			continue
		}
		s.addrs = append(s.addrs, addr)
		s.names = append(s.names, f[2])
	}
	return s
}

func (s *nmSymbols) lookup(addr uint64) string {
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > addr }) - 1
	if i < 0 {
		return ""
	}
	return s.names[i]
}

// stripCopy strips bin in place after reading its symbols, which name the
// stripped binary's frames in the test (the profiler sees none).
func stripCopy(t *testing.T, bin string) *nmSymbols {
	t.Helper()
	syms := readNM(t, bin)
	if out, err := exec.Command("strip", "--strip-all", bin).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	return syms
}

// stackString renders a trace leaf first as "name;name;...". A frame the
// profiler could not name shows as "?" followed by its file's base name,
// e.g. "?libc.so.6", except that frames of the stripped binary the
// profiler cannot name are named with the symbols it had.
func stackString(tr *libpf.Trace, stripped string, syms *nmSymbols) string {
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
	build func(t *testing.T) (bin string, syms *nmSymbols)
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
		build: func(t *testing.T) (string, *nmSymbols) {
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
		build: func(t *testing.T) (string, *nmSymbols) {
			bin := buildWorkload(t, "qsortcb", "-O2", "-fomit-frame-pointer")
			return bin, stripCopy(t, bin)
		},
		stack:    regexp.MustCompile(`^qs_compare;([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*)(;([^;]*libc\.so\.6|msort_with_tmp[^;]*|qsort[^;]*))*;qs_top;` + cRoot + `$`),
		minShare: 0.90,
	},
	{
		// The vDSO is no file: its deltas come from its image in memory.
		name: "vDSO clock_gettime",
		build: func(t *testing.T) (string, *nmSymbols) {
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
		build:    func(t *testing.T) (string, *nmSymbols) { return buildGo(t, "gochain") },
		stack:    regexp.MustCompile(`^main\.goLeaf;main\.goMid;main\.goTop;main\.main;runtime\.main;runtime\.goexit$`),
		minShare: 0.95,
	},
	{
		// The C leaf runs on the system stack; the unwinder must cross
		// back to the goroutine's stack in runtime.asmcgocall.
		name:     "cgo, stripped",
		build:    func(t *testing.T) (string, *nmSymbols) { return buildGo(t, "cgochain") },
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

// workloadDir is utils/workloads/<name>.
func workloadDir(name string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", name)
}

func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// buildRecursion builds the C++ recursion workload and its library with
// -O2 -fomit-frame-pointer.
func buildRecursion(t *testing.T) (string, *nmSymbols) {
	src, out := workloadDir("recursion"), t.TempDir()
	flags := []string{"-O2", "-fomit-frame-pointer"}
	run(t, src, nil, "g++", append(flags, "-shared", "-fPIC", "-o", filepath.Join(out, "librec.so"), "librec.cpp")...)
	bin := filepath.Join(out, "recursion")
	run(t, src, nil, "g++", append(flags, "-o", bin, "main.cpp", "-L"+out, "-lrec", "-Wl,-rpath,"+out)...)
	return bin, nil
}

// buildGo builds a Go workload and strips it, so Go function names can
// only come from .gopclntab; the test names its C functions from the
// symbols it had.
func buildGo(t *testing.T, name string) (string, *nmSymbols) {
	bin := filepath.Join(t.TempDir(), name)
	run(t, workloadDir(name), nil, "go", "build", "-o", bin, ".")
	return bin, stripCopy(t, bin)
}

// buildRust builds the Rust workload with cargo, offline (it has no
// dependencies).
func buildRust(t *testing.T) (string, *nmSymbols) {
	if _, err := exec.LookPath("cargo"); err != nil {
		home, _ := os.UserHomeDir()
		if _, err := os.Stat(filepath.Join(home, ".cargo", "bin", "cargo")); err != nil {
			t.Fatal("cargo not found in PATH or ~/.cargo/bin")
		}
		t.Setenv("PATH", filepath.Join(home, ".cargo", "bin")+":"+os.Getenv("PATH"))
	}
	target := t.TempDir()
	run(t, workloadDir("rustchain"), nil, "cargo", "build", "--release", "--offline", "--target-dir", target)
	return filepath.Join(target, "release", "rustchain"), nil
}

package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/python"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

// pythonInterpreter is a CPython the tests profile.
type pythonInterpreter struct {
	name, path string
}

// pythonInterpreters lists the CPython 3 interpreters on the machine:
// Debian's python3 and every 3.x that pyenv installed.
func pythonInterpreters(t *testing.T) []pythonInterpreter {
	var out []pythonInterpreter
	if p, err := exec.LookPath("python3"); err == nil {
		out = append(out, pythonInterpreter{"system", p})
	}
	versions, _ := filepath.Glob(filepath.Join(pyfetch.PyenvVersions(), "3.*"))
	for _, v := range versions {
		bin := filepath.Join(v, "bin", "python3")
		if _, err := os.Stat(bin); err == nil {
			out = append(out, pythonInterpreter{filepath.Base(v), bin})
		}
	}
	// The releases pyenv lacks, from Debian unstable (make test-deps
	// fetches them): Debian's python executable run through its own C
	// library's loader.
	for _, v := range pyfetch.Fetched {
		py, err := pyfetch.Python(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pythonInterpreter{v + " (Debian sid)", py})
	}
	// Builds of the tail-calling interpreter, whose eval loop is one
	// function per instruction (utils/pyfetch/build-python-tailcall.sh).
	if runtime.GOARCH == "amd64" {
		for _, v := range pyfetch.TailCalled {
			py, err := pyfetch.TailCallPython(v)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, pythonInterpreter{v + " tail-calling (clang 19)", py})
		}
	}
	if len(out) == 0 {
		t.Fatal("no CPython 3 found (python3 on PATH or pyenv versions)")
	}
	return out
}

// pythonWorkload returns the path of utils/workloads/python/pyworkload.py
// and the line of each "# hot: NAME" marker in it.
func pythonWorkload(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "python", "pyworkload.py")
}

// markedWorkload returns the path of a script under utils/workloads and
// the line of each "# hot: NAME" marker in it.
func markedWorkload(t *testing.T, elem ...string) (string, map[string]uint32) {
	t.Helper()
	path, err := filepath.Abs(scriptPath(t, elem...))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for n := uint32(1); sc.Scan(); n++ {
		if _, name, ok := strings.Cut(sc.Text(), "# hot: "); ok {
			lines[strings.TrimSpace(name)] = n
		}
	}
	return path, lines
}

// pythonChain reports whether a trace's Python frames are exactly chain
// (leaf first), every one in file, with the leaf at line leafLine.
func pythonChain(tr *libpf.Trace, chain []string, file string, leafLine uint32) bool {
	py := framesOf(tr, python.Kind)
	if len(py) != len(chain) {
		return false
	}
	for i, f := range py {
		if f.FunctionName != chain[i] || f.SourceFile != file {
			return false
		}
	}
	return py[0].SourceLine == leafLine
}

// nativeBelow reports whether a native frame of a file whose path contains
// lib lies leafward of the innermost Python frame.
func nativeBelow(tr *libpf.Trace, lib string) bool {
	for _, f := range tr.Frames {
		if f.Kind == python.Kind {
			return false
		}
		if f.Kind == libpf.FrameNative && f.Mapping != nil && strings.Contains(filepath.Base(f.Mapping.Path), lib) {
			return true
		}
	}
	return false
}

// completeStack reports whether a trace reaches the root of its thread:
// the outermost frame is the process's entry point (_start) or, for a
// thread, the C library's thread start (clone3, which a stripped libc does
// not name; the unwinder stops there at its end-of-stack CFI; before glibc
// 2.34, start_thread in libpthread), below a runtime's frames.
func completeStack(tr *libpf.Trace) bool {
	n := len(tr.Frames)
	if n < 2 || tr.Truncated {
		return false
	}
	for _, f := range tr.Frames {
		if f.Kind == libpf.FrameAbort {
			return false
		}
	}
	last := &tr.Frames[n-1]
	if last.FunctionName == "_start" {
		return true
	}
	inLibc := func(f *libpf.Frame) bool {
		base := ""
		if f.Mapping != nil {
			base = filepath.Base(f.Mapping.Path)
		}
		// Before glibc 2.34 the files are named libc-2.NN.so and
		// libpthread-2.NN.so.
		return strings.HasPrefix(base, "libc.so") || strings.HasPrefix(base, "libc-2.") ||
			strings.HasPrefix(base, "libpthread") && f.FunctionName == "start_thread"
	}
	return inLibc(last) && slices.ContainsFunc(tr.Frames, func(f libpf.Frame) bool { return f.Kind.IsRuntime() })
}

// scriptRun is one run of a script workload: its pid and when its hot
// phase began (what runs before, the interpreter starting and the imports,
// is not the workload's hot path).
type scriptRun struct {
	pid     int
	hotFrom time.Time
	// hotTo ends the hot phase where the workload says so ("hot phase
	// from <unix time> to <unix time>"); zero: at the process's end.
	hotTo time.Time
	// output is what the workload printed.
	output string
}

// newScriptRun is the run of process pid that printed out.
func newScriptRun(t *testing.T, pid int, out string) scriptRun {
	t.Helper()
	return scriptRun{pid: pid, hotFrom: hotFrom(t, out), hotTo: hotTo(out), output: out}
}

// runScript runs a script workload to its end; it prints when its hot
// phase began ("hot phase from <unix time>").
func runScript(t *testing.T, cmd *exec.Cmd) scriptRun {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return newScriptRun(t, cmd.Process.Pid, string(out))
}

// runScripts runs script workloads at once, each to its end, and returns
// their runs in the order given. On this 2-core machine two workloads of
// one thread each run as fast as alone: the tests run pairs that way to
// halve their time (and the daemon sees a busy host, as users run it).
func runScripts(t *testing.T, cmds ...*exec.Cmd) []scriptRun {
	t.Helper()
	outs := make([]*strings.Builder, len(cmds))
	for i, cmd := range cmds {
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			for _, started := range cmds[:i] {
				_ = started.Process.Kill()
				_ = started.Wait()
			}
			t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
		}
	}
	var runs []scriptRun
	var failed []string
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, outs[i]))
			continue
		}
		runs = append(runs, newScriptRun(t, cmd.Process.Pid, outs[i].String()))
	}
	if len(failed) > 0 {
		t.Fatal(strings.Join(failed, "\n"))
	}
	return runs
}

// runScriptHeld runs a workload that, with WORKLOAD_HOLD set, says
// "holding" once its work is done and waits for its standard input to
// end: stop runs then, while the process and its memory are still there
// (under emulation the daemon symbolizes a second or more behind).
func runScriptHeld(t *testing.T, cmd *exec.Cmd, stop func()) scriptRun {
	t.Helper()
	h := startHeld(t, cmd)
	stop()
	return h.release(t)
}

// heldRun is a workload started by startHeld, holding once its work is
// done until release.
type heldRun struct {
	cmd   *exec.Cmd
	stdin io.Closer
	lines *bufio.Reader
	out   strings.Builder
	done  bool
}

// startHeld starts a workload with WORKLOAD_HOLD set and returns once it
// says "holding" (or has ended).
func startHeld(t *testing.T, cmd *exec.Cmd) *heldRun {
	t.Helper()
	h := &heldRun{cmd: cmd}
	cmd.Env = append(cmd.Environ(), "WORKLOAD_HOLD=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	h.stdin, h.lines = stdin, bufio.NewReader(r)
	t.Cleanup(func() {
		if !h.done {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		r.Close()
	})
	for {
		line, err := h.lines.ReadString('\n')
		h.out.WriteString(line)
		if line == "holding\n" || err != nil {
			return h
		}
	}
}

// release ends the workload's hold, waits for its exit and returns its
// run.
func (h *heldRun) release(t *testing.T) scriptRun {
	t.Helper()
	h.stdin.Close()
	rest, _ := io.ReadAll(h.lines)
	h.out.Write(rest)
	err := h.cmd.Wait()
	h.done = true
	out := h.out.String()
	if err != nil || !strings.Contains(out, "holding\n") {
		t.Fatalf("%s: %v (holding: %v)\n%s", strings.Join(h.cmd.Args, " "), err, strings.Contains(out, "holding\n"), out)
	}
	return newScriptRun(t, h.cmd.Process.Pid, out)
}

// runPython runs the workload in one mode.
func runPython(t *testing.T, py pythonInterpreter, script, mode string, d time.Duration) scriptRun {
	t.Helper()
	return runScript(t, pythonCommand(py, script, mode, d))
}

// pythonCommand is the command that runs the workload in one mode.
func pythonCommand(py pythonInterpreter, script, mode string, d time.Duration) *exec.Cmd {
	return exec.Command(py.path, script, mode, formatSeconds(d))
}

// framesOf returns a trace's frames of one runtime, leaf first.
func framesOf(tr *libpf.Trace, kind libpf.FrameKind) []libpf.Frame {
	var out []libpf.Frame
	for _, f := range tr.Frames {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

// stackOf is a trace's frames as the failure messages show them: the
// runtime's frames with their line (tagged), native frames by name.
func stackOf(tr *libpf.Trace, kind libpf.FrameKind, tag string) string {
	return strings.Join(stackNames(tr, kind, tag), " ")
}

// hotSamples returns the samples of the run's hot phase.
func (r scriptRun) hotSamples(t *testing.T, rec *recorder) []sample {
	all := rec.ofPID(r.pid)
	var hot []sample
	for _, s := range all {
		if !s.meta.Time.Before(r.hotFrom) && (r.hotTo.IsZero() || s.meta.Time.Before(r.hotTo)) {
			hot = append(hot, s)
		}
	}
	t.Logf("%d samples, %d of them in the hot phase", len(all), len(hot))
	return hot
}

// warmSamples are a run's hot samples from its first that ok accepts (the
// process's warm-up, at most maxWarmupSamples, is left out) and, with jit,
// from 300 ms into its hot phase: JIT code is claimed when the daemon
// reads the process's mappings, after its first samples. kind and tag
// name the runtime's frames in the failure's stacks.
func warmSamples(t *testing.T, run scriptRun, rec *recorder, jit bool, ok func(sample) bool, kind libpf.FrameKind, tag string) []sample {
	t.Helper()
	samples := run.hotSamples(t, rec)
	warm := slices.IndexFunc(samples, ok)
	if warm < 0 || warm > maxWarmupSamples {
		stacks := map[string]int{}
		for _, smp := range samples {
			stacks[stackOf(smp.trace, kind, tag)]++
		}
		logTopStacks(t, stacks, 4)
		t.Fatalf("%d hot samples before the first with the expected frames (-1: none of %d), want <= %d", warm, len(samples), maxWarmupSamples)
	}
	if jit {
		claimed := run.hotFrom.Add(300 * time.Millisecond)
		first := max(slices.IndexFunc(samples, func(smp sample) bool { return !smp.meta.Time.Before(claimed) }), 0)
		t.Logf("%d of the %d samples in the first 300 ms show the expected frames", countFunc(samples[:first], ok), first)
		warm = max(warm, first)
	}
	t.Logf("%d samples of warm-up left out", warm)
	return samples[warm:]
}

// share is n of total as a fraction, 0 for no samples.
func share(n, total int) float64 { return float64(n) / float64(max(total, 1)) }

// TestPythonStacks profiles each workload of pyworkload.py under every
// CPython 3 on the machine and checks the Python frames of its samples:
// names, files, the leaf's line, their order among the native frames, and
// which thread they belong to.
func TestPythonStacks(t *testing.T) {
	requireRoot(t)
	script, hot := pythonWorkload(t)
	// 4 s: a process's first 0.1-0.2 s (until the daemon has read its
	// maps and described its interpreter) is a small share of the run.
	const run = 4 * time.Second
	interpreters := pythonInterpreters(t)
	results := map[string][4]workloadResult{}
	for _, py := range interpreters {
		t.Run(py.name, func(t *testing.T) {
			s := startSession(t, testHz)
			// A short run first: the daemon has then seen this
			// interpreter's files, as it has on any host after its first
			// minutes; the first process after start-up waits for their
			// unwind tables (counted in docs/testing.md's note on misses).
			runPython(t, py, script, "chain", 300*time.Millisecond)
			// Two workloads at a time (runScripts).
			runs := map[string]scriptRun{}
			for _, pair := range [][2]string{{"chain", "recursion"}, {"threads", "zlib"}} {
				both := runScripts(t, pythonCommand(py, script, pair[0], run), pythonCommand(py, script, pair[1], run))
				runs[pair[0]], runs[pair[1]] = both[0], both[1]
			}
			logRuntimeMetrics(t, s, "python")
			s.stop(t)
			results[py.name] = [4]workloadResult{
				checkPythonChain(t, runs["chain"].hotSamples(t, s.rec), script, hot),
				checkPythonRecursion(t, runs["recursion"].hotSamples(t, s.rec), script, hot),
				checkPythonThreads(t, runs["threads"].hotSamples(t, s.rec), runs["threads"].pid, script, hot),
				checkPythonZlib(t, runs["zlib"].hotSamples(t, s.rec), script, hot),
			}
		})
	}
	// For the record: per interpreter and workload, the share of samples
	// with the expected Python frames, and the share whose stack reaches
	// its thread's root (the interpreter's main, or its thread entry).
	var table strings.Builder
	table.WriteString("\n| CPython | chain | recursion 40 | 4 threads | zlib (libz beneath) |\n|---|---|---|---|---|\n")
	for _, py := range interpreters {
		r, ok := results[py.name]
		if !ok {
			continue
		}
		fmt.Fprintf(&table, "| %s |", py.name)
		for _, w := range r {
			fmt.Fprintf(&table, " %.1f%% (complete %.1f%%) |", 100*w.expected, 100*w.complete)
		}
		table.WriteString("\n")
	}
	t.Log(table.String())
}

// workloadResult is how one workload's samples came out: the share with
// the expected frames and the share with a complete stack.
type workloadResult struct{ expected, complete float64 }

// stackNames lists a trace's frames for a message: a runtime's frames
// (kind) as tag:function:line, native ones by name or file and address.
func stackNames(tr *libpf.Trace, kind libpf.FrameKind, tag string) []string {
	var names []string
	for _, f := range tr.Frames {
		switch {
		case f.Kind == kind:
			names = append(names, fmt.Sprintf("%s:%s:%d", tag, f.FunctionName, f.SourceLine))
		case f.FunctionName != "":
			names = append(names, f.FunctionName)
		case f.Mapping != nil:
			names = append(names, fmt.Sprintf("%s+%#x", filepath.Base(f.Mapping.Path), f.Address))
		default:
			names = append(names, fmt.Sprintf("%v:%#x", f.Kind, f.Address))
		}
	}
	return names
}

// logExamples logs a few samples, Python frames marked.
func logExamples(t *testing.T, what string, samples []sample) {
	t.Helper()
	for _, smp := range samples[:min(len(samples), 4)] {
		t.Logf("%s: %v", what, stackNames(smp.trace, python.Kind, "py"))
	}
}

// tally counts the samples ok accepts and returns those it does not.
func tally(samples []sample, ok func(sample) bool) (int, []sample) {
	n := 0
	var misses []sample
	for _, smp := range samples {
		if ok(smp) {
			n++
		} else {
			misses = append(misses, smp)
		}
	}
	return n, misses
}

// completeShare is the share of samples whose stack reaches its thread's
// root, for the record.
func completeShare(samples []sample) float64 {
	n, _ := tally(samples, func(s sample) bool { return completeStack(s.trace) })
	return share(n, len(samples))
}

func checkPythonChain(t *testing.T, samples []sample, script string, hot map[string]uint32) workloadResult {
	t.Helper()
	chain := []string{"cf_leaf", "cf_mid", "cf_top", "<module>"}
	ok, misses := tally(samples, func(s sample) bool { return pythonChain(s.trace, chain, script, hot["cf_leaf"]) })
	t.Logf("chain: %d samples, %.1f%% show %v at line %d, %.1f%% complete", len(samples),
		100*share(ok, len(samples)), chain, hot["cf_leaf"], 100*completeShare(samples))
	if len(samples) < testHz || share(ok, len(samples)) < 0.9 {
		t.Errorf("chain: %d of %d samples show the chain, want >= 90%%", ok, len(samples))
	}
	if share(ok, len(samples)) < 0.95 {
		logExamples(t, "miss", misses)
	}
	return workloadResult{share(ok, len(samples)), completeShare(samples)}
}

func checkPythonRecursion(t *testing.T, samples []sample, script string, hot map[string]uint32) workloadResult {
	t.Helper()
	chain := []string{"rec_leaf"}
	for range 41 {
		chain = append(chain, "recurse")
	}
	chain = append(chain, "<module>")
	ok, misses := tally(samples, func(s sample) bool { return pythonChain(s.trace, chain, script, hot["rec_leaf"]) })
	truncated, _ := tally(samples, func(s sample) bool { return s.trace.Truncated })
	t.Logf("recursion: %d samples, %.1f%% show all 41 levels, %.1f%% complete, %d truncated", len(samples),
		100*share(ok, len(samples)), 100*completeShare(samples), truncated)
	if len(samples) < testHz || share(ok, len(samples)) < 0.9 {
		t.Errorf("recursion: %d of %d samples show every level, want >= 90%%", ok, len(samples))
		logExamples(t, "miss", misses)
	}
	return workloadResult{share(ok, len(samples)), completeShare(samples)}
}

func checkPythonThreads(t *testing.T, samples []sample, pid int, script string, hot map[string]uint32) workloadResult {
	t.Helper()
	// Each thread's samples must show the chain of the thread's first
	// sample, and never another thread's functions.
	chainOf := map[libpf.TID]string{}
	mixed := 0
	ok, misses := tally(samples, func(s sample) bool {
		py := framesOf(s.trace, python.Kind)
		if len(py) == 0 || !strings.HasSuffix(py[0].FunctionName, "_leaf") || int(s.meta.TID) == pid {
			return false
		}
		prefix := strings.TrimSuffix(py[0].FunctionName, "_leaf")
		if first, seen := chainOf[s.meta.TID]; seen && first != prefix {
			mixed++
			return false
		}
		chainOf[s.meta.TID] = prefix
		names := make([]string, 0, len(py))
		for _, f := range py {
			names = append(names, f.FunctionName)
			if f.FunctionName != "<module>" && !strings.HasPrefix(f.FunctionName, prefix+"_") &&
				strings.HasPrefix(f.FunctionName, "t") && strings.Contains(f.FunctionName, "_") &&
				len(f.FunctionName) > 3 && f.FunctionName[2] == '_' {
				mixed++
				return false
			}
		}
		chain := []string{prefix + "_leaf", prefix + "_mid", prefix + "_top"}
		return hasChain(names, chain) && py[0].SourceFile == script && py[0].SourceLine == hot[prefix+"_leaf"]
	})
	t.Logf("threads: %d samples in %d threads, %.1f%% show their thread's chain, %d mixed up, %.1f%% complete",
		len(samples), len(chainOf), 100*share(ok, len(samples)), mixed, 100*completeShare(samples))
	if len(chainOf) != 4 || mixed > 0 || share(ok, len(samples)) < 0.9 {
		t.Errorf("threads: want 4 threads each with its own chain in >= 90%% of samples")
		logExamples(t, "miss", misses)
	}
	return workloadResult{share(ok, len(samples)), completeShare(samples)}
}

func checkPythonZlib(t *testing.T, samples []sample, script string, hot map[string]uint32) workloadResult {
	t.Helper()
	inCompress := func(s sample) bool {
		py := framesOf(s.trace, python.Kind)
		return len(py) > 0 && py[0].FunctionName == "cf_compress" && py[0].SourceLine == hot["cf_compress"]
	}
	n, misses := tally(samples, inCompress)
	withLib, libMisses := tally(samples, func(s sample) bool { return inCompress(s) && nativeBelow(s.trace, "libz.so") })
	t.Logf("zlib: %d samples, %.1f%% in cf_compress, %.1f%% of those with libz frames beneath, %.1f%% complete",
		len(samples), 100*share(n, len(samples)), 100*share(withLib, n), 100*completeShare(samples))
	if share(n, len(samples)) < 0.8 || share(withLib, n) < 0.9 {
		t.Errorf("zlib: want >= 80%% of samples in cf_compress and >= 90%% of those with libz frames beneath it")
		logExamples(t, "not in cf_compress", misses)
		logExamples(t, "no libz frame", libMisses)
	}
	return workloadResult{share(withLib, len(samples)), completeShare(samples)}
}

// logRuntimeMetrics logs the BPF counters whose names contain runtime,
// and those of truncation and tail calls, and returns all of them.
func logRuntimeMetrics(t *testing.T, s *session, runtime string) map[string]uint64 {
	m, err := s.tr.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for name, v := range m {
		if strings.Contains(name, runtime) || name == "truncated_traces" || strings.Contains(name, "tail_call") {
			out = append(out, fmt.Sprintf("%s=%d", name, v))
		}
	}
	slices.Sort(out)
	t.Logf("BPF counters: %s", strings.Join(out, " "))
	return m
}

// TestPythonStartedBeforeProfiler: a Python process that was running
// before the profiler started is unwound as well as one it saw start.
func TestPythonStartedBeforeProfiler(t *testing.T) {
	requireRoot(t)
	script, hot := pythonWorkload(t)
	py := pythonInterpreters(t)[0]
	cmd := exec.Command(py.path, script, "chain", "4")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "hot phase") {
		t.Fatalf("%s printed %q: %v", py.path, line, err)
	}
	s := startSession(t, testHz)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	s.stop(t)
	checkPythonChain(t, s.rec.ofPID(cmd.Process.Pid), script, hot)
}

// TestPythonDebugBuild profiles debug builds (Py_DEBUG), whose structs
// may differ from the release builds the offset table describes: Debian
// 12's 3.11 publishes no offsets and is refused (no Python frames, an
// interpreter error counted); sid's 3.14 publishes its offsets in
// _Py_DebugOffsets but not its thread state key's place, and is refused
// too; sid's 3.15, whose _PyRuntime differs from the table's (its size)
// and whose thread state is found from code, is read as it describes
// itself: its chains as a release build's.
func TestPythonDebugBuild(t *testing.T) {
	requireRoot(t)
	debugs, _ := filepath.Glob("/usr/bin/python3.*d")
	if len(debugs) == 0 {
		t.Fatal("no Debian debug interpreter (/usr/bin/python3.Xd; make test-deps installs python3-dbg)")
	}
	py314, err := pyfetch.DebugPython("3.14")
	if err != nil {
		t.Fatal(err)
	}
	py315, err := pyfetch.DebugPython("3.15")
	if err != nil {
		t.Fatal(err)
	}
	script, hot := pythonWorkload(t)
	for _, tt := range []struct {
		name, path string
		unwound    bool
	}{
		{"Debian 12 " + filepath.Base(debugs[0]), debugs[0], false},
		{"3.14 debug (Debian sid)", py314, false},
		{"3.15 debug (Debian sid)", py315, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startSession(t, testHz)
			// Held until profiling stopped: a new session lags while it
			// reads the debug build's files, and a sample symbolized
			// after the process's exit has unknown Python frames (the
			// last 170 ms of samples, with the integration suite running
			// beside).
			run := runScriptHeld(t, pythonCommand(pythonInterpreter{tt.name, tt.path}, script, "chain", 2*time.Second),
				func() { s.stop(t) })
			samples := run.hotSamples(t, s.rec)
			if len(samples) < testHz/2 {
				t.Fatalf("%d samples of %s", len(samples), tt.path)
			}
			if tt.unwound {
				// The session and the process are new: their warm-up
				// is left out, as in the other runtimes' tests.
				chain := func(smp sample) bool {
					return pythonChain(smp.trace, []string{"cf_leaf", "cf_mid", "cf_top", "<module>"}, script, hot["cf_leaf"])
				}
				samples = warmSamples(t, run, s.rec, false, chain, python.Kind, "py")
				if r := checkPythonChain(t, samples, script, hot); r.expected < 0.95 {
					t.Errorf("%.1f%% of the samples show the chain, want >= 95%%", 100*r.expected)
				}
				return
			}
			for _, smp := range samples {
				if p := smp.meta.Process; p.RuntimeName != "CPython" {
					t.Fatalf("runtime %q %q, want CPython, in a sample %v into the hot phase: %+v %v",
						p.RuntimeName, p.RuntimeVersion, smp.meta.Time.Sub(run.hotFrom), *p, functionNames(smp.trace))
				}
				if len(framesOf(smp.trace, python.Kind)) != 0 {
					t.Fatalf("Python frames in a refused debug build's sample: %v", functionNames(smp.trace))
				}
			}
			if n := s.pm.Stats().InterpreterErrors; n == 0 {
				t.Errorf("no interpreter error counted for the debug build")
			}
		})
	}
}

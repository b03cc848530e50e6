package integration

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v8 "github.com/hostprof/ebpf-profiler/interpreter/v8"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
)

// nodeWorkload returns utils/workloads/node/v8work.js and the line of each
// "// hot: NAME" marker in it.
func nodeWorkload(t *testing.T) (script string, hot map[string]uint32) {
	t.Helper()
	script, err := filepath.Abs(scriptPath(t, "node", "v8work.js"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(script)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hot = map[string]uint32{}
	sc := bufio.NewScanner(f)
	for n := uint32(1); sc.Scan(); n++ {
		if _, name, ok := strings.Cut(sc.Text(), "// hot: "); ok {
			hot[strings.TrimSpace(name)] = n
		}
	}
	return script, hot
}

// runNode runs the workload in one mode and returns once its work is
// done: it holds, its memory readable, until released (after the session
// stopped, since under emulation the daemon symbolizes seconds behind).
func runNode(t *testing.T, node, script, mode string, d time.Duration, flags ...string) *heldRun {
	t.Helper()
	return startHeld(t, exec.Command(node, append(flags, script, mode, formatSeconds(d))...))
}

// hotFrom reads the workload's "hot phase from <unix seconds>" line.
func hotFrom(t *testing.T, out string) time.Time {
	t.Helper()
	var from float64
	// Warnings a runtime prints at start-up may come first.
	if i := strings.Index(out, "hot phase from "); i > 0 {
		out = out[i:]
	}
	if _, err := fmt.Sscanf(out, "hot phase from %g", &from); err != nil {
		t.Fatalf("the workload printed %q: %v", out, err)
	}
	return unixTime(from)
}

// hotTo reads the end of the hot phase where the workload gives one
// ("hot phase from <unix seconds> to <unix seconds>", or a line "hot phase
// to <unix seconds>" of its own); zero if not.
func hotTo(out string) time.Time {
	var from, to float64
	if i := strings.Index(out, "hot phase from "); i >= 0 {
		if _, err := fmt.Sscanf(out[i:], "hot phase from %g to %g", &from, &to); err == nil {
			return unixTime(to)
		}
	}
	if i := strings.Index(out, "hot phase to "); i >= 0 {
		if _, err := fmt.Sscanf(out[i:], "hot phase to %g", &to); err == nil {
			return unixTime(to)
		}
	}
	return time.Time{}
}

func unixTime(sec float64) time.Time {
	whole, frac := math.Modf(sec)
	return time.Unix(int64(whole), int64(frac*1e9))
}

// jsFrames returns a trace's JavaScript function frames, leaf first: V8's
// frames with a script (builtins and V8's own frames have none).
func jsFrames(tr *libpf.Trace) []libpf.Frame {
	var out []libpf.Frame
	for _, f := range tr.Frames {
		if f.Kind == v8.Kind && f.SourceFile != "" {
			out = append(out, f)
		}
	}
	return out
}

// jsChain reports whether a trace's JavaScript frames start with chain
// (leaf first), each in script, the leaf at leafLine, and the stack is
// complete.
func jsChain(tr *libpf.Trace, chain []string, script string, leafLine uint32) bool {
	fs := jsFrames(tr)
	if len(fs) < len(chain) || fs[0].SourceLine != leafLine {
		return false
	}
	for i, name := range chain {
		if fs[i].FunctionName != name || fs[i].SourceFile != script {
			return false
		}
	}
	return completeStack(tr)
}

// mainThread keeps the samples of a process's main thread (node's
// JavaScript thread; V8 compiles and collects garbage on others).
func mainThread(samples []sample) []sample {
	var out []sample
	for _, s := range samples {
		if uint32(s.meta.TID) == uint32(s.meta.Process.PID) {
			out = append(out, s)
		}
	}
	return out
}

// logNodeExamples logs a few samples, JavaScript frames marked.
func logNodeExamples(t *testing.T, what string, samples []sample) {
	t.Helper()
	some := samples
	if len(samples) > 4 {
		some = append(samples[:2:2], samples[len(samples)-2:]...)
	}
	for _, smp := range some {
		var names []string
		for _, f := range smp.trace.Frames {
			switch {
			case f.Kind == v8.Kind:
				names = append(names, fmt.Sprintf("js:%s:%d:%d(%s)", f.FunctionName, f.SourceLine, f.SourceColumn, tierOf(f)))
			case f.FunctionName != "":
				names = append(names, f.FunctionName)
			case f.Mapping != nil:
				names = append(names, fmt.Sprintf("%s+%#x", filepath.Base(f.Mapping.Path), f.Address))
			default:
				names = append(names, fmt.Sprintf("%v:%#x", f.Kind, f.Address))
			}
		}
		t.Logf("%s [%s]: %v", what, smp.meta.ThreadName, names)
	}
}

// logJSTiers logs, for each of the first frames of chain, the share of
// samples in which it ran at each tier.
func logJSTiers(t *testing.T, samples []sample, chain []string) {
	t.Helper()
	for i, name := range chain {
		tiers := map[string]int{}
		n := 0
		for _, s := range samples {
			if fs := jsFrames(s.trace); len(fs) > i && fs[i].FunctionName == name {
				tiers[tierOf(fs[i])]++
				n++
			}
		}
		var parts []string
		for tier, c := range tiers {
			parts = append(parts, fmt.Sprintf("%s %.1f%%", tier, 100*share(c, n)))
		}
		slices.Sort(parts)
		t.Logf("tiers of %s: %s", name, strings.Join(parts, ", "))
	}
}

// nodeCase is one run of the workload and what its samples must show.
type nodeCase struct {
	name  string
	mode  string
	flags []string
	// from is the first Node major version the case runs on (its flags
	// are unknown before).
	from int
	// noMaglev adds --no-maglev on the versions that know the flag (Node
	// 20 on): there --no-opt is --no-turbofan's alias and leaves Maglev,
	// on by default from Node 24, the top tier.
	noMaglev bool
	check    func(t *testing.T, samples []sample, script string, hot map[string]uint32) (got, want float64)
}

var jsChainNames = []string{"leaf", "mid", "top", "loop", "main"}

// checkNodeChain: the main thread's samples show leaf, mid, top, loop and
// main, the leaf at its hot line.
func checkNodeChain(t *testing.T, samples []sample, script string, hot map[string]uint32) (float64, float64) {
	t.Helper()
	samples = mainThread(samples)
	ok, misses := tally(samples, func(s sample) bool { return jsChain(s.trace, jsChainNames, script, hot["leaf"]) })
	inlined, _ := tally(samples, func(s sample) bool {
		fs := jsFrames(s.trace)
		return len(fs) > 0 && fs[0].FunctionName == "leaf" && fs[0].Inlined
	})
	t.Logf("%d samples, %.1f%% show %v at line %d, complete; leaf inlined in %.1f%%", len(samples),
		100*share(ok, len(samples)), jsChainNames, hot["leaf"], 100*share(inlined, len(samples)))
	logJSTiers(t, samples, jsChainNames[:3])
	if len(samples) < testHz {
		t.Errorf("only %d samples", len(samples))
	}
	logNodeExamples(t, "miss", misses)
	return share(ok, len(samples)), 0.95
}

// checkNodeShapes: a class's constructor and method, an arrow function
// and an anonymous function expression, each named as V8 names it, at
// its hot line, called from the shapes arrow, loop and main.
func checkNodeShapes(t *testing.T, samples []sample, script string, hot map[string]uint32) (float64, float64) {
	t.Helper()
	samples = mainThread(samples)
	leaves := map[string]uint32{"Shape": hot["Shape"], "area": hot["Shape.area"], "arrow": hot["arrow"],
		v8.AnonymousName: hot["anonymous"]}
	seen := map[string]int{}
	ok, misses := tally(samples, func(s sample) bool {
		fs := jsFrames(s.trace)
		if len(fs) < 4 {
			return false
		}
		line, known := leaves[fs[0].FunctionName]
		if !known || fs[0].SourceLine != line {
			return false
		}
		seen[fs[0].FunctionName]++
		return jsChain(s.trace, []string{fs[0].FunctionName, "shapes", "loop", "main"}, script, line)
	})
	t.Logf("%d samples, %.1f%% show a shape at its line above shapes, loop, main; by leaf: %v",
		len(samples), 100*share(ok, len(samples)), seen)
	for name := range leaves {
		if seen[name] < len(samples)/20 {
			t.Errorf("%s leads only %d of %d samples", name, seen[name], len(samples))
		}
	}
	logJSTiers(t, samples, []string{"Shape"})
	logNodeExamples(t, "miss", misses)
	return share(ok, len(samples)), 0.9
}

// checkNodeWorkers: each worker thread shows its own chain (wa* or wb*)
// above loop, never the other's.
func checkNodeWorkers(t *testing.T, samples []sample, script string, hot map[string]uint32) (float64, float64) {
	t.Helper()
	chains := map[string][]string{"a": {"waLeaf", "waTop", "loop"}, "b": {"wbLeaf", "wbTop", "loop"}}
	byThread := map[libpf.TID]string{}
	var workers []sample
	mixed := 0
	for _, s := range samples {
		for _, f := range jsFrames(s.trace) {
			which := ""
			switch {
			case strings.HasPrefix(f.FunctionName, "wa"):
				which = "a"
			case strings.HasPrefix(f.FunctionName, "wb"):
				which = "b"
			default:
				continue
			}
			if prev, ok := byThread[s.meta.TID]; ok && prev != which {
				mixed++
			}
			byThread[s.meta.TID] = which
		}
	}
	for _, s := range samples {
		if _, ok := byThread[s.meta.TID]; ok {
			workers = append(workers, s)
		}
	}
	ok, misses := tally(workers, func(s sample) bool {
		c := chains[byThread[s.meta.TID]]
		return jsChain(s.trace, c, script, hot[c[0]])
	})
	t.Logf("%d samples of %d worker threads, %.1f%% show their chain; %d frames of the other worker's",
		len(workers), len(byThread), 100*share(ok, len(workers)), mixed)
	if len(byThread) != 2 || mixed > 0 {
		t.Errorf("%d worker threads with chains, %d frames of the other's", len(byThread), mixed)
		var others []sample
		for _, smp := range samples {
			if uint32(smp.meta.TID) != uint32(smp.meta.Process.PID) {
				others = append(others, smp)
			}
		}
		logNodeExamples(t, "another thread's sample", others)
	}
	logNodeExamples(t, "miss", misses)
	return share(ok, len(workers)), 0.9
}

// checkNodeAsync: the async function runs from the microtask queue after
// its await; its samples show it at its hot line.
func checkNodeAsync(t *testing.T, samples []sample, script string, hot map[string]uint32) (float64, float64) {
	t.Helper()
	samples = mainThread(samples)
	ok, misses := tally(samples, func(s sample) bool {
		fs := jsFrames(s.trace)
		return len(fs) > 0 && fs[0].FunctionName == "step" && fs[0].SourceLine == hot["step"] &&
			fs[0].SourceFile == script && completeStack(s.trace)
	})
	t.Logf("%d samples, %.1f%% in step at line %d, complete", len(samples), 100*share(ok, len(samples)), hot["step"])
	logNodeExamples(t, "miss", misses)
	return share(ok, len(samples)), 0.8
}

// nodeCases are the workloads TestNodeStacks runs on each Node version.
var nodeCases = []nodeCase{
	{"chain", "chain", nil, 18, false, checkNodeChain},
	{"chain, --no-turbo-inlining", "chain", []string{"--no-turbo-inlining"}, 18, false, checkNodeChain},
	{"chain, --jitless", "chain", []string{"--jitless"}, 18, false, checkNodeChain},
	{"chain, --max-lazy", "chain", []string{"--max-lazy"}, 18, false, checkNodeChain},
	// Sparkplug's baseline code the top tier.
	{"chain, Sparkplug only", "chain", []string{"--no-opt", "--always-sparkplug"}, 18, true, checkNodeChain},
	// Maglev the top tier where it is built in (Node 24).
	{"chain, --no-turbofan", "chain", []string{"--no-turbofan"}, 20, false, checkNodeChain},
	{"shapes", "shapes", nil, 18, false, checkNodeShapes},
	{"2 workers", "workers", nil, 18, false, checkNodeWorkers},
	{"async", "async", nil, 18, false, checkNodeAsync},
}

// flagsFor is the case's flags for Node major version major.
func (c nodeCase) flagsFor(major int) []string {
	if c.noMaglev && major >= 20 {
		return append(slices.Clone(c.flags), "--no-maglev")
	}
	return c.flags
}

// nodeVersion returns the node executable of a tested major version; it
// fails t when that is not installed for the workloads' architecture, and
// lists it for the VM when the run prepares one.
func nodeVersion(t *testing.T, v string) string {
	t.Helper()
	requireRuntime(t, func(arch string) ([]string, error) { return nodefetch.Tree(v, arch) },
		func() error { _, err := nodefetch.Node(v); return err })
	node, _ := nodefetch.NodeFor(v, targetArch())
	return node
}

// TestNodeStacks profiles each workload of v8work.js under every tested
// Node version and checks the JavaScript frames of its samples: names,
// scripts, the leaf's line, and their order among the native frames down
// to the process's entry.
func TestNodeStacks(t *testing.T) {
	requireRoot(t)
	script, hot := nodeWorkload(t)
	const run = 4 * time.Second
	results := &shareResults{m: map[string][]float64{}}
	versions := nodefetch.VersionsFor(targetArch())
	var names []string
	for _, c := range nodeCases {
		names = append(names, c.name)
	}
	t.Cleanup(func() { logShareTable(t, "Node", versions, names, results.m) })
	for _, v := range versions {
		t.Run("Node "+v, func(t *testing.T) {
			pairUp(t)
			node := nodeVersion(t, v)
			s := startSession(t, testHz)
			// A short run first: the daemon has then read this node's
			// files, as on any host after its first minutes.
			runNode(t, node, script, "chain", time.Second).release(t)
			major, _ := strconv.Atoi(v)
			// Each case runs in its subtest, which a VM's selection
			// (go test -run) may leave out; n/a where it is, or where the
			// version predates the case's flags.
			results.init(v, len(nodeCases))
			for i, c := range nodeCases {
				if major < c.from {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					r := runNode(t, node, script, c.mode, run, c.flagsFor(major)...).release(t)
					s.waitExited(t, r.pid)
					got, want := c.check(t, r.hotSamples(t, s.rec), script, hot)
					results.set(v, i, got)
					if got < want {
						t.Errorf("%.1f%% of samples as expected, want >= %.0f%%", 100*got, 100*want)
					}
				})
			}
			logRuntimeMetrics(t, s, "v8")
		})
	}
}

// startNode starts the workload in mode for d, in a pid and mount
// namespace of its own where namespaced is set (startWorkload), and
// returns once it printed when its hot phase begins.
func startNode(t *testing.T, namespaced bool, node, script, mode string, d time.Duration, flags ...string) (*workloadRun, scriptRun) {
	t.Helper()
	if namespaced {
		script = namespacedPath(script)
	}
	args := append(append([]string{}, flags...), script, mode, formatSeconds(d))
	r, line := startWorkload(t, namespaced, node, args...)
	return r, scriptRun{pid: r.pid, hotFrom: hotFrom(t, line), hotTo: hotTo(line)}
}

// TestNodeProcesses: node processes the daemon meets other than started
// alone under it: one running before it started, Node 18 and 24 at once,
// and one as pid 1 of its own pid and mount namespace. Each shows the
// chain in >= 95% of its main thread's samples.
func TestNodeProcesses(t *testing.T) {
	requireRoot(t)
	script, hot := nodeWorkload(t)
	node := func(v string) string { return nodeVersion(t, v) }
	// In a VM without inlining: emulation skews the samples of inlined
	// TurboFan code to its interrupt checks (see utils/kernelmatrix).
	var flags []string
	if inVM() {
		flags = []string{"--no-turbo-inlining"}
	}
	// check takes the script as the process names it: inside a mount
	// namespace, the workload's path under /tmp is under /mnt
	// (startWorkload). Each process is new, so its warm-up is left out as
	// for the other JIT runtimes (warmSamples): its JIT code is claimed
	// when the daemon reads its mappings, which under emulation lags its
	// first TurboFan code (94.5% with the warm-up in the arm64 6.12 VM).
	check := func(t *testing.T, s *session, run scriptRun, script string) {
		t.Helper()
		chain := func(smp sample) bool {
			return uint32(smp.meta.TID) == uint32(smp.meta.Process.PID) && jsChain(smp.trace, jsChainNames, script, hot["leaf"])
		}
		got, want := checkNodeChain(t, warmSamples(t, run, s.rec, true, chain, v8.Kind, "js"), script, hot)
		if got < want {
			t.Errorf("%.1f%% of samples show the chain, want >= %.0f%%", 100*got, 100*want)
		}
	}
	t.Run("started before the daemon", func(t *testing.T) {
		n := node("20")
		skipIfPreparing(t)
		// Killed by the test; long enough for a slow start under
		// emulation.
		w, _ := startNode(t, false, n, script, "chain", time.Minute, flags...)
		time.Sleep(time.Second) // optimized and running before the daemon starts
		s := startSession(t, testHz)
		time.Sleep(4 * time.Second)
		s.stop(t)
		// Until the daemon has read the running node's files (its first
		// samples wait for their unwind tables, as any process's do),
		// its stacks end early: measured apart, bounded.
		main := mainThread(s.rec.ofPID(w.pid))
		first := slices.IndexFunc(main, func(smp sample) bool { return jsChain(smp.trace, jsChainNames, script, hot["leaf"]) })
		t.Logf("first sample with the chain: %d of %d", first, len(main))
		if first < 0 || first > maxWarmupSamples {
			t.Fatalf("%d samples before the first with the chain, want <= %d", first, maxWarmupSamples)
		}
		got, want := checkNodeChain(t, main[first:], script, hot)
		if got < want {
			t.Errorf("%.1f%% of samples after the first show the chain, want >= %.0f%%", 100*got, 100*want)
		}
	})
	t.Run("Node 18 and 24 at once", func(t *testing.T) {
		n18, n24 := node("18"), node("24")
		s := startSession(t, testHz)
		runNode(t, n18, script, "chain", time.Second).release(t) // the daemon reads their files
		runNode(t, n24, script, "chain", time.Second).release(t)
		w18, run18 := startNode(t, false, n18, script, "chain", 4*time.Second, flags...)
		w24, run24 := startNode(t, false, n24, script, "chain", 4*time.Second, flags...)
		w18.wait(t)
		w24.wait(t)
		s.stop(t)
		check(t, s, run18, script)
		check(t, s, run24, script)
	})
	t.Run("BPF entries freed at exit", func(t *testing.T) {
		n := node("20")
		s := startSession(t, testHz)
		w, _ := startNode(t, false, n, script, "chain", 2*time.Second)
		running := s.waitEntries(t, w.pid, "a V8 configuration", func(e bpfEntries) bool { return e.configs == 1 })
		w.wait(t)
		s.waitExited(t, w.pid)
		gone := s.waitEntries(t, w.pid, "none after the exit", func(e bpfEntries) bool { return e == bpfEntries{} })
		t.Logf("node %d: %+v while it runs, %+v after its exit", w.pid, running, gone)
	})
	t.Run("with a perf map too", func(t *testing.T) {
		// The V8 unwinder's frames, not the perf map's.
		n := node("20")
		s := startSession(t, testHz)
		runNode(t, n, script, "chain", time.Second).release(t)
		w, run := startNode(t, false, n, script, "chain", 4*time.Second, append(flags, "--perf-basic-prof")...)
		w.wait(t)
		s.stop(t)
		check(t, s, run, script)
	})
	t.Run("own pid and mount namespace", func(t *testing.T) {
		n := node("22")
		s := startSession(t, testHz)
		runNode(t, n, script, "chain", time.Second).release(t)
		w, run := startNode(t, true, n, script, "chain", 4*time.Second, flags...)
		w.wait(t)
		s.stop(t)
		check(t, s, run, namespacedPath(script))
	})
}

// TestNodeGC is the stress run: closures allocated without pause for 60 s
// (mode gc), the garbage collector moving and freeing functions and code
// all along. No JavaScript frame may name a function outside the
// workload's own and Node's internals; frames that could not be named
// are counted, not wrong.
func TestNodeGC(t *testing.T) {
	requireRoot(t)
	skipIfPreparing(t)
	script, _ := nodeWorkload(t)
	node, err := nodefetch.Node("22")
	if err != nil {
		t.Fatal(err)
	}
	// The functions of v8work.js that run in mode gc.
	own := map[string]bool{"churn": true, "makeAdder": true, "gc": true, "loop": true, "main": true, v8.AnonymousName: true}
	s := startSession(t, testHz)
	run := runNode(t, node, script, "gc", 60*time.Second).release(t)
	logRuntimeMetrics(t, s, "v8")
	s.stop(t)
	samples := mainThread(run.hotSamples(t, s.rec))
	wrong, unnamed, inScript := 0, 0, 0
	for _, smp := range samples {
		for _, f := range smp.trace.Frames {
			switch {
			case f.Kind != v8.Kind:
			case strings.HasPrefix(f.FunctionName, "[unknown"):
				unnamed++
			case f.SourceFile == script && !own[f.FunctionName],
				f.SourceFile != "" && f.SourceFile != script && !strings.HasPrefix(f.SourceFile, "node:"):
				wrong++
				logNodeExamples(t, "wrong", []sample{smp})
			}
		}
		if fs := jsFrames(smp.trace); len(fs) > 0 && fs[0].SourceFile == script {
			inScript++
		}
	}
	tops := map[string]int{}
	for _, smp := range samples {
		if fs := jsFrames(smp.trace); len(fs) > 0 {
			tops[fmt.Sprintf("%s:%d", fs[0].FunctionName, fs[0].SourceLine)]++
		}
	}
	t.Logf("innermost JavaScript frames: %v", tops)
	t.Logf("%d samples: %d frames named outside the workload and Node, %d unnamed; %.1f%% with the workload's code innermost",
		len(samples), wrong, unnamed, 100*share(inScript, len(samples)))
	if wrong > 0 {
		t.Errorf("%d frames named a function the workload does not run", wrong)
	}
	// The rest is the collector's own time, in V8's C++.
	if share(inScript, len(samples)) < 0.5 {
		t.Errorf("only %d of %d samples in the workload's code: it did not run as meant", inScript, len(samples))
	}
}

package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/hotspot"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
)

// javaWorkload compiles utils/workloads/java/JWorkload.java and returns
// the directory of its classes (javaClasses: for JDK 11 and later, and
// below it for JDK 8) and the line of each "// hot: NAME" marker
// in it. The VMs have no javac: the prepare step compiles them beside the
// scripts.
func javaWorkload(t *testing.T) (classes string, hot map[string]uint32) {
	t.Helper()
	src := scriptPath(t, "java", "JWorkload.java")
	switch {
	case preparing():
		classes = filepath.Join(os.Getenv(prepareEnv), scriptsDir, "java", "classes")
	case inVM():
		classes = filepath.Join(filepath.Dir(src), "classes")
	default:
		classes = t.TempDir()
	}
	if !inVM() || preparing() {
		javac := filepath.Join(filepath.Dir(jdkfetch.SystemJava), "javac")
		for _, release := range []string{"11", "8"} {
			out, err := exec.Command(javac, "--release", release, "-d", javaClasses(classes, release), src).CombinedOutput()
			if err != nil {
				t.Fatalf("javac --release %s: %v\n%s", release, err, out)
			}
		}
	}
	f, err := os.Open(src)
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
	return classes, hot
}

// javaClasses is where javaWorkload compiled the workload for JDK v:
// JDK 8 cannot load the class files of 11, which the others run.
func javaClasses(classes, v string) string {
	if v == "8" {
		return filepath.Join(classes, "release8")
	}
	return classes
}

// javaVersionFlags are the JVM flags a JDK version's workloads run with.
// JDK 8's C2 records debug information only at safepoints and leaves no
// safepoint poll in a counted loop, so no PC of the workload's hot loops
// tells their line or the methods inlined there, to HotSpot itself or to
// any profiler (without it: the leaf at its method's first line or not
// there at all, in 0-75% of the samples). DebugNonSafepoints has C2 record
// it everywhere, as JDK 8 profilers ask (async-profiler sets it through
// JVMTI); the code is the same. JDK 10 and later keep a poll in such loops
// (loop strip mining, JDK-8186027), so their code has what the tests need.
func javaVersionFlags(v string) []string {
	if v == "8" {
		return []string{"-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"}
	}
	return nil
}

// javaBuild returns the java executable of a tested JDK for the workloads'
// architecture, and lists it for the VM when the run prepares one.
func javaBuild(t *testing.T, v string) string {
	t.Helper()
	requireRuntime(t, func(arch string) ([]string, error) { return jdkfetch.Tree(v, arch) },
		func() error { _, err := jdkfetch.Java(v); return err })
	java, err := jdkfetch.For(v, targetArch())
	if err != nil {
		t.Fatal(err)
	}
	return java
}

// javaFile is the source file the workload's frames name.
const javaFile = "JWorkload.java"

// vmJavaWarmup is how long a workload runs in a VM before its hot phase.
// At 2 s, with six JDKs in the arm64 6.12 VM, JDK 17's top was still
// interpreted in a quarter of its chain's samples and JDK 25's four
// threads' in a tenth (25.3% and 89.7%, both just past their thresholds).
const vmJavaWarmup = 3 * time.Second

// runJava runs the workload in one mode to its end; its hot phase is
// where it says.
func runJava(t *testing.T, java, classes, mode string, d time.Duration, flags ...string) scriptRun {
	t.Helper()
	cmd := exec.Command(java, javaArgs(classes, mode, d, flags)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", java, mode, err, out)
	}
	return newScriptRun(t, cmd.Process.Pid, string(out))
}

// javaArgs are the java command's arguments that run the workload in
// mode for d, with the JVM's flags.
func javaArgs(classes, mode string, d time.Duration, flags []string) []string {
	// quiet: CompileCommand would otherwise print each command first.
	args := append([]string{"-XX:CompileCommand=quiet"}, flags...)
	args = append(args, "-cp", classes, "JWorkload", mode, formatSeconds(d))
	if inVM() {
		// In a VM: under emulation the JIT takes seconds to compile the
		// workload, left out as its warm-up (here it takes a few samples).
		args = append(args, formatSeconds(vmJavaWarmup))
	}
	return args
}

// javaFrames returns a trace's Java method frames, leaf first: the JVM's
// frames that are not its stubs ("[name]").
func javaFrames(tr *libpf.Trace) []libpf.Frame {
	var out []libpf.Frame
	for _, f := range tr.Frames {
		if f.Kind == hotspot.Kind && !strings.HasPrefix(f.FunctionName, "[") {
			out = append(out, f)
		}
	}
	return out
}

// javaNames lists the names of a trace's Java method frames, leaf first.
func javaNames(tr *libpf.Trace) []string {
	var names []string
	for _, f := range javaFrames(tr) {
		names = append(names, f.FunctionName)
	}
	return names
}

// javaThreadChain reports whether a trace's Java frames are exactly chain
// (leaf first, every one in JWorkload.java, the leaf at leafLine) above
// the thread's entry: java.lang.Thread.run at the bottom, with only
// Thread's own methods (JDK 19+: runWith) between.
func javaThreadChain(tr *libpf.Trace, chain []string, leafLine uint32) bool {
	fs := javaFrames(tr)
	return len(fs) > 0 && fs[0].SourceLine == leafLine && javaFramesAre(fs, chain) && completeStack(tr)
}

// inChainAboveLeaf reports whether a trace's Java frames are chain without
// its leaf, or without more of its innermost frames, above the thread's
// entry: a sample in a caller's own code or in the VM it called (a
// counter overflow, a compilation request), complete and right, which
// does not cross from the leaf to its caller.
func inChainAboveLeaf(tr *libpf.Trace, chain []string) bool {
	fs := javaFrames(tr)
	for k := 1; k < len(chain); k++ {
		if javaFramesAre(fs, chain[k:]) {
			return completeStack(tr)
		}
	}
	return false
}

// javaFramesAre reports whether fs, innermost first, are chain in
// JWorkload.java, then Thread's own methods down to java.lang.Thread.run.
func javaFramesAre(fs []libpf.Frame, chain []string) bool {
	if len(fs) < len(chain)+1 {
		return false
	}
	for i, name := range chain {
		if fs[i].FunctionName != name || fs[i].SourceFile != javaFile {
			return false
		}
	}
	for _, f := range fs[len(chain):] {
		if !strings.HasPrefix(f.FunctionName, "java.lang.Thread.") || f.SourceFile != "Thread.java" {
			return false
		}
	}
	return fs[len(fs)-1].FunctionName == "java.lang.Thread.run"
}

// javaMainChain reports whether a trace's Java frames are exactly chain
// (leaf first) ending in JWorkload.main, all in JWorkload.java, the leaf
// at leafLine, and the stack reaches the process's entry.
func javaMainChain(tr *libpf.Trace, chain []string, leafLine uint32) bool {
	fs := javaFrames(tr)
	if len(fs) != len(chain) || len(fs) == 0 || fs[0].SourceLine != leafLine {
		return false
	}
	for i, name := range chain {
		if fs[i].FunctionName != name || fs[i].SourceFile != javaFile {
			return false
		}
	}
	return completeStack(tr)
}

// ofThread keeps the samples of threads named name.
func ofThread(samples []sample, name string) []sample {
	var out []sample
	for _, s := range samples {
		if s.meta.ThreadName == name {
			out = append(out, s)
		}
	}
	return out
}

// logJavaExamples logs a few samples, Java frames marked: the first two
// (often taken before the daemon described the JVM) and the last two.
func logJavaExamples(t *testing.T, what string, samples []sample) {
	t.Helper()
	some := samples
	if len(samples) > 4 {
		some = append(samples[:2:2], samples[len(samples)-2:]...)
	}
	for _, smp := range some {
		t.Logf("%s %s", what, javaStack(smp))
	}
}

// javaStack is a sample's thread and frames, Java ones with line and tier.
func javaStack(smp sample) string {
	var names []string
	for _, f := range smp.trace.Frames {
		switch {
		case f.Kind == hotspot.Kind:
			names = append(names, fmt.Sprintf("j:%s:%d(%s)", f.FunctionName, f.SourceLine, tierOf(f)))
		case f.FunctionName != "":
			names = append(names, f.FunctionName)
		case f.Mapping != nil:
			names = append(names, fmt.Sprintf("%s+%#x", filepath.Base(f.Mapping.Path), f.Address))
		default:
			names = append(names, fmt.Sprintf("%v:%#x", f.Kind, f.Address))
		}
	}
	return fmt.Sprintf("[%s]: %v", smp.meta.ThreadName, names)
}

// tierOf is a Java frame's tier as OTLP reports it.
func tierOf(f libpf.Frame) string {
	if f.Inlined {
		return f.Tier + " inlined"
	}
	return f.Tier
}

// logTiers logs, for each of the first frames of chain (leaf first), the
// share of samples in which it ran at each tier.
func logTiers(t *testing.T, samples []sample, chain []string) {
	t.Helper()
	for i, name := range chain {
		tiers := map[string]int{}
		n := 0
		for _, s := range samples {
			if fs := javaFrames(s.trace); len(fs) > i && fs[i].FunctionName == name {
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

// javaCase is one run of the workload and what its samples must show.
type javaCase struct {
	name  string
	mode  string
	flags []string
	// check returns the share of samples that show what they must, and
	// the share required.
	check func(t *testing.T, samples []sample, hot map[string]uint32) (got, want float64)
	// runsOn says whether the case applies to the architecture and JDK
	// (nil: all).
	runsOn func(arch string, jdk int) bool
}

var javaChain = []string{"JWorkload.leaf", "JWorkload.mid", "JWorkload.top", "JWorkload$Worker.run"}

// checkJavaChain: the worker thread's samples show the chain down to
// Thread.run, those in its callers' own code aside (inChainAboveLeaf).
func checkJavaChain(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	worker := ofThread(samples, "worker")
	// Samples in mid's or top's own code (or the VM they called) are
	// right but do not cross from the leaf to mid: the share is of the
	// others, which must be most (a leaf frame lost would leave few).
	var rest []sample
	above := 0
	for _, s := range worker {
		if inChainAboveLeaf(s.trace, javaChain) {
			above++
		} else {
			rest = append(rest, s)
		}
	}
	ok, misses := tally(rest, func(s sample) bool {
		// The system name carries the method's descriptor.
		return javaThreadChain(s.trace, javaChain, hot["leaf"]) && javaFrames(s.trace)[0].SystemName == "JWorkload.leaf(J)J"
	})
	t.Logf("%d samples of the worker thread, %d of them complete in the chain above the leaf; of the rest %.1f%% show %v at line %d above Thread.run; %.1f%% complete",
		len(worker), above, 100*share(ok, len(rest)), javaChain, hot["leaf"], 100*completeShare(worker))
	logTiers(t, worker, javaChain[:3])
	if len(worker) < testHz {
		t.Errorf("only %d samples of the worker thread", len(worker))
	}
	// Under emulation top's clock reads (System.nanoTime through the
	// vDSO) take longer: in the arm64 VM 25.1-25.3% of the samples, for
	// JDK 17 and 26, with every stack right.
	maxAbove := 0.25
	if inVM() {
		maxAbove = 0.4
	}
	if share(above, len(worker)) > maxAbove {
		t.Errorf("%d of %d samples in the chain above the leaf: the leaf is hot", above, len(worker))
	}
	logJavaExamples(t, "miss", misses)
	return share(ok, len(rest)), 0.95
}

// checkJavaInline: the worker's samples in inlineLeaf show the helper
// that C2 inlined into inlineTop as a frame of its own between them.
func checkJavaInline(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	worker := ofThread(samples, "worker")
	chain := []string{"JWorkload.inlineLeaf", "JWorkload.step", "JWorkload.inlineTop", "JWorkload$Worker.run"}
	var inLeaf []sample
	for _, s := range worker {
		if names := javaNames(s.trace); len(names) > 0 && names[0] == "JWorkload.inlineLeaf" {
			inLeaf = append(inLeaf, s)
		}
	}
	ok, misses := tally(inLeaf, func(s sample) bool {
		fs := javaFrames(s.trace)
		return javaThreadChain(s.trace, chain, hot["inlineLeaf"]) && fs[1].SourceLine == hot["step"]
	})
	inlined, _ := tally(inLeaf, func(s sample) bool {
		fs := javaFrames(s.trace)
		return len(fs) > 2 && fs[1].FunctionName == "JWorkload.step" && fs[1].Inlined && !fs[2].Inlined
	})
	t.Logf("%d samples of the worker thread, %d in inlineLeaf; %.1f%% of those show %v, step at line %d; "+
		"step inlined in %.1f%%", len(worker), len(inLeaf), 100*share(ok, len(inLeaf)), chain, hot["step"],
		100*share(inlined, len(inLeaf)))
	logTiers(t, inLeaf, chain[:3])
	if len(inLeaf) < testHz {
		t.Errorf("only %d samples in inlineLeaf", len(inLeaf))
	}
	// Before C2 compiled inlineTop, step ran on its own: the test is
	// about the rest.
	if share(inlined, len(inLeaf)) < 0.5 {
		t.Errorf("step inlined in %d of %d samples: the JIT did not inline it, the test tests nothing", inlined, len(inLeaf))
	}
	logJavaExamples(t, "miss", misses)
	return share(ok, len(inLeaf)), 0.9
}

func checkJavaRecursion(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	main := ofThread(samples, "java")
	chain := []string{"JWorkload.recLeaf"}
	for range 41 {
		chain = append(chain, "JWorkload.recurse")
	}
	chain = append(chain, "JWorkload.recursionTop", "JWorkload.run", "JWorkload.main")
	ok, misses := tally(main, func(s sample) bool { return javaMainChain(s.trace, chain, hot["recLeaf"]) })
	t.Logf("%d samples of the main thread, %.1f%% show all 41 levels, %.1f%% complete",
		len(main), 100*share(ok, len(main)), 100*completeShare(main))
	logJavaExamples(t, "miss", misses)
	return share(ok, len(main)), 0.9
}

// checkJavaThreads: each of t0..t3 shows its own chain, never another's.
func checkJavaThreads(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	var all []sample
	mixed := 0
	for i := range 4 {
		name := fmt.Sprintf("t%d", i)
		mine := ofThread(samples, name)
		if len(mine) < testHz/2 {
			t.Errorf("only %d samples of thread %s", len(mine), name)
		}
		for _, s := range mine {
			for _, f := range javaFrames(s.trace) {
				for j := range 4 {
					if j != i && strings.HasPrefix(f.FunctionName, fmt.Sprintf("JWorkload.t%d", j)) {
						mixed++
					}
				}
			}
		}
		all = append(all, mine...)
	}
	ok, misses := tally(all, func(s sample) bool {
		n := s.meta.ThreadName
		chain := []string{"JWorkload." + n + "Leaf", "JWorkload." + n + "Mid", "JWorkload." + n + "Top"}
		fs := javaFrames(s.trace)
		// Below the chain, the lambda that started it and Thread.run.
		return len(fs) > len(chain)+1 && hasChain(javaNames(s.trace)[:len(chain)], chain) &&
			fs[0].SourceLine == hot[n+"Leaf"] && fs[len(fs)-1].FunctionName == "java.lang.Thread.run" &&
			completeStack(s.trace)
	})
	t.Logf("%d samples of threads t0-t3, %.1f%% show their thread's chain, %d frames of another thread's",
		len(all), 100*share(ok, len(all)), mixed)
	if mixed > 0 {
		t.Errorf("%d frames in the wrong thread's stack", mixed)
	}
	logJavaExamples(t, "miss", misses)
	return share(ok, len(all)), 0.9
}

// checkJavaZlib: the main thread's samples in Deflater's native code show
// the JDK's zip library and zlib beneath the Java frames.
func checkJavaZlib(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	main := ofThread(samples, "java")
	inDeflate := func(s sample) bool {
		fs := javaFrames(s.trace)
		i := slices.IndexFunc(fs, func(f libpf.Frame) bool { return f.FunctionName == "JWorkload.compress" })
		return i > 0 && fs[i].SourceLine == hot["compress"] && fs[len(fs)-1].FunctionName == "JWorkload.main" &&
			strings.HasPrefix(fs[0].FunctionName, "java.util.zip.Deflater.deflateBytes")
	}
	n, misses := tally(main, inDeflate)
	withLib, libMisses := tally(main, func(s sample) bool {
		return inDeflate(s) && nativeBelow(s.trace, "libz.so") && completeStack(s.trace)
	})
	t.Logf("%d samples of the main thread, %.1f%% in Deflater's native method, %.1f%% of those with libz beneath and complete",
		len(main), 100*share(n, len(main)), 100*share(withLib, n))
	// 98.3-99.4% since a native method called through the interpreter's
	// native entry is named (77-84% before: its frame's bytecode pointer
	// was taken for a stale one).
	if share(n, len(main)) < 0.95 {
		t.Errorf("zlib: %d of %d samples in Deflater's native method, want >= 95%%", n, len(main))
		logJavaExamples(t, "not in deflate", misses)
	}
	logJavaExamples(t, "no libz frame", libMisses)
	return share(withLib, n), 0.9
}

// checkJavaDispatch: the worker's samples show the methods the dispatch
// code called, or that code, above dispatchTop and Worker.run, complete;
// those in the dispatch code itself (stubs and method handle intrinsics
// that make no frame, their return address at sp) too.
func checkJavaDispatch(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	worker := ofThread(samples, "worker")
	callee := func(f libpf.Frame) bool {
		switch f.FunctionName {
		case "JWorkload$Add.apply", "JWorkload$Mul.apply", "JWorkload$Xor.apply", "JWorkload.viaHandle":
			return f.SourceFile == javaFile
		}
		return strings.HasPrefix(f.FunctionName, "java.lang.invoke.")
	}
	right := func(s sample) bool {
		fs := javaFrames(s.trace)
		i := slices.IndexFunc(fs, func(f libpf.Frame) bool { return f.FunctionName == "JWorkload.dispatchTop" })
		return i >= 0 && !slices.ContainsFunc(fs[:i], func(f libpf.Frame) bool { return !callee(f) }) &&
			javaFramesAre(fs[i:], []string{"JWorkload.dispatchTop", "JWorkload$Worker.run"}) && completeStack(s.trace)
	}
	// The samples whose leaf is the dispatch code: a stub's frame or a
	// method handle's intrinsic (a native method of MethodHandle).
	var inDispatch []sample
	for _, s := range worker {
		i := slices.IndexFunc(s.trace.Frames, func(f libpf.Frame) bool { return f.Kind == hotspot.Kind })
		if i < 0 {
			continue
		}
		f := s.trace.Frames[i]
		if strings.HasPrefix(f.FunctionName, "[") ||
			strings.HasPrefix(f.FunctionName, "java.lang.invoke.MethodHandle.") && f.Tier == hotspot.TierNative {
			inDispatch = append(inDispatch, s)
		}
	}
	ok, misses := tally(worker, right)
	okDispatch, _ := tally(inDispatch, right)
	t.Logf("%d samples of the worker thread, %.1f%% show a callee or none above dispatchTop and Thread.run, complete; "+
		"%d with the dispatch code as their leaf, %.1f%% of those so", len(worker), 100*share(ok, len(worker)),
		len(inDispatch), 100*share(okDispatch, len(inDispatch)))
	if len(worker) < testHz {
		t.Errorf("only %d samples of the worker thread", len(worker))
	}
	if len(inDispatch) < testHz/20 {
		t.Errorf("only %d samples in the dispatch code: the test tests little", len(inDispatch))
	}
	logJavaExamples(t, "miss", misses)
	return share(ok, len(worker)), 0.95
}

// checkJavaVThreads: the samples of the virtual threads in vLeaf show
// vLeaf, vMid and vTop above their carrier's own frames (from
// Continuation.run down to ForkJoinWorkerThread.run), complete: past the
// continuation return barrier that the oldest thawed frame returns into.
// The frames still frozen in the heap (the virtual thread's lambda and
// VirtualThread.run) are not on the stack and not asked for.
func checkJavaVThreads(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
	t.Helper()
	chain := []string{"JWorkload.vLeaf", "JWorkload.vMid", "JWorkload.vTop"}
	var inLeaf []sample
	for _, s := range samples {
		if names := javaNames(s.trace); len(names) > 0 && names[0] == chain[0] {
			inLeaf = append(inLeaf, s)
		}
	}
	ok, misses := tally(inLeaf, func(s sample) bool {
		fs := javaFrames(s.trace)
		return len(fs) > len(chain) && hasChain(javaNames(s.trace)[:len(chain)], chain) &&
			fs[0].SourceLine == hot["vLeaf"] && fs[0].SourceFile == javaFile &&
			slices.ContainsFunc(fs, func(f libpf.Frame) bool { return f.FunctionName == "jdk.internal.vm.Continuation.run" }) &&
			fs[len(fs)-1].FunctionName == "java.util.concurrent.ForkJoinWorkerThread.run" && completeStack(s.trace)
	})
	barrier, _ := tally(inLeaf, func(s sample) bool {
		return slices.ContainsFunc(s.trace.Frames, func(f libpf.Frame) bool {
			return f.Kind == hotspot.Kind && strings.HasPrefix(f.FunctionName, "[StubRoutines (continuation")
		})
	})
	t.Logf("%d samples in vLeaf, %.1f%% show %v at line %d above the carrier's frames, complete; %.1f%% through the return barrier",
		len(inLeaf), 100*share(ok, len(inLeaf)), chain, hot["vLeaf"], 100*share(barrier, len(inLeaf)))
	logTiers(t, inLeaf, chain)
	if len(inLeaf) < testHz {
		t.Errorf("only %d samples in vLeaf", len(inLeaf))
	}
	if barrier < testHz/10 {
		t.Errorf("only %d samples through the return barrier: the test tests little", barrier)
	}
	logJavaExamples(t, "miss", misses)
	return share(ok, len(inLeaf)), 0.9
}

// javaCases are the workloads TestJavaStacks runs on each JDK.
var javaCases = []javaCase{
	// The chain: mid interpreted between compiled leaf and top.
	{"chain, mid interpreted", "chain", []string{"-XX:CompileCommand=exclude,JWorkload::mid"}, checkJavaChain, nil},
	// The JIT compiles and recompiles the chain as it runs: C2's debug
	// info may put leaf's loop on its header line, and top's own lines
	// (System.nanoTime) take a share that moves with the machine's speed
	// (94.5% once in CI, 99.2–100% in 6 local runs, every miss a
	// correct stack elsewhere in the workload).
	{"chain, JIT's choice", "chain", nil, func(t *testing.T, samples []sample, hot map[string]uint32) (float64, float64) {
		got, _ := checkJavaChain(t, samples, hot)
		return got, 0.9
	}, nil},
	{"chain, -Xint", "chain", []string{"-Xint"}, checkJavaChain, nil},
	{"inlined helper", "inline", []string{"-XX:CompileCommand=dontinline,JWorkload::inlineLeaf"}, checkJavaInline, nil},
	{"recursion 40", "recursion", nil, checkJavaRecursion, nil},
	{"4 threads", "threads", nil, checkJavaThreads, nil},
	{"zlib (libz beneath)", "zlib", nil, checkJavaZlib, nil},
	// Interface calls through itable stubs and method handles through
	// their intrinsics, code without a frame of its own.
	{"dispatch stubs", "dispatch", nil, checkJavaDispatch, nil},
	// Virtual threads (JDK 21+) yielding and mounted again.
	{"virtual threads", "vthreads", nil, checkJavaVThreads, func(arch string, jdk int) bool { return jdk >= 21 }},
	// Return addresses signed (PAC) in every Java frame and stub: the
	// chain as without (the flag is arm64's; of the JDKs tested, 21 and
	// 25 have it). The JVM warns where the CPU lacks PAC, which fails the
	// case (TestJavaStacks).
	{"chain, pac-ret", "chain", []string{"-XX:CompileCommand=exclude,JWorkload::mid", "-XX:UseBranchProtection=pac-ret"},
		checkJavaChain, func(arch string, jdk int) bool { return arch == "arm64" && jdk >= 21 }},
}

// TestJavaStacks profiles each workload of JWorkload.java under every
// tested JDK and checks the Java frames of its samples: names, files, the
// leaf's line, their order among the native frames down to the thread's
// entry, and which thread they belong to.
func TestJavaStacks(t *testing.T) {
	requireRoot(t)
	classes, hot := javaWorkload(t)
	run := 4 * time.Second
	if inVM() {
		run = 3 * time.Second // in a VM, after its warm-up (vmJavaWarmup)
	}
	results := &shareResults{m: map[string][]float64{}}
	var names []string
	for _, c := range javaCases {
		names = append(names, c.name)
	}
	t.Cleanup(func() { logShareTable(t, "JDK", jdkfetch.Versions(), names, results.m) })
	for _, v := range jdkfetch.Versions() {
		t.Run("JDK "+v, func(t *testing.T) {
			pairUp(t)
			java := javaBuild(t, v)
			classes := javaClasses(classes, v)
			s := startSession(t, testHz)
			// A short run first: the daemon has then read this JDK's
			// files, as on any host after its first minutes.
			runJava(t, java, classes, "chain", time.Second)
			// Each case runs in its subtest, which a VM's selection
			// (go test -run) may leave out.
			results.init(v, len(javaCases)) // n/a where left out
			major, _ := strconv.Atoi(v)
			for i, c := range javaCases {
				if c.runsOn != nil && !c.runsOn(targetArch(), major) {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					r := runJava(t, java, classes, c.mode, run, append(javaVersionFlags(v), c.flags...)...)
					if strings.Contains(r.output, "ROP-protection") {
						t.Fatalf("the JVM did not sign return addresses:\n%s", r.output)
					}
					s.waitExited(t, r.pid)
					got, want := c.check(t, r.hotSamples(t, s.rec), hot)
					results.set(v, i, got)
					if got < want {
						t.Errorf("%.1f%% of samples as expected, want >= %.0f%%", 100*got, 100*want)
					}
				})
			}
			logRuntimeMetrics(t, s, "jvm")
		})
	}
}

// startJava starts the workload in mode for d, in a pid and mount
// namespace of its own where namespaced is set (startWorkload), and
// returns once its hot phase began.
func startJava(t *testing.T, namespaced bool, java, classes, mode string, d time.Duration, flags ...string) (*workloadRun, scriptRun) {
	t.Helper()
	cp := classes
	if namespaced {
		cp = namespacedPath(classes)
	}
	r, line := startWorkload(t, namespaced, java, javaArgs(cp, mode, d, flags)...)
	return r, scriptRun{pid: r.pid, hotFrom: hotFrom(t, line)}
}

// TestJavaProcesses: JVMs the daemon meets other than started alone under
// it: one running before it started, two of different versions at once,
// and one as pid 1 of its own pid and mount namespace. Each shows the
// chain (mid interpreted) in >= 95% of its worker's samples.
func TestJavaProcesses(t *testing.T) {
	requireRoot(t)
	classes, hot := javaWorkload(t)
	java := func(v string) string { return javaBuild(t, v) }
	if preparing() {
		for _, v := range []string{"11", "17", "21", "25"} { // the versions below
			java(v)
		}
		skipIfPreparing(t)
	}
	excludeMid := "-XX:CompileCommand=exclude,JWorkload::mid"
	check := func(t *testing.T, s *session, run scriptRun) {
		t.Helper()
		got, want := checkJavaChain(t, run.hotSamples(t, s.rec), hot)
		if got < want {
			t.Errorf("%.1f%% of samples show the chain, want >= %.0f%%", 100*got, 100*want)
		}
	}
	t.Run("started before the daemon", func(t *testing.T) {
		w, _ := startJava(t, false, java("17"), classes, "chain", 5*time.Second, excludeMid)
		time.Sleep(time.Second) // compiled and running before the daemon starts
		s := startSession(t, testHz)
		w.wait(t)
		s.stop(t)
		// Until the daemon has read the running JVM's files (its first
		// samples wait for libjvm.so's unwind tables, as any process's
		// do), its stacks end early: measured apart, bounded.
		worker := ofThread(s.rec.ofPID(w.pid), "worker")
		first := slices.IndexFunc(worker, func(smp sample) bool { return javaThreadChain(smp.trace, javaChain, hot["leaf"]) })
		t.Logf("first sample with the chain: %d of %d", first, len(worker))
		if first < 0 || first > maxWarmupSamples {
			t.Fatalf("%d samples before the first with the chain, want <= %d", first, maxWarmupSamples)
		}
		got, want := checkJavaChain(t, worker[first:], hot)
		if got < want {
			t.Errorf("%.1f%% of samples after the first show the chain, want >= %.0f%%", 100*got, 100*want)
		}
	})
	t.Run("JDK 11 and 25 at once", func(t *testing.T) {
		s := startSession(t, testHz)
		runJava(t, java("11"), classes, "chain", time.Second) // the daemon reads the JDKs' files
		runJava(t, java("25"), classes, "chain", time.Second)
		w11, run11 := startJava(t, false, java("11"), classes, "chain", 4*time.Second, excludeMid)
		w25, run25 := startJava(t, false, java("25"), classes, "chain", 4*time.Second, excludeMid)
		w11.wait(t)
		w25.wait(t)
		s.stop(t)
		check(t, s, run11)
		check(t, s, run25)
	})
	t.Run("BPF entries freed at exit", func(t *testing.T) {
		s := startSession(t, testHz)
		w, _ := startJava(t, false, java("17"), classes, "chain", 2*time.Second)
		running := s.waitEntries(t, w.pid, "a JVM configuration", func(e bpfEntries) bool { return e.configs == 1 })
		w.wait(t)
		s.waitExited(t, w.pid)
		gone := s.waitEntries(t, w.pid, "none after the exit", func(e bpfEntries) bool { return e == bpfEntries{} })
		t.Logf("JVM %d: %+v while it runs, %+v after its exit", w.pid, running, gone)
	})
	t.Run("own pid and mount namespace", func(t *testing.T) {
		s := startSession(t, testHz)
		runJava(t, java("21"), classes, "chain", time.Second)
		w, run := startJava(t, true, java("21"), classes, "chain", 4*time.Second, excludeMid)
		w.wait(t)
		s.stop(t)
		check(t, s, run)
	})
}

// TestJavaChurn is the stress run: classes loaded, compiled, deoptimized
// and unloaded without pause (mode churn), with nmethod entry barriers
// deoptimizing at random where the JDK has them (17+). No Java frame of
// the worker's samples may be misattributed: each JWorkload method must
// sit where the workload calls it, the hot method at its hot line. Frames
// whose code was freed before they were named are counted, not wrong.
func TestJavaChurn(t *testing.T) {
	requireRoot(t)
	skipIfPreparing(t)
	classes, hot := javaWorkload(t)
	// callers maps each method of the workload that runs in the worker
	// to the methods that call it; "" accepts any (the JDK calls it).
	callers := map[string][]string{
		"JWorkload$Churn.apply":           {"JWorkload.churnTop"},
		"JWorkload$Churn.<init>":          {""},
		"JWorkload$ChurnLoader.loadClass": {""},
		"JWorkload$ChurnLoader.<init>":    {"JWorkload.churnTop"},
		"JWorkload.churnTop":              {"JWorkload$Worker.run"},
		"JWorkload$Worker.run":            {"java.lang.Thread.run", "java.lang.Thread.runWith"},
		"java.lang.Thread.run":            {"<bottom>"},
	}
	for _, v := range jdkfetch.Versions() {
		t.Run("JDK "+v, func(t *testing.T) {
			java, err := jdkfetch.Java(v)
			if err != nil {
				t.Fatal(err)
			}
			flags := []string{"-XX:+UnlockDiagnosticVMOptions"}
			if v != "8" && v != "11" {
				flags = append(flags, "-XX:+DeoptimizeNMethodBarriersALot")
			}
			classes := javaClasses(classes, v)
			s := startSession(t, testHz)
			runJava(t, java, classes, "chain", time.Second)
			run := runJava(t, java, classes, "churn", 4*time.Second, flags...)
			logRuntimeMetrics(t, s, "jvm")
			stats := s.pm.Stats()
			s.stop(t)
			worker := ofThread(run.hotSamples(t, s.rec), "worker")
			var wrong, unnamed, truncated, inApply, applyAtLine int
			var wrongSamples []sample
			for _, smp := range worker {
				for _, f := range smp.trace.Frames {
					if f.Kind == hotspot.Kind && strings.HasPrefix(f.FunctionName, "[unknown") {
						unnamed++
					}
				}
				// The Java frames and the unnamed ones (code freed before
				// it was named), which may be any method: no caller check
				// across them.
				var fs []libpf.Frame
				for _, f := range smp.trace.Frames {
					if f.Kind == hotspot.Kind && (!strings.HasPrefix(f.FunctionName, "[") ||
						strings.HasPrefix(f.FunctionName, "[unknown")) {
						fs = append(fs, f)
					}
				}
				// A walk that ended with an abort frame ends cleanly: the
				// last Java frame has no caller to check.
				aborted := slices.ContainsFunc(smp.trace.Frames, func(f libpf.Frame) bool { return f.Kind == libpf.FrameAbort })
				if aborted {
					truncated++
				}
				bad := false
				for i, f := range fs {
					if i+1 < len(fs) && strings.HasPrefix(fs[i+1].FunctionName, "[unknown") {
						continue
					}
					want, ours := callers[f.FunctionName]
					if !ours {
						if strings.HasPrefix(f.FunctionName, "JWorkload") {
							bad = true // a method of the workload that never runs here
						}
						continue
					}
					caller := "<bottom>"
					if i+1 < len(fs) {
						caller = fs[i+1].FunctionName
					} else if aborted {
						continue
					}
					if !slices.Contains(want, caller) && !(slices.Contains(want, "") && !strings.HasPrefix(caller, "JWorkload")) {
						bad = true
					}
					if f.FunctionName == "JWorkload$Churn.apply" {
						inApply++
						if f.SourceLine == hot["churnApply"] {
							applyAtLine++
						}
					}
				}
				if bad {
					wrong++
					wrongSamples = append(wrongSamples, smp)
				}
			}
			t.Logf("%d samples of the worker: %d with a misattributed frame, %d frames unnamed (code freed before it was named), "+
				"%d truncated by an abort frame, %d in Churn.apply (%.1f%% at its hot line); %d runtime frames not symbolized in all",
				len(worker), wrong, unnamed, truncated, inApply, 100*share(applyAtLine, inApply), stats.RuntimeFrameErrors)
			logJavaExamples(t, "misattributed", wrongSamples)
			leaves := map[string]int{}
			for _, smp := range worker {
				leaf := "(none)"
				for _, f := range smp.trace.Frames {
					if f.Kind == hotspot.Kind {
						leaf = f.FunctionName
						break
					}
				}
				leaves[leaf]++
			}
			logTopStacks(t, leaves, 6)
			// Under this stress (code freed and its addresses reused every
			// few milliseconds) one sample in a run may be named from code
			// that replaced the sampled one before the batch was named: CI
			// saw that once in about 50 runs of JDK 21. More is a defect.
			if wrong > 1 {
				t.Errorf("%d samples with a misattributed Java frame (at most 1 allowed), e.g. %s", wrong, javaStack(wrongSamples[0]))
			}
			// Where the code was freed before it was named, the leaf is
			// unnamed: the workload ran as meant if most samples are in
			// apply or there.
			if n := inApply + leaves["[unknown HotSpot JVM frame]"]; len(worker) < testHz || share(n, len(worker)) < 0.8 {
				t.Errorf("%d of %d samples in Churn.apply or unnamed: the workload did not run as meant", n, len(worker))
			}
		})
	}
}

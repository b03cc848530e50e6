package integration

import (
	"bufio"
	"errors"
	"math"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/ruby"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/tracer"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// rubyWorkload returns the path of rbworkload.rb and the lines of its
// "# hot: NAME" marks.
func rubyWorkload(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "ruby", "rbworkload.rb")
}

// runRuby runs the workload in one mode for d, with the interpreter's
// flags.
func runRuby(t *testing.T, rb, script, mode string, d time.Duration, flags ...string) scriptRun {
	t.Helper()
	return runScript(t, exec.Command(rb, append(flags, script, mode, formatSeconds(d))...))
}

// rubyVersion returns the command that runs a tested version's Debian
// build with args (no shell, no wrapper: the VMs have neither); it fails t
// when that is not installed for the workloads' architecture, and lists
// it for the VM when the run prepares one.
func rubyVersion(t *testing.T, v string) func(args ...string) *exec.Cmd {
	t.Helper()
	requireRuntime(t, func(arch string) ([]string, error) { return rubyfetch.Tree(v, arch) },
		func() error { _, err := rubyfetch.Command(v); return err })
	return func(args ...string) *exec.Cmd {
		cmd, err := rubyfetch.Command(v, args...)
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
}

// rubyExecutable returns the command that runs ruby (a build's wrapper or
// executable) with args.
func rubyExecutable(rb string) func(args ...string) *exec.Cmd {
	return func(args ...string) *exec.Cmd { return exec.Command(rb, args...) }
}

// rubyFrame is a Ruby frame a test expects: its function and the lines
// it may be at (0 for a C function).
type rubyFrame struct {
	name  string
	lines []uint32
}

// rubyMain is the chain workload's <main>, at the chain mode's call.
func rubyMain(hot map[string]uint32) []rubyFrame {
	return []rubyFrame{{"<main>", []uint32{hot["main"]}}}
}

// rubyChain says whether fs, a sample's Ruby frames, are the chain
// workload's: Leafy#leaf at its hot line, Chain#mid, the block in
// Chain.top, Hash#each_pair and Chain.top, then outer (what called
// Chain.top), each in the script at its line.
func rubyChain(fs []libpf.Frame, script string, hot map[string]uint32, outer []rubyFrame) bool {
	// leaf's loop is three lines: the jump back has the while's.
	want := append([]rubyFrame{{"Leafy#leaf", []uint32{hot["leaf"], hot["leaf loop"], hot["leaf garbage"]}},
		{"Chain#mid", []uint32{hot["mid"]}}, {"block in top", []uint32{hot["top"]}}, {"Hash#each_pair", []uint32{0}},
		{"Chain.top", []uint32{hot["top"]}}}, outer...)
	if len(fs) != len(want) {
		return false
	}
	for i, f := range fs {
		if f.FunctionName != want[i].name || !slices.Contains(want[i].lines, f.SourceLine) ||
			(f.SourceLine != 0 && f.SourceFile != script) {
			return false
		}
	}
	return true
}

// TestRubyStacks profiles the chain workload under each tested CRuby, and
// with YJIT where a build has it, and checks its Ruby frames (rubyChain;
// Hash#each_pair is a C function whose native frames lie between the
// block and it).
func TestRubyStacks(t *testing.T) {
	requireRoot(t)
	results := map[string][]float64{}
	for _, v := range rubyfetch.Versions {
		for _, jit := range []bool{false, true} {
			name := "Ruby " + v
			if jit {
				if _, err := rubyfetch.YJITFor(v, targetArch()); errors.Is(err, rubyfetch.ErrNoYJIT) {
					t.Logf("no Ruby %s with YJIT", v)
					results[v] = append(results[v], math.NaN())
					continue
				}
				name += " --yjit"
			}
			t.Run(name, func(t *testing.T) {
				var command func(args ...string) *exec.Cmd
				if jit {
					rb, err := rubyfetch.YJIT(v)
					if err != nil {
						t.Fatal(err)
					}
					command = rubyExecutable(rb)
				} else {
					command = rubyVersion(t, v)
				}
				share, metrics, n := profileRubyChain(t, command, jit)
				results[v] = append(results[v], share)
				// Under YJIT, leaf and mid run as JIT code most of the time.
				if frames := metrics["ruby_jit_frames"]; jit && frames < uint64(n)/2 {
					t.Errorf("%d samples in YJIT code of %d, want at least half (is YJIT on?)", frames, n)
				}
			})
		}
	}
	logShareTable(t, "Ruby", rubyfetch.Versions, []string{"chain", "chain --yjit"}, results)
}

// TestRubyThreads: four Ruby threads, each in its own chain, taking turns
// on the VM lock: each thread's samples show its own chain, never a frame
// of another's (each thread has its own execution context).
func TestRubyThreads(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	for _, v := range rubyfetch.Versions {
		t.Run("Ruby "+v, func(t *testing.T) {
			command := rubyVersion(t, v)
			s := startSession(t, testHz)
			run := runScript(t, command(script, "threads", formatSeconds(4*time.Second)))
			s.stop(t)
			var n, ok, foreign int
			misses := map[string]int{}
			for _, smp := range run.hotSamples(t, s.rec) {
				name := smp.meta.ThreadName
				if len(name) != 2 || name[0] != 't' {
					continue
				}
				n++
				fs := framesOf(smp.trace, ruby.Kind)
				for _, f := range fs {
					if fn, ok := strings.CutPrefix(f.FunctionName, "Object#t"); ok && len(fn) > 2 && fn[1] == '_' && fn[:1] != name[1:] {
						foreign++
						break
					}
				}
				good := len(fs) >= 3
				for i, fn := range []string{"_leaf", "_mid", "_top"} {
					good = good && fs[i].FunctionName == "Object#"+name+fn && fs[i].SourceLine == hot[name+fn] && fs[i].SourceFile == script
				}
				if good {
					ok++
				} else {
					misses[name+": "+stackOf(smp.trace, ruby.Kind, "rb")]++
				}
			}
			t.Logf("%d samples of threads t0-t3, %.1f%% show their thread's chain, %d with another thread's frames",
				n, 100*share(ok, n), foreign)
			logTopStacks(t, misses, 4)
			if n < testHz || share(ok, n) < 0.95 || foreign > 0 {
				t.Errorf("%d of %d samples show their thread's chain (want >= 95%%), %d another thread's frames (want 0)", ok, n, foreign)
			}
		})
	}
}

// TestRubyStartedBeforeProfiler: a Ruby process running before the
// daemon starts is found and unwound as well.
func TestRubyStartedBeforeProfiler(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	command := rubyVersion(t, rubyfetch.Versions[len(rubyfetch.Versions)-1])
	skipIfPreparing(t)
	// Killed by the test; the daemon may take seconds to start under
	// emulation.
	cmd := command(script, "chain", "60")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	s := startSession(t, testHz)
	time.Sleep(3 * time.Second)
	s.stop(t)
	samples := s.rec.ofPID(cmd.Process.Pid)
	chain := func(smp sample) bool { return rubyChain(framesOf(smp.trace, ruby.Kind), script, hot, rubyMain(hot)) }
	// The process is read at its first sample: the samples before that
	// are the warm-up.
	first := slices.IndexFunc(samples, chain)
	if first < 0 || first > 20 {
		t.Fatalf("first sample with the chain: %d of %d (want within the first 20)", first, len(samples))
	}
	ok := 0
	for _, smp := range samples[first:] {
		if chain(smp) {
			ok++
		}
	}
	rest := len(samples) - first
	t.Logf("%d samples, the first with the chain is #%d; %.1f%% of it and those after with the chain", len(samples), first, 100*share(ok, rest))
	if rest < testHz || share(ok, rest) < 0.95 {
		t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, rest)
	}
}

// TestRubyForkingServer: a server forks workers that live 1 s, two at a
// time, as unicorn's and puma's recycle theirs; each is a new process
// whose samples show the chain. Those of its last TraceWakeupLatency (and
// a margin) may stay unnamed: the process's memory is gone before the
// daemon reads it.
func TestRubyForkingServer(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	cmd := rubyVersion(t, rubyfetch.Versions[len(rubyfetch.Versions)-1])(script, "fork", "6")
	s := startSession(t, testHz)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s fork: %v\n%s", cmd, err, out)
	}
	s.stop(t)
	// A worker goes on from the block it was forked with.
	outer := []rubyFrame{{"block in <main>", []uint32{hot["fork main"]}}, {"Kernel#fork", []uint32{0}}, {"<main>", []uint32{hot["fork"]}}}
	exitWindow := tracer.TraceWakeupLatency + 50*time.Millisecond
	var workers, n, ok, last, lastOK int
	misses := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		pid, found := strings.CutPrefix(line, "worker ")
		if !found {
			continue
		}
		p, err := strconv.Atoi(pid)
		if err != nil {
			t.Fatalf("the workload printed %q", line)
		}
		workers++
		samples := s.rec.ofPID(p)
		for _, smp := range samples {
			good := rubyChain(framesOf(smp.trace, ruby.Kind), script, hot, outer)
			if smp.meta.Time.After(samples[len(samples)-1].meta.Time.Add(-exitWindow)) {
				last++
				if good {
					lastOK++
				}
				continue
			}
			n++
			if good {
				ok++
			} else {
				misses[stackOf(smp.trace, ruby.Kind, "rb")]++
			}
		}
	}
	t.Logf("%d workers: %d samples before their last %v, %.1f%% with the chain; %d in it, %.1f%% with the chain",
		workers, n, exitWindow, 100*share(ok, n), last, 100*share(lastOK, last))
	logTopStacks(t, misses, 4)
	if workers < 8 || n < 4*testHz || share(ok, n) < 0.95 {
		t.Errorf("%d workers, %d of %d samples show the chain, want >= 8 workers and >= 95%%", workers, ok, n)
	}
}

// TestRubyGC: the chain while leaf allocates enough for the garbage
// collector to run many times a second and compact the heap, moving
// objects: no sample shows a frame under a wrong method. The frames above
// leaf are its allocations (a block in leaf, the C functions it calls).
func TestRubyGC(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	for _, v := range rubyfetch.Versions {
		t.Run("Ruby "+v, func(t *testing.T) {
			rb, err := rubyfetch.Ruby(v)
			if err != nil {
				t.Fatal(err)
			}
			s := startSession(t, testHz)
			run := runRuby(t, rb, script, "gc", 4*time.Second)
			s.stop(t)
			_, count, found := strings.Cut(run.output, "gc count ")
			gcs, err := strconv.Atoi(strings.TrimSpace(count))
			if !found || err != nil {
				t.Fatalf("the workload printed %q", run.output)
			}
			chain := []string{"Leafy#leaf", "Chain#mid", "block in top", "Hash#each_pair", "Chain.top", "<main>"}
			// What leaf calls: its allocations, and now, the loop's test.
			above := []string{"block in leaf", "Array#initialize", "Class#new", "Array.new", "String#*", "Integer#bit_length",
				"Object#now", "Process.clock_gettime"}
			var n, ok, wrong int
			misses := map[string]int{}
			for _, smp := range run.hotSamples(t, s.rec) {
				n++
				fs := framesOf(smp.trace, ruby.Kind)
				leaf := slices.IndexFunc(fs, func(f libpf.Frame) bool { return f.FunctionName == chain[0] })
				good := leaf >= 0 && rubyChain(fs[leaf:], script, hot, []rubyFrame{{"<main>", []uint32{hot["gc main"]}}})
				for _, f := range fs[:max(leaf, 0)] {
					good = good && slices.Contains(above, f.FunctionName)
				}
				if good {
					ok++
					continue
				}
				misses[stackOf(smp.trace, ruby.Kind, "rb")]++
				if slices.ContainsFunc(fs, func(f libpf.Frame) bool {
					return !strings.HasPrefix(f.FunctionName, "[unknown") && !slices.Contains(above, f.FunctionName) &&
						!slices.Contains(chain, f.FunctionName)
				}) {
					wrong++
				}
			}
			t.Logf("%d garbage collections; %d samples, %.1f%% with the chain, %d with a frame of another method", gcs, n, 100*share(ok, n), wrong)
			logTopStacks(t, misses, 4)
			if gcs < 40 || n < testHz || share(ok, n) < 0.95 || wrong > 0 {
				t.Errorf("%d collections (want >= 40), %d of %d samples with the chain (want >= 95%%), %d with a wrong frame (want 0)",
					gcs, ok, n, wrong)
			}
		})
	}
}

// profileRubyChain profiles the chain workload under command (with --yjit
// if yjit) and returns the share of its samples that show the chain
// after the process's warm-up, the runtime's BPF counters and the number
// of samples. Under YJIT samples count from 300 ms into the hot phase: the
// JIT's code is claimed from the process's mappings, where the daemon
// sees it once unclaimed code is reported (at most every unknown-PC report
// interval, 200 ms).
func profileRubyChain(t *testing.T, command func(args ...string) *exec.Cmd, yjit bool) (float64, map[string]uint64, int) {
	t.Helper()
	script, hot := rubyWorkload(t)
	s := startSession(t, testHz)
	args := []string{script, "chain", formatSeconds(4 * time.Second)}
	if yjit {
		args = append([]string{"--yjit"}, args...)
	}
	var metrics map[string]uint64
	run := runScriptHeld(t, command(args...), func() {
		metrics = logRuntimeMetrics(t, s, "ruby")
		s.stop(t)
	})
	chain := func(smp sample) bool { return rubyChain(framesOf(smp.trace, ruby.Kind), script, hot, rubyMain(hot)) }
	samples := warmSamples(t, run, s.rec, yjit, chain, ruby.Kind, "rb")
	ok := 0
	misses := map[string]int{}
	for _, smp := range samples {
		if chain(smp) {
			ok++
		} else {
			misses[stackOf(smp.trace, ruby.Kind, "rb")]++
		}
	}
	share := share(ok, len(samples))
	t.Logf("%d samples, %.1f%% with the chain at its lines", len(samples), 100*share)
	logTopStacks(t, misses, 4)
	if len(samples) < testHz || share < 0.95 {
		t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, len(samples))
	}
	return share, metrics, len(samples)
}

// countFunc counts the elements of s that f holds for.
func countFunc[T any](s []T, f func(T) bool) int {
	n := 0
	for _, e := range s {
		if f(e) {
			n++
		}
	}
	return n
}

// TestRubyStatic: a ruby executable with the interpreter linked in (no
// libruby), as ruby-build builds it by default, whose execution context
// is at a constant offset from the thread pointer.
func TestRubyStatic(t *testing.T) {
	requireRoot(t)
	_, rb, err := rubyfetch.Static()
	if err != nil {
		t.Fatal(err)
	}
	profileRubyChain(t, rubyExecutable(rb), false)
}

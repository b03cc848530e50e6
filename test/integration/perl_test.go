package integration

import (
	"bufio"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/perl"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/tracer"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
)

// perlWorkload returns the path of plworkload.pl and the lines of its
// "# hot: NAME" marks.
func perlWorkload(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "perl", "plworkload.pl")
}

// runPerl runs the workload in one mode for d, then stops s (see
// runScriptHeld).
func runPerl(t *testing.T, c perlCase, s *session, script, mode string, d time.Duration) scriptRun {
	t.Helper()
	return runScriptHeld(t, c.command(t, script, mode, formatSeconds(d)), func() {
		logRuntimeMetrics(t, s, "perl")
		s.stop(t)
	})
}

// perlFrame is a Perl frame a test expects: its function, file and line.
type perlFrame struct {
	name, file string
	line       uint32
}

// perlMatch says whether fs, a sample's Perl frames, are want.
func perlMatch(fs []libpf.Frame, want []perlFrame) bool {
	if len(fs) != len(want) {
		return false
	}
	for i, f := range fs {
		if f.FunctionName != want[i].name || f.SourceLine != want[i].line || f.SourceFile != want[i].file {
			return false
		}
	}
	return true
}

// perlChain is the chain mode's stack: Leafy::leaf <- Chain::mid <-
// main::top <- main, each at its line of the script.
func perlChain(script string, hot map[string]uint32) []perlFrame {
	return []perlFrame{{"Leafy::leaf", script, hot["leaf"]}, {"Chain::mid", script, hot["mid"]},
		{"main::top", script, hot["top"]}, {"main", script, hot["main"]}}
}

// perlCase is a way to run a tested perl: the executable with the
// interpreter linked in, or (libperl) Debian's launcher that runs it from
// libperl.so (perlfetch.Libperl).
type perlCase struct {
	name, version string
	libperl       bool
}

// perlVersion is the case of a tested version's executable.
func perlVersion(t *testing.T, v string) perlCase {
	c := perlCase{name: "perl " + v, version: v}
	c.require(t)
	return c
}

// require fails t when the case's perl is not installed for the
// workloads' architecture, and lists it for the VM when the run prepares
// one.
func (c perlCase) require(t *testing.T) {
	t.Helper()
	if c.libperl {
		if _, _, err := perlfetch.Libperl(c.version); err != nil {
			t.Fatal(err)
		}
		return
	}
	requireRuntime(t, func(arch string) ([]string, error) { return perlfetch.Tree(c.version, arch) },
		func() error { _, err := perlfetch.Executable(c.version); return err })
}

// command returns the command that runs the case with args.
func (c perlCase) command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	command := perlfetch.Command
	if c.libperl {
		command = perlfetch.LibperlCommand
	}
	cmd, err := command(c.version, args...)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// perlCases lists the ways to run the tested perls (each subtest calls
// require): every version's executable, and here, not in the kernel
// matrix's VMs, every version through its libperl too.
func perlCases(t *testing.T) []perlCase {
	var out []perlCase
	for _, v := range perlfetch.Versions {
		out = append(out, perlCase{name: "perl " + v, version: v})
	}
	if targetArch() != runtime.GOARCH || inVM() {
		return out
	}
	for _, v := range perlfetch.Versions {
		out = append(out, perlCase{name: "perl " + v + " libperl", version: v, libperl: true})
	}
	return out
}

// profilePerl profiles the workload in mode under c and returns the
// share of its hot samples ok accepts after the warm-up (those before the
// first it accepts, at most maxWarmupSamples; t fails below 95%).
func profilePerl(t *testing.T, c perlCase, mode string, ok func(smp sample) bool) float64 {
	t.Helper()
	script, _ := perlWorkload(t)
	s := startSession(t, testHz)
	run := runPerl(t, c, s, script, mode, 4*time.Second)
	samples := run.hotSamples(t, s.rec)
	warm := slices.IndexFunc(samples, ok)
	if warm < 0 || warm > maxWarmupSamples {
		t.Fatalf("%d hot samples before the first with the expected frames (-1: none of %d), want <= %d", warm, len(samples), maxWarmupSamples)
	}
	samples = samples[warm:]
	good := 0
	misses := map[string]int{}
	for _, smp := range samples {
		if ok(smp) {
			good++
		} else {
			misses[stackOf(smp.trace, perl.Kind, "pl")]++
		}
	}
	share := share(good, len(samples))
	t.Logf("%s: %d samples after %d of warm-up, %.1f%% with the expected Perl frames", mode, len(samples), warm, 100*share)
	logTopStacks(t, misses, 4)
	if len(samples) < 2*testHz || share < 0.95 {
		t.Errorf("%d of %d samples show the expected frames, want >= 95%% of at least %d", good, len(samples), 2*testHz)
	}
	return share
}

// TestPerlStacks profiles the chain workload under each tested perl (and
// Debian 12's through its libperl) and checks its Perl frames: names,
// files and lines, main at the bottom.
func TestPerlStacks(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	want := perlChain(script, hot)
	results := map[string][]float64{}
	var names []string
	for _, c := range perlCases(t) {
		names = append(names, c.name)
		t.Run(c.name, func(t *testing.T) {
			c.require(t)
			results[c.name] = append(results[c.name], profilePerl(t, c, "chain", func(smp sample) bool {
				return perlMatch(framesOf(smp.trace, perl.Kind), want)
			}))
		})
	}
	logShareTable(t, "Perl", names, []string{"chain"}, results)
}

// TestPerlEval: frames of eval {} and of a string eval are named
// "(eval)", as caller() names them; the string eval's code is in the file
// "(eval N)".
func TestPerlEval(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	for _, v := range perlfetch.Versions {
		t.Run("perl "+v, func(t *testing.T) {
			pl := perlVersion(t, v)
			profilePerl(t, pl, "eval", func(smp sample) bool {
				fs := framesOf(smp.trace, perl.Kind)
				if len(fs) != 6 || !strings.HasPrefix(fs[1].SourceFile, "(eval ") {
					return false
				}
				return perlMatch(fs, []perlFrame{{"main::eleaf", script, hot["eleaf"]}, {"(eval)", fs[1].SourceFile, 1},
					{"main::emid", script, hot["emid"]}, {"(eval)", script, hot["etop"]}, {"main::etop", script, hot["etop"]},
					{"main", script, hot["eval main"]}})
			})
		})
	}
}

// TestPerlSort: a sort comparator sub runs in a runops loop of its own,
// called from pp_sort's C code: its frames come above the native frames of
// sort, the frames of the sub that sorts below them.
func TestPerlSort(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	for _, v := range perlfetch.Versions {
		t.Run("perl "+v, func(t *testing.T) {
			pl := perlVersion(t, v)
			want := []perlFrame{{"Leafy::leaf", script, hot["leaf"]}, {"main::by_leaf", script, hot["by_leaf"]},
				{"main::sorter", script, hot["sorter"]}, {"main", script, hot["sort main"]}}
			profilePerl(t, pl, "sort", func(smp sample) bool {
				if !perlMatch(framesOf(smp.trace, perl.Kind), want) {
					return false
				}
				// A native frame between the comparator and sorter.
				fr := smp.trace.Frames
				cmp := slices.IndexFunc(fr, func(f libpf.Frame) bool { return f.FunctionName == "main::by_leaf" })
				return cmp >= 0 && cmp+1 < len(fr) && fr[cmp+1].Kind == libpf.FrameNative
			})
		})
	}
}

// perlOwnChain says whether a sample's Perl frames start with chain N's
// tN_leaf <- tN_mid <- tN_top at their lines, and whether any frame is of
// another chain.
func perlOwnChain(fs []libpf.Frame, n int, script string, hot map[string]uint32) (own, foreign bool) {
	own = len(fs) >= 3
	for i, fn := range []string{"_leaf", "_mid", "_top"} {
		name := fmt.Sprintf("t%d%s", n, fn)
		own = own && fs[i].FunctionName == "main::"+name && fs[i].SourceLine == hot[name] && fs[i].SourceFile == script
	}
	for _, f := range fs {
		if rest, ok := strings.CutPrefix(f.FunctionName, "main::t"); ok && len(rest) > 2 && rest[1] == '_' && rest[:1] != strconv.Itoa(n) {
			foreign = true
		}
	}
	return own, foreign
}

// TestPerlThreads: four ithreads, each in its own chain and with its own
// interpreter: each thread's samples show its own chain, never a frame of
// another's.
func TestPerlThreads(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	for _, v := range perlfetch.Versions {
		t.Run("perl "+v, func(t *testing.T) {
			pl := perlVersion(t, v)
			s := startSession(t, testHz)
			run := runPerl(t, pl, s, script, "threads", 4*time.Second)
			var ok, foreign int
			per := map[string]int{}
			misses := map[string]int{}
			for _, smp := range run.hotSamples(t, s.rec) {
				name := smp.meta.ThreadName
				if len(name) != 2 || name[0] != 't' {
					continue
				}
				per[name]++
				n, _ := strconv.Atoi(name[1:])
				own, other := perlOwnChain(framesOf(smp.trace, perl.Kind), n, script, hot)
				if other {
					foreign++
				}
				if own && !other {
					ok++
				} else {
					misses[name+": "+stackOf(smp.trace, perl.Kind, "pl")]++
				}
			}
			n := per["t0"] + per["t1"] + per["t2"] + per["t3"]
			t.Logf("%d samples of threads t0-t3 (%v), %.1f%% show their thread's chain, %d with another thread's frames",
				n, per, 100*share(ok, n), foreign)
			logTopStacks(t, misses, 4)
			if len(per) != 4 || n < 2*testHz || share(ok, n) < 0.95 || foreign > 0 {
				t.Errorf("%d threads sampled (want 4), %d of %d samples show their thread's chain (want >= 95%%), %d another thread's frames (want 0)",
					len(per), ok, n, foreign)
			}
		})
	}
}

// TestPerlForks: four forked children, each in its own chain: each
// child's samples show its chain (its interpreter is the parent's,
// copied), never another's.
func TestPerlForks(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	for _, v := range perlfetch.Versions {
		t.Run("perl "+v, func(t *testing.T) {
			pl := perlVersion(t, v)
			s := startSession(t, testHz)
			run := runPerl(t, pl, s, script, "fork", 4*time.Second)
			// A child is a new process: its samples before the daemon
			// described it to the unwinder (those before the first with a
			// Perl frame) are its warm-up. Its samples of its last
			// TraceWakeupLatency (and a margin) may stay unnamed: its
			// memory is gone before the daemon reads it. Both are counted
			// apart.
			exitWindow := tracer.TraceWakeupLatency + 50*time.Millisecond
			var children, n, ok, foreign, last, lastOK, warm int
			misses := map[string]int{}
			for _, line := range strings.Split(run.output, "\n") {
				var child, pid int
				if _, err := fmt.Sscanf(line, "child %d %d", &child, &pid); err != nil {
					continue
				}
				children++
				samples := s.rec.ofPID(pid)
				first := slices.IndexFunc(samples, func(smp sample) bool { return len(framesOf(smp.trace, perl.Kind)) > 0 })
				if first < 0 || first > maxWarmupSamples {
					t.Errorf("child %d: %d samples before the first with Perl frames (-1: none of %d), want <= %d",
						child, first, len(samples), maxWarmupSamples)
					continue
				}
				warm += first
				samples = samples[first:]
				for _, smp := range samples {
					own, other := perlOwnChain(framesOf(smp.trace, perl.Kind), child, script, hot)
					if other {
						foreign++
					}
					good := own && !other
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
						misses[fmt.Sprintf("child %d: %s", child, stackOf(smp.trace, perl.Kind, "pl"))]++
					}
				}
			}
			t.Logf("%d children: %d samples of warm-up; %d samples before their last %v, %.1f%% with the child's chain; %d in it, %.1f%% with the chain; %d with another child's frames",
				children, warm, n, exitWindow, 100*share(ok, n), last, 100*share(lastOK, last), foreign)
			logTopStacks(t, misses, 4)
			if children != 4 || n < 2*testHz || share(ok, n) < 0.95 || foreign > 0 {
				t.Errorf("%d children (want 4), %d of %d samples with the child's chain (want >= 95%%), %d another's frames (want 0)",
					children, ok, n, foreign)
			}
		})
	}
}

// TestPerlStartedBeforeProfiler: a perl process running before the
// daemon starts is found and unwound as well.
func TestPerlStartedBeforeProfiler(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	pl := perlVersion(t, perlfetch.Versions[len(perlfetch.Versions)-1])
	skipIfPreparing(t)
	// Killed by the test; the daemon may take seconds to start under
	// emulation.
	cmd := pl.command(t, script, "chain", "60")
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
	want := perlChain(script, hot)
	chain := func(smp sample) bool { return perlMatch(framesOf(smp.trace, perl.Kind), want) }
	// The process is read at its first sample: the samples before that
	// are the warm-up.
	first := slices.IndexFunc(samples, chain)
	if first < 0 || first > maxWarmupSamples {
		t.Fatalf("first sample with the chain: %d of %d (want within the first %d)", first, len(samples), maxWarmupSamples)
	}
	ok := countFunc(samples[first:], chain)
	rest := len(samples) - first
	t.Logf("%d samples, the first with the chain is #%d; %.1f%% of it and those after with the chain", len(samples), first, 100*share(ok, rest))
	if rest < 2*testHz || share(ok, rest) < 0.95 {
		t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, rest)
	}
}

// TestPerlRecursion: 41 frames of one sub, more contexts than one run of
// the BPF unwinder walks (it tail-calls itself to go on), all reported in
// order down to main.
func TestPerlRecursion(t *testing.T) {
	requireRoot(t)
	script, hot := perlWorkload(t)
	want := []perlFrame{{"Leafy::leaf", script, hot["leaf"]}}
	for range 41 {
		want = append(want, perlFrame{"main::rec", script, hot["rec"]})
	}
	want = append(want, perlFrame{"main", script, hot["recursion main"]})
	for _, v := range perlfetch.Versions {
		t.Run("perl "+v, func(t *testing.T) {
			pl := perlVersion(t, v)
			profilePerl(t, pl, "recursion", func(smp sample) bool { return perlMatch(framesOf(smp.trace, perl.Kind), want) })
		})
	}
}

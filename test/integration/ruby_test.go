package integration

import (
	"bufio"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/ruby"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// rubyWorkload returns the path of rbworkload.rb and the lines of its
// "# hot: NAME" marks.
func rubyWorkload(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "ruby", "rbworkload.rb")
}

// runRuby runs the workload in one mode for d.
func runRuby(t *testing.T, rb, script, mode string, d time.Duration) pythonRun {
	t.Helper()
	cmd := exec.Command(rb, script, mode, formatSeconds(d))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", rb, mode, err, out)
	}
	return pythonRun{pid: cmd.Process.Pid, hotFrom: hotFrom(t, string(out))}
}

// rubyFrames returns a trace's Ruby frames, leaf first.
func rubyFrames(tr *libpf.Trace) []libpf.Frame {
	var out []libpf.Frame
	for _, f := range tr.Frames {
		if f.Kind == ruby.Kind {
			out = append(out, f)
		}
	}
	return out
}

// rubyStack is a trace's frames as the failure messages show them: Ruby
// frames with their line, native frames by name.
func rubyStack(tr *libpf.Trace) string {
	return strings.Join(stackNames(tr, ruby.Kind, "rb"), " ")
}

// TestRubyStacks profiles the chain workload under each tested CRuby and
// checks its Ruby frames: Leafy#leaf at its hot line, Chain#mid, the
// block in Chain.top, Hash#each_pair (a C function: its native frames lie
// between the block and it), Chain.top and <main>, each in the script at
// its line.
func TestRubyStacks(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	results := map[string][]float64{}
	for _, v := range rubyfetch.Versions {
		t.Run("Ruby "+v, func(t *testing.T) {
			rb, err := rubyfetch.Ruby(v)
			if err != nil {
				t.Fatal(err)
			}
			s := startSession(t, testHz)
			run := runRuby(t, rb, script, "chain", 4*time.Second)
			logRuntimeMetrics(t, s, "ruby")
			s.stop(t)
			samples := run.hotSamples(t, s.rec)
			// leaf's loop is two lines: the jump back has the while's.
			want := []struct {
				name  string
				lines []uint32
			}{{"Leafy#leaf", []uint32{hot["leaf"], hot["leaf loop"]}}, {"Chain#mid", []uint32{hot["mid"]}},
				{"block in top", []uint32{hot["top"]}}, {"Hash#each_pair", []uint32{0}}, {"Chain.top", []uint32{hot["top"]}},
				{"<main>", []uint32{hot["main"]}}}
			ok := 0
			misses := map[string]int{}
			for _, smp := range samples {
				fs := rubyFrames(smp.trace)
				good := len(fs) == len(want)
				for i := 0; good && i < len(want); i++ {
					f := fs[i]
					good = f.FunctionName == want[i].name && slices.Contains(want[i].lines, f.SourceLine) &&
						(f.SourceLine == 0 || f.SourceFile == script)
				}
				if good {
					ok++
				} else {
					misses[rubyStack(smp.trace)]++
				}
			}
			share := share(ok, len(samples))
			results[v] = []float64{share}
			t.Logf("%d samples, %.1f%% with the chain at its lines", len(samples), 100*share)
			logTopStacks(t, misses, 4)
			if len(samples) < testHz || share < 0.95 {
				t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, len(samples))
			}
		})
	}
	logShareTable(t, "Ruby", rubyfetch.Versions, []string{"chain"}, results)
}

// TestRubyThreads: four Ruby threads, each in its own chain, taking turns
// on the VM lock: each thread's samples show its own chain, never a frame
// of another's (each thread has its own execution context).
func TestRubyThreads(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	for _, v := range rubyfetch.Versions {
		t.Run("Ruby "+v, func(t *testing.T) {
			rb, err := rubyfetch.Ruby(v)
			if err != nil {
				t.Fatal(err)
			}
			s := startSession(t, testHz)
			run := runRuby(t, rb, script, "threads", 4*time.Second)
			s.stop(t)
			var n, ok, foreign int
			misses := map[string]int{}
			for _, smp := range run.hotSamples(t, s.rec) {
				name := smp.meta.ThreadName
				if len(name) != 2 || name[0] != 't' {
					continue
				}
				n++
				fs := rubyFrames(smp.trace)
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
					misses[name+": "+rubyStack(smp.trace)]++
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
	rb, err := rubyfetch.Ruby(rubyfetch.Versions[len(rubyfetch.Versions)-1])
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(rb, script, "chain", "5")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	s := startSession(t, testHz)
	time.Sleep(3 * time.Second)
	s.stop(t)
	samples := s.rec.ofPID(cmd.Process.Pid)
	chain := func(smp sample) bool {
		fs := rubyFrames(smp.trace)
		return len(fs) == 6 && fs[0].FunctionName == "Leafy#leaf" && fs[5].FunctionName == "<main>" && fs[5].SourceLine == hot["main"]
	}
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

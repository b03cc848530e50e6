package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// threadRoots are the outermost functions of complete stacks: where the
// kernel starts a program's main thread, another thread, or where Go starts
// a goroutine or a thread of its own (named with or without their ABI
// suffix, from symbols or from .gopclntab).
var threadRoots = []string{"_start", "start_thread", "__clone", "__clone3", "runtime.goexit",
	"runtime.mstart", "runtime.rt0_go"}

// isThreadRoot says whether name is one of threadRoots.
func isThreadRoot(name string) bool {
	return slices.Contains(threadRoots, strings.TrimSuffix(name, ".abi0"))
}

// startupWindow is how long after the daemon's first export its stacks of
// processes busy at its start must already be complete.
const startupWindow = 10 * time.Second

// TestStartupAccuracy starts the daemon on a host already busy with twelve
// processes (C, Go and Python, four of them in libLLVM, a library of a
// million stack deltas): from its first export on, 90% of their samples
// must have complete stacks, and no trace or process event may be lost.
// The stacks are complete only once the processes' files are read and
// their deltas loaded: this is the start-up a restart on a busy host gets.
func TestStartupAccuracy(t *testing.T) {
	requireRoot(t)
	daemon := buildDaemon(t)
	cBin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer")
	llvmBin := buildWorkload(t, "llvmloop", "-O2", "-fomit-frame-pointer")
	goBin, _ := buildGo(t, "gochain")
	skipIfPreparing(t)
	pyScript, _ := pythonWorkload(t)
	pythons := pythonInterpreters(t)

	const seconds = "120" // ended by the test
	var cmds []*exec.Cmd
	for i := range 12 {
		var c *exec.Cmd
		switch {
		case i < 3:
			c = exec.Command(cBin, seconds)
		case i < 6:
			c = exec.Command(goBin, seconds)
		case i < 8:
			c = exec.Command(pythons[i%len(pythons)].path, pyScript, "chain", seconds)
		default:
			c = exec.Command(llvmBin, seconds)
		}
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	busy := map[int64]string{}
	for _, c := range cmds {
		busy[int64(c.Process.Pid)] = filepath.Base(c.Path)
	}
	time.Sleep(2 * time.Second) // all of them in their hot loops

	out := t.TempDir()
	start := time.Now()
	d := testenv.StartDaemon(t, nil, daemon, "-output-dir="+out, "-reporter-interval=1s",
		"-samples-per-second="+strconv.Itoa(testHz))
	var firstExport time.Time
	for firstExport.IsZero() {
		if files, _ := filepath.Glob(filepath.Join(out, "profile-*.pb.gz")); len(files) > 0 {
			firstExport = time.Now()
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal("no profile written within a minute of start")
		}
		d.Alive(t, 20*time.Millisecond)
	}
	d.Alive(t, time.Until(firstExport.Add(startupWindow)))
	d.Stop(t, time.Minute)
	for _, c := range cmds {
		if c.ProcessState != nil {
			t.Fatalf("workload %s exited early", c.Path)
		}
	}

	// Per second since the first export: the busy processes' samples,
	// and those with complete stacks.
	type second struct{ samples, complete int64 }
	perSecond := map[int]*second{}
	incomplete := map[string]int{}
	for _, p := range readPprofFiles(t, out) {
		sec := int(time.Unix(0, p.TimeNanos+p.DurationNanos).Sub(firstExport).Round(time.Second) / time.Second)
		for _, s := range p.Sample {
			pid := s.NumLabel["pid"]
			if len(pid) == 0 || busy[pid[0]] == "" {
				continue
			}
			ps := perSecond[sec]
			if ps == nil {
				ps = &second{}
				perSecond[sec] = ps
			}
			ps.samples += s.Value[0]
			names := sampleFunctions(s)
			if len(names) > 0 && isThreadRoot(names[len(names)-1]) {
				ps.complete += s.Value[0]
			} else {
				incomplete[busy[pid[0]]+": "+strings.Join(names, ";")] += int(s.Value[0])
			}
		}
	}
	var secs []int
	var samples, complete int64
	for s, ps := range perSecond {
		secs = append(secs, s)
		samples += ps.samples
		complete += ps.complete
	}
	sort.Ints(secs)
	var curve []string
	for _, s := range secs {
		ps := perSecond[s]
		curve = append(curve, strconv.Itoa(s)+"s:"+strconv.FormatFloat(100*float64(ps.complete)/float64(ps.samples), 'f', 0, 64)+"%")
	}
	t.Logf("first export %.2f s after start; complete stacks per second since it: %s",
		firstExport.Sub(start).Seconds(), strings.Join(curve, " "))
	logTopStacks(t, incomplete, 8)

	log := readFile(t, d.LogPath)
	lost := map[string]int{}
	for _, field := range []string{"bpf_traces_lost", "bpf_process_events_lost", "queue_traces_lost", "queue_process_events_lost", "delta_mappings_dropped"} {
		lost[field] = stoppedField(t, log, field)
	}
	t.Logf("%d samples of the busy processes, %d (%.1f%%) complete; lost: %v", samples, complete,
		100*float64(complete)/float64(max(samples, 1)), lost)
	if samples < int64(startupWindow.Seconds())*testHz {
		t.Errorf("only %d samples of the busy processes", samples)
	}
	if float64(complete) < 0.9*float64(samples) {
		t.Errorf("%d of %d samples complete, want >= 90%%", complete, samples)
	}
	for field, n := range lost {
		if n != 0 {
			t.Errorf("%s = %d, want 0", field, n)
		}
	}
}

// sampleFunctions are the function names of a pprof sample, leaf first,
// inlined frames included.
func sampleFunctions(s *profile.Sample) []string {
	var names []string
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function != nil {
				names = append(names, line.Function.Name)
			}
		}
		if len(loc.Line) == 0 {
			names = append(names, "?")
		}
	}
	return names
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stoppedField is a numeric field of the daemon's final "Stopped" line.
func stoppedField(t *testing.T, log, name string) int {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "msg=Stopped") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, name+"="); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("%s in %q: %v", name, line, err)
				}
				return n
			}
		}
	}
	t.Fatalf("no %s in the daemon's Stopped line", name)
	return 0
}

package integration

import (
	"fmt"
	"io"
	"maps"
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

	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// threadRoots are the outermost functions of complete stacks: where the
// kernel starts a program's main thread, another thread, or where Go starts
// a goroutine or a thread of its own (named with or without their ABI
// suffix, from symbols or from .gopclntab), or Go's scheduler and signal
// handler begin on their own stacks (mcall switches to the thread's g0
// stack, the kernel enters sigtramp on the signal stack: Go's own
// traceback ends there too).
var threadRoots = []string{"_start", "start_thread", "__clone", "__clone3", "runtime.goexit",
	"runtime.mstart", "runtime.rt0_go", "runtime.mcall", "runtime.sigtramp", "runtime.cgoSigtramp"}

// isThreadRoot says whether name is one of threadRoots.
func isThreadRoot(name string) bool {
	return slices.Contains(threadRoots, strings.TrimSuffix(name, ".abi0"))
}

// startupWindow is how long after the daemon's first export its stacks of
// processes busy at its start are measured.
const startupWindow = 10 * time.Second

// startupSettle is how long after its first export a restarted daemon may
// take before every busy process's stacks must be complete.
const startupSettle = time.Second

// TestStartupAccuracy starts the daemon twice on a host already busy with
// fifteen processes in every language we unwind — C (one in libLLVM, a
// library of a million stack deltas), C++, Go, four CPythons, a JVM, two
// Node processes, Ruby, PHP and Perl, all started before the daemon:
// first with an empty stack-delta cache, then again with the cache the
// first run filled, as a restart finds it. Neither may lose a trace or a
// process event. From its first export on, 90% of the busy processes'
// samples must have complete stacks on the cold start; on the restart,
// from startupSettle after its first export, 98% of each process's.
func TestStartupAccuracy(t *testing.T) {
	requireRoot(t)
	daemon := buildDaemon(t)
	busy := startBusyHost(t)
	cache := t.TempDir()
	cold := measureStartup(t, "cold", daemon, busy, cache, nil)
	warm := measureStartup(t, "restart", daemon, busy, cache, lateCommands(t))

	if share := cold.share(0); share < 0.9 {
		t.Errorf("cold start: %.1f%% of the busy processes' samples complete, want >= 90%%", 100*share)
	}
	settled := int(startupSettle / time.Second)
	for pid, kind := range busy {
		n, complete := warm.ofProcess(pid, settled)
		if n < 20 {
			t.Errorf("restart: %s (pid %d): only %d samples", kind, pid, n)
		} else if float64(complete) < 0.98*float64(n) {
			t.Errorf("restart: %s (pid %d): %d of %d samples complete from %v after the first export, want >= 98%%",
				kind, pid, complete, n, startupSettle)
		}
	}
	for pid, kind := range warm.late {
		n, complete := warm.ofProcess(pid, lateSettle)
		if n < 20 {
			t.Errorf("%s (pid %d), started %v after the restart's first export: only %d samples",
				kind, pid, lateStart, n)
		} else if float64(complete) < 0.98*float64(n) {
			t.Errorf("%s (pid %d), started %v after the restart's first export: %d of %d samples complete "+
				"from its second second, want >= 98%%", kind, pid, lateStart, complete, n)
		}
	}
}

// lateStart is when lateCommands start, after the restarted daemon's first
// export; their samples are counted by the second since their own start,
// from lateSettle on (their first second runs the interpreter and compiles
// the hot loop: a JVM's JIT code exists from about then).
const (
	lateStart  = 2 * time.Second
	lateSettle = 1
)

// lateCommands are a JVM and a Node process to start on the busy host while
// a daemon runs.
func lateCommands(t *testing.T) map[string]*exec.Cmd {
	t.Helper()
	classes, _ := javaWorkload(t)
	nodeScript, _ := nodeWorkload(t)
	const seconds = "300" // killed by the test
	return map[string]*exec.Cmd{
		"late java": exec.Command(jdkfetch.SystemJava, "-XX:CompileCommand=quiet", "-cp", classes, "JWorkload", "chain", seconds),
		"late node": exec.Command(nodefetch.SystemNode, nodeScript, "chain", seconds),
	}
}

// startBusyHost starts the busy processes of TestStartupAccuracy, waits
// until they are in their hot loops (JIT code compiled), and returns what
// each pid runs. They are killed when t ends.
func startBusyHost(t *testing.T) map[int64]string {
	t.Helper()
	cBin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer")
	llvmBin := buildWorkload(t, "llvmloop", "-O2", "-fomit-frame-pointer")
	goBin, _ := buildGo(t, "gochain")
	skipIfPreparing(t)
	cppBin := filepath.Join(t.TempDir(), "cppchain")
	run(t, "", nil, "g++", "-O2", "-fomit-frame-pointer", "-o", cppBin, filepath.Join(workloadDir(""), "cppchain.cpp"))
	pyScript, _ := pythonWorkload(t)
	classes, _ := javaWorkload(t)
	nodeScript, _ := nodeWorkload(t)
	rbScript, _ := rubyWorkload(t)
	phpScript, _ := phpWorkload(t)
	plScript, _ := perlWorkload(t)
	rb, err := rubyfetch.Ruby(rubyfetch.Versions[0])
	if err != nil {
		t.Fatal(err)
	}
	php, err := phpfetch.PHP(phpfetch.Versions[0])
	if err != nil {
		t.Fatal(err)
	}
	pl, err := perlfetch.Perl("5.36")
	if err != nil {
		t.Fatal(err)
	}

	const seconds = "300" // killed by the test
	cmds := map[string]*exec.Cmd{
		"c":      exec.Command(cBin, seconds),
		"llvm":   exec.Command(llvmBin, seconds),
		"c++":    exec.Command(cppBin, seconds),
		"go 1":   exec.Command(goBin, seconds),
		"go 2":   exec.Command(goBin, seconds),
		"java":   exec.Command(jdkfetch.SystemJava, "-XX:CompileCommand=quiet", "-cp", classes, "JWorkload", "chain", seconds),
		"node 1": exec.Command(nodefetch.SystemNode, nodeScript, "chain", seconds),
		"node 2": exec.Command(nodefetch.SystemNode, nodeScript, "chain", seconds),
		"ruby":   exec.Command(rb, rbScript, "chain", seconds),
		"php":    php.Command(phpScript, "chain", seconds),
		"perl":   exec.Command(pl, plScript, "chain", seconds),
	}
	for i, py := range pythonInterpreters(t)[:4] {
		cmds["python "+strconv.Itoa(i+1)] = exec.Command(py.path, pyScript, "chain", seconds)
	}
	busy := startCommands(t, cmds)
	// All in their hot loops, the JVM's and Node's compiled.
	time.Sleep(8 * time.Second)
	for pid, kind := range busy {
		if _, err := os.Stat("/proc/" + strconv.FormatInt(pid, 10)); err != nil {
			t.Fatalf("%s exited early", kind)
		}
	}
	return busy
}

// startCommands starts cmds, killed when t ends, and returns what each pid
// runs.
func startCommands(t *testing.T, cmds map[string]*exec.Cmd) map[int64]string {
	t.Helper()
	started := map[int64]string{}
	for kind, c := range cmds {
		c.Stdout, c.Stderr = io.Discard, os.Stderr
		if err := c.Start(); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		t.Cleanup(func() {
			_ = c.Process.Kill()
			_ = c.Wait()
		})
		started[int64(c.Process.Pid)] = kind
	}
	return started
}

// startupMeasure is what one start of the daemon on the busy host gave.
type startupMeasure struct {
	// perSecond are the busy processes' samples per pid and second since
	// the first export, the late processes' since their start.
	perSecond map[int64]map[int]*startupSecond
	// late are the processes started while the daemon ran.
	late map[int64]string
}

type startupSecond struct{ samples, complete int64 }

// share is the share of complete samples from second from on.
func (m startupMeasure) share(from int) float64 {
	var n, c int64
	for pid := range m.perSecond {
		if m.late[pid] != "" {
			continue
		}
		pn, pc := m.ofProcess(pid, from)
		n, c = n+pn, c+pc
	}
	return float64(c) / float64(max(n, 1))
}

// ofProcess counts pid's samples and complete ones from second from on.
func (m startupMeasure) ofProcess(pid int64, from int) (n, complete int64) {
	for sec, s := range m.perSecond[pid] {
		if sec >= from {
			n, complete = n+s.samples, complete+s.complete
		}
	}
	return n, complete
}

// measureStartup starts the daemon with the stack-delta cache dir and
// measures its stacks of the busy processes from its first export for
// startupWindow, and of the late commands, started lateStart after it, from
// their start. It fails t if a trace or process event was lost.
func measureStartup(t *testing.T, name, daemon string, busy map[int64]string, cache string,
	late map[string]*exec.Cmd) startupMeasure {
	t.Helper()
	out := t.TempDir()
	start := time.Now()
	d := testenv.StartDaemon(t, nil, daemon, "-output-dir="+out, "-reporter-interval=1s",
		"-samples-per-second="+strconv.Itoa(testHz), "-delta-cache="+cache)
	var firstExport time.Time
	for firstExport.IsZero() {
		if files, _ := filepath.Glob(filepath.Join(out, "profile-*.pb.gz")); len(files) > 0 {
			firstExport = time.Now()
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("%s: no profile written within a minute of start", name)
		}
		d.Alive(t, 20*time.Millisecond)
	}
	lateStarted := map[int64]time.Time{}
	whatRuns := maps.Clone(busy)
	if len(late) > 0 {
		d.Alive(t, time.Until(firstExport.Add(lateStart)))
		started := time.Now()
		for pid, kind := range startCommands(t, late) {
			lateStarted[pid] = started
			whatRuns[pid] = kind
		}
	}
	d.Alive(t, time.Until(firstExport.Add(startupWindow)))
	logMemory(t, name, d.Cmd.Process.Pid)
	d.Stop(t, time.Minute)

	m := startupMeasure{perSecond: map[int64]map[int]*startupSecond{}, late: map[int64]string{}}
	for pid := range lateStarted {
		m.late[pid] = whatRuns[pid]
	}
	incomplete := map[string]int{}
	perKind := map[string]*startupSecond{}
	for _, p := range readPprofFiles(t, out) {
		end := time.Unix(0, p.TimeNanos+p.DurationNanos)
		for _, s := range p.Sample {
			pid := s.NumLabel["pid"]
			if len(pid) == 0 || whatRuns[pid[0]] == "" {
				continue
			}
			sec := int(end.Sub(firstExport).Round(time.Second) / time.Second)
			if started, ok := lateStarted[pid[0]]; ok {
				// The interval that ended in its second second held
				// its first samples.
				sec = int(end.Sub(started)/time.Second) - 1
			}
			if m.perSecond[pid[0]] == nil {
				m.perSecond[pid[0]] = map[int]*startupSecond{}
			}
			ps := m.perSecond[pid[0]][sec]
			if ps == nil {
				ps = &startupSecond{}
				m.perSecond[pid[0]][sec] = ps
			}
			kind := strings.TrimRight(whatRuns[pid[0]], " 0123456789")
			if perKind[kind] == nil {
				perKind[kind] = &startupSecond{}
			}
			ps.samples += s.Value[0]
			perKind[kind].samples += s.Value[0]
			names := sampleFunctions(s)
			if completeStartupStack(names) {
				ps.complete += s.Value[0]
				perKind[kind].complete += s.Value[0]
			} else {
				incomplete[whatRuns[pid[0]]+": "+strings.Join(names, ";")] += int(s.Value[0])
			}
		}
	}
	var curve []string
	for sec := -5; sec <= int(startupWindow/time.Second); sec++ {
		var n, c int64
		for pid, secs := range m.perSecond {
			if s := secs[sec]; s != nil && m.late[pid] == "" {
				n, c = n+s.samples, c+s.complete
			}
		}
		if n > 0 {
			curve = append(curve, fmt.Sprintf("%ds:%.0f%%", sec, 100*float64(c)/float64(n)))
		}
	}
	var kinds []string
	for k, s := range perKind {
		kinds = append(kinds, fmt.Sprintf("%s %.1f%%", k, 100*float64(s.complete)/float64(max(s.samples, 1))))
	}
	sort.Strings(kinds)
	t.Logf("%s: first export %.2f s after start; complete stacks per second since it: %s; per runtime: %s",
		name, firstExport.Sub(start).Seconds(), strings.Join(curve, " "), strings.Join(kinds, ", "))
	for pid, kind := range m.late {
		var secs []string
		for sec := 0; sec <= int(startupWindow/time.Second); sec++ {
			if s := m.perSecond[pid][sec]; s != nil {
				secs = append(secs, fmt.Sprintf("%ds:%d/%d", sec, s.complete, s.samples))
			}
		}
		t.Logf("%s: %s started %v after the first export: complete of its samples per second since its start: %s",
			name, kind, lateStart, strings.Join(secs, " "))
	}
	logTopStacks(t, incomplete, 8)

	log := readFile(t, d.LogPath)
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "busy processes in") || strings.Contains(line, "msg=\"Sampling ") {
			t.Logf("%s: daemon: %s", name, line)
		}
	}
	lost := map[string]int{}
	for _, field := range []string{"bpf_traces_lost", "bpf_process_events_lost", "queue_traces_lost",
		"queue_process_events_lost", "delta_mappings_dropped"} {
		lost[field] = stoppedField(t, log, field)
	}
	t.Logf("%s: %.1f%% of the busy processes' samples complete; lost: %v", name, 100*m.share(-100), lost)
	for field, n := range lost {
		if n != 0 {
			t.Errorf("%s: %s = %d, want 0", name, field, n)
		}
	}
	return m
}

// logMemory logs a daemon's peak resident set and its resident set now, for
// the start-up's cost in memory (not checked: it varies with what else runs).
func logMemory(t *testing.T, name string, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Logf("%s: %v", name, err)
		return
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	t.Logf("%s: daemon's resident set: peak %s, now %s", name, fields["VmHWM"], fields["VmRSS"])
}

// completeStartupStack says a sample's stack, leaf first, is complete:
// it ends where a thread begins, and no frame is unnamed code.
func completeStartupStack(names []string) bool {
	if len(names) == 0 || !isThreadRoot(names[len(names)-1]) {
		return false
	}
	for _, n := range names {
		if n == "[anonymous executable memory]" || strings.HasPrefix(n, "[unknown ") {
			return false
		}
	}
	return true
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

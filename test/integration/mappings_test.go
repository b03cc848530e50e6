package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// Stacks of the dlopen workload: before the load, and in the library.
var (
	dlWaitStack = regexp.MustCompile(`^dm_wait;` + cRoot + `$`)
	dlLibStack  = regexp.MustCompile(`^dl_leaf;dl_top;dm_call;` + cRoot + `$`)
)

// dlopenRun is a running dlopen workload.
type dlopenRun struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startDlopen(t *testing.T, bin, lib string, delay, total time.Duration, mappings int) *dlopenRun {
	t.Helper()
	r := &dlopenRun{}
	args := []string{lib, formatSeconds(delay), formatSeconds(total)}
	if mappings > 0 {
		args = append(args, strconv.Itoa(mappings))
	}
	r.cmd = exec.Command(bin, args...)
	r.cmd.Stdout = &r.out
	r.cmd.Stderr = os.Stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// wait returns the wall-clock times the workload printed ("mapped",
// "loaded") and the CPU time it used.
func (r *dlopenRun) wait(t *testing.T) (map[string]time.Time, time.Duration) {
	t.Helper()
	if err := r.cmd.Wait(); err != nil {
		t.Fatalf("dlopen workload: %v\n%s", err, r.out.String())
	}
	times := map[string]time.Time{}
	sc := bufio.NewScanner(&r.out)
	for sc.Scan() {
		name, secs, _ := strings.Cut(sc.Text(), " ")
		f, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			t.Fatalf("dlopen workload printed %q", sc.Text())
		}
		times[name] = time.Unix(0, int64(f*1e9))
	}
	if times["loaded"].IsZero() {
		t.Fatalf("dlopen workload did not report its load:\n%s", r.out.String())
	}
	ps := r.cmd.ProcessState
	return times, ps.UserTime() + ps.SystemTime()
}

// shareCounter counts samples and those with the expected stack.
type shareCounter struct {
	samples, full int
	misses        map[string]int
}

func (c *shareCounter) add(stack string, ok bool) {
	c.samples++
	if ok {
		c.full++
		return
	}
	if c.misses == nil {
		c.misses = map[string]int{}
	}
	c.misses[stack]++
}

func (c *shareCounter) share() float64 { return float64(c.full) / float64(max(c.samples, 1)) }

func (c *shareCounter) String() string {
	return fmt.Sprintf("%d of %d samples (%.1f%%)", c.full, c.samples, 100*c.share())
}

// dlopenShares sorts a dlopen workload's samples from `from` on into before
// the load, the first second after it, and later, and counts those with the
// stack expected then.
func dlopenShares(samples []sample, bin string, syms *symbolTable, from, loaded time.Time) (before, first, later shareCounter) {
	for _, smp := range samples {
		at := smp.meta.Time
		stack := stackString(smp.trace, bin, syms)
		switch {
		case at.Before(from):
		case at.Before(loaded):
			before.add(stack, dlWaitStack.MatchString(stack))
		case at.Before(loaded.Add(time.Second)):
			first.add(stack, dlLibStack.MatchString(stack))
		default:
			later.add(stack, dlLibStack.MatchString(stack))
		}
	}
	return before, first, later
}

// firstFull is the time from the load to the first sample in the library
// with the full stack.
func firstFull(samples []sample, bin string, syms *symbolTable, loaded time.Time) time.Duration {
	for _, smp := range samples {
		if smp.meta.Time.After(loaded) && dlLibStack.MatchString(stackString(smp.trace, bin, syms)) {
			return smp.meta.Time.Sub(loaded)
		}
	}
	return -1
}

// TestDlopenedLibrary profiles a process that dlopen()s a library of its
// own after the profiler has read its maps, and spins in it. No BPF program
// reports the new mapping on kernels without kprobes and fexit: the
// library's first PC outside the known mappings must make the profiler read
// the maps again, at most once a second per process.
func TestDlopenedLibrary(t *testing.T) {
	requireRoot(t)
	bin, lib, syms := buildDlopen(t)
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{
		{"a second after start", time.Second},
		// The maps were read as the process started: the re-read waits
		// for the rate limit.
		{"right after start", 300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startSession(t, testHz)
			// 3 s of samples later than 1 s after the load.
			r := startDlopen(t, bin, lib, c.delay, c.delay+4*time.Second, 0)
			pid := r.cmd.Process.Pid
			times, cpu := r.wait(t)
			s.stop(t)

			loaded := times["loaded"]
			samples := s.rec.ofPID(pid)
			before, first, later := dlopenShares(samples, bin, syms, time.Time{}, loaded)
			logTopStacks(t, later.misses, 5)
			logTopStacks(t, first.misses, 3)
			t.Logf("%d samples for %.2f CPU-s; events: %s", len(samples), cpu.Seconds(), eventSummary(s.log.of(pid)))
			t.Logf("full stack: before the load %v; first second after it %v; later %v; first full library stack %v after the load",
				&before, &first, &later, firstFull(samples, bin, syms, loaded))
			// At least 1 s of samples on a busy host, for the share to
			// mean something.
			if later.samples < testHz {
				t.Errorf("%d samples later than 1 s after the load, want >= %d", later.samples, testHz)
			}
			if later.share() < 0.9 {
				t.Errorf("%.1f%% of the samples later than 1 s after the load show %s, want >= 90%%", 100*later.share(), dlLibStack)
			}
		})
	}
}

// TestMountNamespace profiles a program that runs from a tmpfs mounted in
// its own mount namespace: its path does not exist in the profiler's, so
// the file must be opened through /proc/PID/map_files or /proc/PID/root.
func TestMountNamespace(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer")
	syms := stripCopy(t, bin)
	wantID := fileID(t, bin)
	dir := filepath.Join(t.TempDir(), "ns")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	nsBin := filepath.Join(dir, "fpchain")

	s := startSession(t, testHz)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none "$1" && cp "$2" "$1/" && exec "$1/fpchain" 4`, "sh", dir, bin)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	time.Sleep(time.Second)
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	_, statErr := os.Stat(nsBin)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	s.stop(t)
	if exe != nsBin || !errors.Is(statErr, os.ErrNotExist) {
		t.Fatalf("the workload runs %q, and %s from the host: %v; want it running the binary the host cannot see",
			exe, nsBin, statErr)
	}

	full := userStack(`cf_leaf;cf_mid;cf_top;` + cRoot)
	samples := s.rec.ofPID(pid)
	warm := warmup(t, samples, nsBin, syms, full)
	var c shareCounter
	var exeFrames, badFrames int
	for _, smp := range samples[warm:] {
		stack := stackString(smp.trace, nsBin, syms)
		c.add(stack, full.MatchString(stack))
		for _, f := range smp.trace.Frames {
			if f.Kind == libpf.FrameKernel {
				continue
			}
			switch m := f.Mapping; {
			case m == nil || m.FileID.IsZero():
				badFrames++
			case m.Path == nsBin:
				exeFrames++
				if m.FileID != wantID {
					t.Fatalf("frame %#x of %s has file id %v, want %v", f.Address, nsBin, m.FileID, wantID)
				}
			}
		}
	}
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	logTopStacks(t, c.misses, 5)
	t.Logf("%.2f CPU-s: after %d samples of warm-up, full stack in %v; %d frames in %s, %d user frames without a file id",
		cpu.Seconds(), warm, &c, exeFrames, nsBin, badFrames)
	if float64(len(samples)) < 0.8*testHz*cpu.Seconds() {
		t.Errorf("%d samples for %.2f CPU-seconds at %d Hz", len(samples), cpu.Seconds(), testHz)
	}
	if c.share() < 0.95 {
		t.Errorf("%.1f%% of samples match %s, want >= 95%%", 100*c.share(), full)
	}
	if exeFrames < 3*c.full || badFrames > c.samples/20 {
		t.Errorf("%d frames attributed to %s (want >= 3 per full stack), %d user frames without a file id",
			exeFrames, nsBin, badFrames)
	}
}

func fileID(t *testing.T, path string) libpf.FileID {
	t.Helper()
	id, err := libpf.FileIDFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestHundredThousandMappings profiles a process with 100,000 mappings, of
// which about a thousand are executable, that dlopen()s a library: the
// re-read of its maps must not stall the event pump, and the manager must
// keep only its executable mappings. Measuring its state makes the manager
// forget it midway: its next sample reads all of its maps anew.
func TestHundredThousandMappings(t *testing.T) {
	requireRoot(t)
	mappings := allowMappings(t, 100_000)
	bin, lib, syms := buildDlopen(t)
	s := startSession(t, testHz)
	clock := timeHandler(t, s)
	time.Sleep(200 * time.Millisecond) // past the session's own start-up
	heapBefore := heapInUse()

	const delay = 2 * time.Second
	r := startDlopen(t, bin, lib, delay, 7500*time.Millisecond, mappings)
	pid := r.cmd.Process.Pid
	time.Sleep(delay + 2*time.Second) // well after the load
	heapAfter := heapInUse()
	prefixes, err := s.tr.PidMappingPIDs()
	if err != nil {
		t.Fatal(err)
	}
	stats := s.pm.Stats()
	state := processStateSize(t, s, pid)
	times, cpu := r.wait(t)
	// Samples taken while the kernel unmaps 100,000 mappings follow the
	// exit event (sched_process_exit fires before exit_mm); they must not
	// bring the process's state back.
	time.Sleep(1500 * time.Millisecond) // the pump polls once a second
	trackedAfterExit := s.pm.Tracks(libpf.PID(pid))
	if trackedAfterExit {
		t.Errorf("process %d tracked again after its exit", pid)
	}
	s.stop(t)

	mapped, loaded := times["mapped"], times["loaded"]
	samples := s.rec.ofPID(pid)
	before, first, later := dlopenShares(samples, bin, syms, mapped, loaded)
	logTopStacks(t, before.misses, 3)
	logTopStacks(t, later.misses, 3)
	t.Logf("%d mappings; %d samples for %.2f CPU-s; full stack after the mappings were made and before the load %v, "+
		"first second after the load %v, later %v; first full library stack %v after the load",
		mappings, len(samples), cpu.Seconds(), &before, &first, &later, firstFull(samples, bin, syms, loaded))
	t.Logf("events of the workload: %s; manager: %d maps reads (all processes), %d processes tracked; "+
		"the workload's state held 1.5 s after its exit: %v",
		eventSummary(s.log.of(pid)), stats.MapsReads, stats.ProcessesTracked, trackedAfterExit)
	own := clock.sum(func(p libpf.PID) bool { return int(p) == pid })
	t.Logf("handler, the workload's events: %s", formatCallTimes(own))
	t.Logf("handler, other processes' events: %s", formatCallTimes(clock.sum(func(p libpf.PID) bool { return int(p) != pid })))
	growth := int64(heapAfter.HeapAlloc) - int64(heapBefore.HeapAlloc)
	t.Logf("Go heap: %+.2f MiB in use (%.1f → %.1f MiB), %.1f MiB allocated meanwhile; the workload's state %.2f MiB",
		mib(growth), mib(int64(heapBefore.HeapAlloc)), mib(int64(heapAfter.HeapAlloc)),
		mib(int64(heapAfter.TotalAlloc-heapBefore.TotalAlloc)), mib(state))
	t.Logf("BPF: %d mapping trie prefixes for the workload; %d mappings with deltas (all processes)",
		prefixes[uint32(pid)], stats.DeltasResident.Mappings)

	if before.share() < 0.9 || later.share() < 0.9 {
		t.Errorf("full stacks in %.1f%% of the samples before the load and %.1f%% later than 1 s after it, want >= 90%%",
			100*before.share(), 100*later.share())
	}
	if later.samples < testHz {
		t.Errorf("%d samples later than 1 s after the load, want >= %d", later.samples, testHz)
	}
	// A read of the 100,000-line maps took 40 ms here: each call blocks
	// the pump (and every CPU's samples behind it), so allow 500 ms for
	// one and 2 s for all of the workload's.
	var total, longest time.Duration
	for _, ct := range own {
		total += ct.total
		longest = max(longest, ct.max)
	}
	if longest > 500*time.Millisecond || total > 2*time.Second {
		t.Errorf("handling the workload's events took %v, %v the longest call; want at most 2 s and 500 ms", total, longest)
	}
	// Measured: 0.10 to 0.12 MiB for the workload's state: its ~1,000
	// executable mappings at ~90 bytes each. Keeping all 100,000 would take
	// more than 8 MiB. The whole session grew by 0.7 to 1.1 MiB (samples,
	// cached traces, other processes), once by 8.6 MiB while other tests
	// ran thousands of programs on the host, whose files it reads too: so
	// the session gets 64 MiB and the workload's state 1 MiB.
	if state > 1<<20 {
		t.Errorf("the manager holds %.1f MiB for the workload, want < 1 MiB: only executable mappings should be kept", mib(state))
	}
	if growth > 64<<20 {
		t.Errorf("the Go heap grew by %.1f MiB, want < 64 MiB", mib(growth))
	}
	// The executable, the dynamic loader, libc, the library and the 16
	// mappings of the executable: one file mapping takes a few prefixes.
	// The ~1,000 anonymous executable mappings have no deltas and must not
	// be in the trie.
	if n := prefixes[uint32(pid)]; n == 0 || n > 200 {
		t.Errorf("%d mapping trie prefixes for the workload, want 1 to 200", n)
	}
}

// processStateSize is how much Go heap the manager's state of a running
// process takes: the heap in use with and without it. The process is
// stopped meanwhile, so that no sample creates its state again, and the
// event pump, which polls once a second, is given time to deliver what BPF
// queued before.
func processStateSize(t *testing.T, s *session, pid int) int64 {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	with := heapInUse()
	s.pm.ProcessExited(libpf.PID(pid))
	time.Sleep(100 * time.Millisecond) // the delta loader's worker frees its part
	without := heapInUse()
	// It did not exit: give it its state back, as an exec would.
	s.pm.ProcessExeced(libpf.PID(pid), support.FileKey{})
	return int64(with.HeapAlloc) - int64(without.HeapAlloc)
}

// allowMappings raises vm.max_map_count so a process can make n mappings
// and restores it after the test; where it cannot be raised, the test uses
// as many mappings as the limit allows.
func allowMappings(t *testing.T, n int) int {
	t.Helper()
	const path = "/proc/sys/vm/max_map_count"
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(old)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// The process's own mappings and some room besides.
	const room = 1000
	if limit >= n+room {
		return n
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(n+room)), 0o644); err != nil {
		t.Logf("cannot raise %s from %d: %v; making %d mappings", path, limit, err, limit-room)
		return limit - room
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Errorf("restoring %s: %v", path, err)
		}
	})
	return n
}

func heapInUse() runtime.MemStats {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// handlerClock times the event pump's calls into the trace handler, by
// kind of call and pid.
type handlerClock struct {
	next  tracer.Handler
	mu    sync.Mutex
	calls map[callKey]*callTimes
}

type callKey struct {
	kind string // as in eventLog
	pid  libpf.PID
}

type callTimes struct {
	calls      int
	total, max time.Duration
}

func (ct *callTimes) add(o *callTimes) {
	ct.calls += o.calls
	ct.total += o.total
	ct.max = max(ct.max, o.max)
}

// timeHandler restarts the session's event pump with a handlerClock in
// front of its handler, rather than building a second kind of session.
// Events that arrive meanwhile wait in the ring buffer.
func timeHandler(t *testing.T, s *session) *handlerClock {
	t.Helper()
	s.cancel()
	if err := <-s.done; err != nil {
		t.Fatalf("event pump: %v", err)
	}
	c := &handlerClock{next: s.log, calls: map[callKey]*callTimes{}}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- s.tr.Run(ctx, c) }()
	return c
}

func (c *handlerClock) record(kind string, pid libpf.PID, start time.Time) {
	d := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	k := callKey{kind, pid}
	ct := c.calls[k]
	if ct == nil {
		ct = &callTimes{}
		c.calls[k] = ct
	}
	ct.add(&callTimes{calls: 1, total: d, max: d})
}

// sum adds up the times of the calls for which keep is true, by kind.
func (c *handlerClock) sum(keep func(libpf.PID) bool) map[string]*callTimes {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*callTimes{}
	for k, ct := range c.calls {
		if !keep(k.pid) {
			continue
		}
		if out[k.kind] == nil {
			out[k.kind] = &callTimes{}
		}
		out[k.kind].add(ct)
	}
	return out
}

func formatCallTimes(byKind map[string]*callTimes) string {
	var parts []string
	for _, kind := range []string{"trace", "unknown-pc", "exec", "exit", "exec-mapped"} {
		if ct := byKind[kind]; ct != nil {
			parts = append(parts, fmt.Sprintf("%s: %d calls, %v in all, at most %v",
				kind, ct.calls, ct.total.Round(time.Microsecond), ct.max.Round(time.Microsecond)))
		}
	}
	return strings.Join(parts, "; ")
}

func (c *handlerClock) HandleTrace(tr *support.Trace) {
	defer c.record("trace", libpf.PID(tr.PID), time.Now())
	c.next.HandleTrace(tr)
}

func (c *handlerClock) ProcessExited(pid libpf.PID) {
	defer c.record("exit", pid, time.Now())
	c.next.ProcessExited(pid)
}

func (c *handlerClock) ProcessExeced(pid libpf.PID, program support.FileKey) {
	defer c.record("exec", pid, time.Now())
	c.next.ProcessExeced(pid, program)
}

func (c *handlerClock) UnknownPC(pid libpf.PID, pc uint64) {
	defer c.record("unknown-pc", pid, time.Now())
	c.next.UnknownPC(pid, pc)
}

func (c *handlerClock) ExecMapped(pid libpf.PID, m support.ExecMapping) {
	defer c.record("exec-mapped", pid, time.Now())
	c.next.ExecMapped(pid, m)
}

// eventSummary shortens a pid's events for the log: runs of traces show as
// their count.
func eventSummary(kinds []string) string {
	var parts []string
	traces := 0
	for _, k := range kinds {
		if k == "trace" {
			traces++
			continue
		}
		if traces > 0 {
			parts = append(parts, fmt.Sprintf("%d traces", traces))
			traces = 0
		}
		parts = append(parts, k)
	}
	if traces > 0 {
		parts = append(parts, fmt.Sprintf("%d traces", traces))
	}
	return strings.Join(parts, ", ")
}

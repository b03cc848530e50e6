package integration

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// spawnEvery starts the i-th command from cmd every interval for d and
// waits for all of them; it returns each pid's i and the CPU time the
// commands used together.
func spawnEvery(t *testing.T, interval, d time.Duration, cmd func(i int) *exec.Cmd) (map[int]int, time.Duration) {
	t.Helper()
	pids := map[int]int{}
	var cpu time.Duration
	var running []*exec.Cmd
	wait := func(c *exec.Cmd) {
		if err := c.Wait(); err != nil {
			t.Fatalf("%s: %v", c.Path, err)
		}
		cpu += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
		c := cmd(i)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		running = append(running, c)
		pids[c.Process.Pid] = i
		// Reap the oldest as we go, to keep few zombies around.
		if len(running) >= 16 {
			wait(running[0])
			running = running[1:]
		}
		<-tick.C
	}
	for _, c := range running {
		wait(c)
	}
	return pids, cpu
}

// TestShortLivedProcesses runs 50 processes a second that each spin 20 ms
// and exit: their CPU time must arrive as samples, and the samples of
// their hot function must have complete stacks. (Their start-up in the
// dynamic loader and their exit take CPU time too, more of it where page
// tables are slow to change, as in a nested VM.)
func TestShortLivedProcesses(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "shortspin", "-O2", "-fomit-frame-pointer")
	syms := stripCopy(t, bin)
	s := startSession(t, testHz)
	// One run first, as a host has seen its binaries before.
	runWorkload(t, bin, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	pids, cpu := spawnEvery(t, 20*time.Millisecond, 10*time.Second, func(int) *exec.Cmd { return exec.Command(bin, "20") })
	time.Sleep(500 * time.Millisecond)
	metrics, _ := s.tr.Metrics()
	s.stop(t)
	t.Logf("BPF: %v", metrics)

	// Complete: from whatever leaf (the kernel, the vDSO, libc) down to the
	// root of the thread.
	full := regexp.MustCompile(`^(.*;)?ss_leaf;ss_top;` + cRoot + `$`)
	var samples, hot, complete int
	misses := map[string]int{}
	for pid := range pids {
		for _, smp := range s.rec.ofPID(pid) {
			samples++
			stack := stackString(smp.trace, bin, syms)
			if !strings.Contains(stack, "ss_leaf") {
				misses[stack]++
				continue
			}
			hot++
			if full.MatchString(stack) {
				complete++
			} else {
				misses[stack]++
			}
		}
	}
	logTopStacks(t, misses, 8)
	expected := cpu.Seconds() * testHz
	t.Logf("%d processes used %.2f CPU-s: %.0f samples expected, %d arrived; %d in ss_leaf, %d (%.1f%%) of them with the full stack",
		len(pids), cpu.Seconds(), expected, samples, hot, complete, 100*float64(complete)/float64(max(hot, 1)))
	if float64(samples) < 0.9*expected {
		t.Errorf("%d samples arrived, want >= 90%% of %.0f", samples, expected)
	}
	if hot < samples/2 || float64(complete) < 0.9*float64(hot) {
		t.Errorf("%d of %d samples in ss_leaf, %d of those with the full stack; want half and >= 90%%", hot, samples, complete)
	}
}

// TestExecStorm runs 200 short processes a second for a minute, cycling
// through binaries that each have their own hot function: every sample
// must name its own process's function, and once they are gone the process
// manager and the BPF mapping trie hold nothing of them.
func TestExecStorm(t *testing.T) {
	requireRoot(t)
	const binaries = 8
	var bins []string
	for i := range binaries {
		bins = append(bins, buildWorkloadAs(t, "storm", fmt.Sprintf("storm_%d", i),
			"-O2", "-fomit-frame-pointer", fmt.Sprintf("-DHOT=storm_hot_%d", i)))
	}
	s := startSession(t, testHz)
	time.Sleep(time.Second)
	base := s.pm.Stats()
	var heapBefore runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heapBefore)

	start := time.Now()
	pids, cpu := spawnEvery(t, 4500*time.Microsecond, time.Minute, func(i int) *exec.Cmd {
		return exec.Command(bins[i%binaries], "2")
	})
	rate := float64(len(pids)) / time.Since(start).Seconds()
	time.Sleep(2 * time.Second) // exit events, then the worker's queue
	s.pm.Sweep()
	time.Sleep(time.Second)
	after := s.pm.Stats()
	trie, err := s.tr.PidMappingPIDs()
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := s.tr.Metrics()
	s.stop(t)
	var heapAfter runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&heapAfter)

	hot := regexp.MustCompile(`storm_hot_\d`)
	var samples, complete, wrong, unnamed, incomplete int
	for pid, i := range pids {
		own := fmt.Sprintf("storm_hot_%d", i%binaries)
		for _, smp := range s.rec.ofPID(pid) {
			samples++
			stack := stackString(smp.trace, "", nil)
			found := hot.FindAllString(stack, -1)
			switch {
			case len(found) == 0:
				unnamed++
			case slices.ContainsFunc(found, func(f string) bool { return f != own }):
				if wrong++; wrong <= 5 {
					t.Errorf("pid %d runs %s, sample shows %s", pid, own, stack)
				}
			case regexp.MustCompile(`(^|;)` + own + `;` + cRoot + `$`).MatchString(stack):
				complete++
			default:
				if incomplete++; incomplete <= 5 {
					t.Logf("incomplete: %s", stack)
				}
			}
			// Samples from between fork and exec name the parent's
			// executable; those in the hot function must name the child's.
			name := smp.meta.Process.ExecutableName
			if len(found) > 0 && name != fmt.Sprintf("storm_%d", i%binaries) {
				t.Errorf("pid %d runs storm_%d, sample in %s says %q", pid, i%binaries, own, name)
			}
		}
	}
	t.Logf("%d processes (%.0f/s) used %.1f CPU-s: %d samples (%.0f expected), %d with the full stack, %d outside the hot function (exec, loader), %d misattributed",
		len(pids), rate, cpu.Seconds(), samples, cpu.Seconds()*testHz, complete, unnamed, wrong)
	t.Logf("BPF: vma resolved %d, lookup errors %d, unknown pc reports %d, dropped process events %d; "+
		"execs sent %d, not sent %d; exits sent %d, not sent %d",
		metrics["vma_resolved"], metrics["err_vma_lookup"], metrics["unknown_pc_reports"], metrics["err_process_event_dropped"],
		metrics["process_execs"], metrics["execs_untracked"], metrics["process_exits"], metrics["exits_untracked"])
	t.Logf("before: %d processes, %+v; after: %d processes, %+v; maps reads %d",
		base.ProcessesTracked, base.DeltasResident, after.ProcessesTracked, after.DeltasResident, after.MapsReads-base.MapsReads)
	t.Logf("Go heap in use: %.1f MiB before, %.1f MiB after", float64(heapBefore.HeapInuse)/(1<<20), float64(heapAfter.HeapInuse)/(1<<20))

	if rate < 200 {
		t.Errorf("only %.0f processes per second", rate)
	}
	// Execs of the 8 programs once they are loaded, by processes user
	// space never read, wake nobody (tracked_pids).
	if float64(metrics["execs_untracked"]) < 0.9*float64(len(pids)) {
		t.Errorf("%d of %d execs not sent to user space, want >= 90%%", metrics["execs_untracked"], len(pids))
	}
	if inHot := samples - unnamed; float64(complete) < 0.9*float64(inHot) {
		t.Errorf("%d of %d samples in a hot function have the full stack, want >= 90%%", complete, inHot)
	}
	for pid := range pids {
		if s.pm.Tracks(libpf.PID(pid)) {
			t.Errorf("process %d still tracked after it exited", pid)
			break
		}
		if trie[uint32(pid)] != 0 {
			t.Errorf("process %d still has %d mapping trie entries", pid, trie[uint32(pid)])
			break
		}
	}
}

// startWithPID starts cmd as pid (through ns_last_pid), or fails the test
// if another process took that pid first.
func startWithPID(t *testing.T, cmd *exec.Cmd, pid int) {
	t.Helper()
	// Nothing else of ours forks in between; a system process might.
	if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
		t.Skipf("cannot choose pids here: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if cmd.Process.Pid != pid {
		cmd.Wait()
		t.Skipf("pid %d was taken (got %d)", pid, cmd.Process.Pid)
	}
}

// TestPIDReuse runs two different programs one after the other with the
// same pid: the second one's samples must show its own code, not the
// first one's mappings.
func TestPIDReuse(t *testing.T) {
	requireRoot(t)
	first := buildWorkloadAs(t, "storm", "first", "-O2", "-fomit-frame-pointer", "-DHOT=first_hot")
	second := buildWorkloadAs(t, "storm", "second", "-O2", "-fomit-frame-pointer", "-DHOT=second_hot")
	s := startSession(t, testHz)

	a := exec.Command(first, "1500")
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	pid := a.Process.Pid
	if err := a.Wait(); err != nil {
		t.Fatal(err)
	}
	b := exec.Command(second, "1500")
	startWithPID(t, b, pid)
	if err := b.Wait(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s.stop(t)

	counts := map[string]int{}
	firstStack := regexp.MustCompile(`(^|;)first_hot;` + cRoot + `$`)
	secondStack := regexp.MustCompile(`(^|;)second_hot;` + cRoot + `$`)
	for _, smp := range s.rec.ofPID(pid) {
		stack := stackString(smp.trace, "", nil)
		switch {
		case firstStack.MatchString(stack):
			counts["first"]++
		case secondStack.MatchString(stack):
			counts["second"]++
		default:
			counts["other"]++
		}
		if strings.Contains(stack, "first_hot") && smp.meta.Process.ExecutableName != "first" ||
			strings.Contains(stack, "second_hot") && smp.meta.Process.ExecutableName != "second" {
			t.Errorf("sample of %q shows %s", smp.meta.Process.ExecutableName, stack)
		}
	}
	t.Logf("pid %d: samples %v", pid, counts)
	if counts["first"] < 100 || counts["second"] < 100 {
		t.Errorf("want about 150 complete samples of each program, got %v", counts)
	}
}

// TestJITFrame runs through a stub in anonymous executable memory: it shows
// as one labelled frame and the trace goes on below it.
func TestJITFrame(t *testing.T) {
	requireRoot(t)
	if runtime.GOARCH != "amd64" {
		t.Skip("the stub is x86_64 code")
	}
	bin := buildWorkload(t, "jitstub", "-O2", "-fno-omit-frame-pointer")
	s := startSession(t, testHz)
	pid, _ := runWorkload(t, bin, 3*time.Second)
	s.stop(t)

	// Kernel frames may sit above (interrupts); the warm-up, until the
	// process manager has read the stub's mapping, is measured apart.
	want := userStack(`jit_leaf;\[anonymous executable memory\];jit_top;` + cRoot)
	samples := s.rec.ofPID(pid)
	warm := warmup(t, samples, "", nil, want)
	samples = samples[warm:]
	full := 0
	misses := map[string]int{}
	for _, smp := range samples {
		if stack := stackString(smp.trace, "", nil); want.MatchString(stack) {
			full++
		} else {
			misses[stack]++
		}
	}
	logTopStacks(t, misses, 3)
	share := float64(full) / float64(max(len(samples), 1))
	t.Logf("%d samples after %d of warm-up, %.1f%% through the JIT frame down to the root", len(samples), warm, 100*share)
	if share < 0.9 {
		t.Errorf("%.1f%% of samples show %s, want >= 90%%", 100*share, want)
	}
}

package integration

import (
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// spawnEvery starts bin with args every interval for d and waits for all
// of them; it returns their pids and the CPU time they used together.
func spawnEvery(t *testing.T, interval, d time.Duration, bin string, args ...string) (map[int]bool, time.Duration) {
	t.Helper()
	pids := map[int]bool{}
	var cpu time.Duration
	var cmds []*exec.Cmd
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		cmd := exec.Command(bin, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		pids[cmd.Process.Pid] = true
		// Reap the finished ones as we go, to keep few zombies around.
		for len(cmds) > 0 && cmds[0].ProcessState == nil {
			if len(cmds) < 8 {
				break
			}
			if err := cmds[0].Wait(); err != nil {
				t.Fatal(err)
			}
			cpu += cmds[0].ProcessState.UserTime() + cmds[0].ProcessState.SystemTime()
			cmds = cmds[1:]
		}
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return pids, cpu
}

// TestShortLivedProcesses runs 50 processes a second that each spin 20 ms
// and exit: their CPU time must arrive as samples with complete stacks.
func TestShortLivedProcesses(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "shortspin", "-O2", "-fomit-frame-pointer")
	syms := stripCopy(t, bin)
	s := startSession(t, testHz)
	// One run first, as a host has seen its binaries before.
	runWorkload(t, bin, 20*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	pids, cpu := spawnEvery(t, 20*time.Millisecond, 10*time.Second, bin, "20")
	time.Sleep(500 * time.Millisecond)
	metrics, _ := s.tr.Metrics()
	s.stop(t)
	t.Logf("BPF: %v", metrics)

	// Complete: from whatever leaf (the kernel, the vDSO, libc) down to the
	// root of the thread.
	full := regexp.MustCompile(`^(.*;)?ss_leaf;ss_top;` + cRoot + `$`)
	var samples, complete int
	misses := map[string]int{}
	for pid := range pids {
		for _, smp := range s.rec.ofPID(pid) {
			samples++
			stack := stackString(smp.trace, bin, syms)
			if full.MatchString(stack) {
				complete++
			} else {
				misses[stack]++
			}
		}
	}
	logTopStacks(t, misses, 8)
	expected := cpu.Seconds() * testHz
	t.Logf("%d processes used %.2f CPU-s: %.0f samples expected, %d arrived, %d (%.1f%%) with the full stack",
		len(pids), cpu.Seconds(), expected, samples, complete, 100*float64(complete)/expected)
	if float64(complete) < 0.9*expected {
		t.Errorf("%.1f%% of the expected samples arrived with the full stack, want >= 90%%", 100*float64(complete)/expected)
	}
}

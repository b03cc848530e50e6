package integration

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// offCPUThread is one thread of the offcpu workload: how long it said it
// waited, and the call chain (leaf first) and kernel function it waits in.
type offCPUThread struct {
	tid    int
	waited time.Duration
	chain  []string
	kernel string
}

// parseOffCPUThreads reads offcpu's "thread NAME TID WAITED_NS" lines.
func parseOffCPUThreads(t *testing.T, out []byte) map[string]*offCPUThread {
	t.Helper()
	threads := map[string]*offCPUThread{}
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) != 4 || f[0] != "thread" {
			t.Fatalf("offcpu printed %q", s.Text())
		}
		tid, err1 := strconv.Atoi(f[2])
		ns, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("offcpu printed %q", s.Text())
		}
		threads[f[1]] = &offCPUThread{tid: tid, waited: time.Duration(ns)}
	}
	return threads
}

// offCPUChains are the workload's threads' chains, leaf first, and a
// kernel function (a part of its name) each waits under.
var offCPUChains = map[string]offCPUThread{
	"sleep": {chain: []string{"cf_sleep_leaf", "cf_sleep_mid", "run_waiter"}, kernel: "nanosleep"},
	"pipe":  {chain: []string{"cf_pipe_leaf", "cf_pipe_mid", "run_waiter"}, kernel: "pipe_read"},
	"lock":  {chain: []string{"cf_lock_leaf", "cf_lock_mid", "run_waiter"}, kernel: "futex"},
}

// TestOffCPU traces every context switch of a workload whose threads wait
// in known places: each waiting thread's time off the CPU must be
// attributed to its own chain, and add up to the time it measured itself
// in its waiting call; the busy thread must barely wait.
func TestOffCPU(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "offcpu", append([]string{"-pthread"}, framePointers...)...)
	s := startTracing(t, tracer.Config{SamplesPerSecond: testHz, Runtimes: interpreter.All(),
		OffCPU: tracer.OffCPUConfig{Threshold: 1, PerSecond: 1 << 20}}, nil)
	const run = 4 * time.Second
	cmd := exec.Command(bin, formatSeconds(run))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	if m, err := s.tr.Metrics(); err == nil {
		var counts []string
		for name, v := range m {
			if strings.Contains(name, "off_cpu") {
				counts = append(counts, name+"="+strconv.FormatUint(v, 10))
			}
		}
		slices.Sort(counts)
		t.Logf("BPF counters: %s", strings.Join(counts, " "))
	}
	s.stop(t)
	threads := parseOffCPUThreads(t, out)

	type tally struct {
		waits             int
		total, withChain  time.Duration
		withKernel        time.Duration
		example, misfiled []string
	}
	byTID := map[int]*tally{}
	for _, smp := range s.rec.ofPID(cmd.Process.Pid) {
		if smp.meta.OffCPU == 0 {
			continue
		}
		tl := byTID[int(smp.meta.TID)]
		if tl == nil {
			tl = &tally{}
			byTID[int(smp.meta.TID)] = tl
		}
		tl.waits++
		tl.total += smp.meta.OffCPU
		for name, th := range threads {
			want, ok := offCPUChains[name]
			if !ok || th.tid != int(smp.meta.TID) {
				continue
			}
			names := functionNames(smp.trace)
			if hasChain(names, want.chain) {
				tl.withChain += smp.meta.OffCPU
			} else if tl.misfiled == nil {
				tl.misfiled = names
			}
			for _, f := range smp.trace.Frames {
				if f.Kind == libpf.FrameKernel && strings.Contains(f.FunctionName, want.kernel) {
					tl.withKernel += smp.meta.OffCPU
					break
				}
			}
			if tl.example == nil {
				tl.example = names
			}
		}
	}
	for _, name := range []string{"sleep", "pipe", "lock"} {
		th := threads[name]
		tl := byTID[th.tid]
		if tl == nil {
			t.Errorf("%s thread (tid %d): no off-CPU sample", name, th.tid)
			continue
		}
		chainShare := float64(tl.withChain) / float64(max(tl.total, 1))
		kernelShare := float64(tl.withKernel) / float64(max(tl.total, 1))
		ratio := float64(tl.total) / float64(max(th.waited, 1))
		t.Logf("%s thread: %d waits, %v off the CPU against %v measured by the thread (%.1f%%); %.1f%% of it under %v, %.1f%% under a kernel function with %q",
			name, tl.waits, tl.total.Round(time.Millisecond), th.waited.Round(time.Millisecond), 100*ratio,
			100*chainShare, offCPUChains[name].chain, 100*kernelShare, offCPUChains[name].kernel)
		t.Logf("  example: %v", tl.example)
		if chainShare < 0.95 {
			t.Errorf("%s thread: %.1f%% of its off-CPU time under its chain, want >= 95%% (one without: %v)",
				name, 100*chainShare, tl.misfiled)
		}
		if kernelShare < 0.95 {
			t.Errorf("%s thread: %.1f%% of its off-CPU time under a kernel function with %q, want >= 95%%",
				name, 100*kernelShare, offCPUChains[name].kernel)
		}
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s thread: off-CPU time %v, want the %v it measured ± 10%%", name, tl.total, th.waited)
		}
	}
	busy := byTID[threads["busy"].tid]
	var busyWait time.Duration
	if busy != nil {
		busyWait = busy.total
	}
	t.Logf("busy thread: %v off the CPU in %v", busyWait.Round(time.Millisecond), run)
	if busyWait > run/20 {
		t.Errorf("busy thread: %v off the CPU in %v, want under 5%%", busyWait, run)
	}
}

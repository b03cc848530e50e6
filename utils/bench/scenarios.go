package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// scenario is one row of the table: a sampling rate, what keeps the CPUs
// busy, and what runs beside while the daemon is measured.
type scenario struct {
	name string
	hz   int
	// busy processes of the shell load.
	busy int
	// spawn, when set, makes the side load: it returns the command to
	// start 50 times a second.
	spawn func(dir string) []string
}

// spawnRate is how many processes the churn scenarios start per second.
const spawnRate = 50

// busyKind is the load that keeps the CPUs busy: C without frame pointers,
// whose stacks are complete only with their deltas loaded.
const busyKind = "c"

func scenarios() []scenario {
	cpus := runtime.NumCPU()
	return []scenario{
		{name: "20 Hz, busy loops", hz: 20, busy: cpus},
		{name: "100 Hz, busy loops", hz: 100, busy: cpus},
		{name: "20 Hz + 50/s /bin/true", hz: 20, busy: cpus, spawn: func(string) []string { return []string{"/bin/true"} }},
		{name: "20 Hz + 50/s spinning 20 ms", hz: 20, busy: cpus, spawn: func(dir string) []string {
			return []string{buildSpinner(dir), "20"}
		}},
		{name: "idle host, 20 Hz", hz: 20},
	}
}

// runScenarios measures every scenario runs times for d each and prints
// the medians as one table.
func runScenarios(bin string, d time.Duration, runs int, only string) {
	fmt.Printf("%d CPUs; medians of %d runs of %v per scenario, measured from %v after the first export\n\n",
		runtime.NumCPU(), runs, d, warmup)
	fmt.Printf("%-30s %10s %10s %8s %9s %10s %8s %10s %9s\n",
		"scenario", "CPU s/min", "BPF s/min", "RSS MiB", "peak MiB", "delivered", "capture", "1st export", "accurate")
	dir, err := os.MkdirTemp("", "bench-scenarios")
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	for _, sc := range scenarios() {
		if !strings.Contains(sc.name, only) {
			continue
		}
		stopBusy, busy := busyProcesses(busyKind, sc.busy)
		var all []result
		for range runs {
			var side *spawner
			if sc.spawn != nil {
				side = &spawner{argv: sc.spawn(dir), rate: spawnRate}
			}
			all = append(all, measureWith(bin, sc.hz, d, side, busy))
		}
		stopBusy()
		m := medians(all)
		delivered, capture, accurate := "-", "-", "-"
		if sc.busy > 0 {
			delivered = fmt.Sprintf("%.2f%%", 100*m.delivered)
		}
		if m.capture >= 0 {
			capture = fmt.Sprintf("%.3f", m.capture)
		}
		if m.accurate >= 0 {
			accurate = fmt.Sprintf("%.0fs", m.accurate.Seconds())
		}
		fmt.Printf("%-30s %10.3f %10.3f %8.1f %9.1f %10s %8s %9.2fs %9s\n",
			sc.name, m.cpuPerMin, m.bpfPerMin, m.rssMiB, m.peakMiB, delivered, capture, m.firstExport.Seconds(), accurate)
	}
	fmt.Println("\nCPU: the daemon's user+system time; BPF: its programs' run time (kernel.bpf_stats_enabled).")
	fmt.Println("RSS: at the end of the run; peak: VmHWM over the whole run, start-up included.")
	fmt.Println("delivered: traces user space received / (CPUs × Hz × seconds sampled).")
	fmt.Println("capture: samples of the spawned processes in the daemon's profiles / (their CPU seconds × Hz).")
	fmt.Println("1st export: wall time from exec until the Collector wrote the first profile.")
	fmt.Println("accurate: seconds from exec from which >= 90% of the busy processes' samples have complete stacks " +
		"(outermost frame where a thread starts).")
	fmt.Printf("Busy processes: %s (utils/workloads/fpchain.c, -O2: unwound with stack deltas). "+
		"The daemon exports to a local OpenTelemetry Collector (utils/collector).\n", busyKind)
}

// spawner starts a command rate times a second (each in its own
// goroutine, so that a slow one delays no other) and adds up its
// children's CPU time.
type spawner struct {
	argv []string
	rate int

	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	cpu  time.Duration
}

// sideResult is what a spawner ran: its processes' CPU time, and the
// name their samples carry (empty: capture not measured).
type sideResult struct {
	process string
	cpu     time.Duration
}

func (s *spawner) start() {
	s.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(s.rate))
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.run()
			}()
		}
	}()
}

func (s *spawner) run() {
	c := exec.Command(s.argv[0], s.argv[1:]...)
	if err := c.Run(); err != nil {
		fatalf("%s: %v", strings.Join(s.argv, " "), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage); ok {
		s.cpu += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
}

func (s *spawner) stop() sideResult {
	close(s.done)
	s.wg.Wait()
	r := sideResult{cpu: s.cpu}
	if s.argv[0] != "/bin/true" {
		r.process = filepath.Base(s.argv[0])
	}
	return r
}

// buildSpinner compiles utils/workloads/storm.c, which spins for the
// milliseconds of CPU it is given, into dir.
func buildSpinner(dir string) string {
	bin := filepath.Join(dir, "bench_spin")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	out, err := exec.Command("gcc", "-O2", "-o", bin, "utils/workloads/storm.c").CombinedOutput()
	if err != nil {
		fatalf("building the spinner (run from the repository root): %v\n%s", err, out)
	}
	return bin
}

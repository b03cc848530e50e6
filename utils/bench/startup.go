package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The start-up scenario of issue 21: the daemon starts on a host whose
// processes are already busy, and the question is how soon their stacks
// are complete. Complete means the outermost frame is where a thread
// begins: anything else was cut short (deltas not loaded yet, a frame the
// unwinder could not pass).

// startupMix is the busy host: several languages, some with large
// libraries (libjvm, the node binary).
var startupMix = []struct {
	kind string
	n    int
}{{"c", 4}, {"go", 2}, {"python", 4}, {"java", 4}, {"node", 4}}

// startupSeconds is how long after the daemon's exec the curve goes.
const startupSeconds = 25

// runStartup starts the busy host, then the daemon runs times, and prints
// per second since the daemon's exec the share of the host's samples
// whose stacks are complete (median over the runs), with what was dropped.
func runStartup(bin string, hz, runs int) {
	var pids []int
	var stops []func()
	for _, l := range startupMix {
		stop, ps := busyProcesses(l.kind, l.n)
		stops = append(stops, stop)
		pids = append(pids, ps...)
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	fmt.Printf("%d busy processes (%s), %d Hz, the daemon started %d times (first with an empty stack delta cache)\n",
		len(pids), mixString(), hz, runs)
	time.Sleep(5 * time.Second) // JVMs and Node compile their hot code

	// The daemons share a stack delta cache: the first starts cold, the
	// others find what it extracted, as a restart does.
	cache, err := os.MkdirTemp("", "bench-delta-cache")
	check(err)
	atExit(func() { os.RemoveAll(cache) })
	var curves [][]float64
	var firsts, accurate, lost, evLost, mapDrops []float64
	for i := range runs {
		r := startupRun(bin, hz, pids, filepath.Join(cache, "deltas"))
		if i == 0 {
			fmt.Printf("run with an empty delta cache: first export %.2fs, 90%% complete from %.0fs, curve %s; incomplete roots: %s; resident set: %v\n",
				r.firstExport.Seconds(), r.accurateAt.Seconds(), curveString(r.curve), r.roots, r.mem)
			if runs > 1 {
				continue // the medians are of restarts
			}
		}
		curves = append(curves, r.curve)
		firsts = append(firsts, r.firstExport.Seconds())
		accurate = append(accurate, r.accurateAt.Seconds())
		lost = append(lost, r.tracesLost)
		evLost = append(evLost, r.eventsLost)
		mapDrops = append(mapDrops, r.mappingsDropped)
		fmt.Printf("restart: first export %.2fs, 90%% complete from %.0fs, traces lost %.0f, process events lost %.0f, "+
			"mapping updates dropped %.0f; incomplete roots: %s; resident set: %v\n",
			r.firstExport.Seconds(), r.accurateAt.Seconds(), r.tracesLost, r.eventsLost, r.mappingsDropped, r.roots, r.mem)
	}
	fmt.Printf("\nmedians of the restarts: first export %.2fs, stacks >= 90%% complete from second %.0f on, traces lost %.0f, "+
		"process events lost %.0f, mapping updates dropped %.0f\n",
		median(firsts), median(accurate), median(lost), median(evLost), median(mapDrops))
	fmt.Printf("\n%8s %10s\n", "second", "complete")
	for s := range startupSeconds {
		var v []float64
		for _, c := range curves {
			if c[s] >= 0 {
				v = append(v, c[s])
			}
		}
		if len(v) == 0 {
			fmt.Printf("%8d %10s\n", s, "-")
			continue
		}
		fmt.Printf("%8d %9.1f%%\n", s, 100*median(v))
	}
	fmt.Println("\ncomplete: samples of the busy processes whose outermost frame is a thread's start " +
		"(" + strings.Join(threadRoots, ", ") + "), per second since the daemon's exec (by the samples' timestamps).")
}

// rssWatch follows a daemon's resident set, split the way the kernel
// counts it: anonymous (Go's heap and stacks), file-backed (its code and
// the files it maps) and shared memory.
type rssWatch struct {
	peak, end rssSplit
	peakAt    time.Duration
}

type rssSplit struct{ total, anon, file, shmem float64 }

func (s rssSplit) String() string {
	return fmt.Sprintf("%.0f MiB (anon %.0f, file %.0f, shmem %.0f)", s.total, s.anon, s.file, s.shmem)
}

// watch reads pid's resident set every 10 ms from now until the returned
// function is called, which records the last reading as the end.
func (w *rssWatch) watch(pid int, start time.Time) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			s, ok := readRSS(pid)
			if ok {
				w.end = s
				if s.total > w.peak.total {
					w.peak, w.peakAt = s, time.Since(start)
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (w rssWatch) String() string {
	return fmt.Sprintf("peak %v at %.1fs, at the end %v, peak/end %.2f",
		w.peak, w.peakAt.Seconds(), w.end, w.peak.total/max(w.end.total, 1))
}

// readRSS reads pid's resident set in MiB from /proc/PID/status.
func readRSS(pid int) (rssSplit, bool) {
	st, err := statusMiB(pid)
	if err != nil {
		return rssSplit{}, false
	}
	s := rssSplit{total: st["VmRSS"], anon: st["RssAnon"], file: st["RssFile"], shmem: st["RssShmem"]}
	return s, s.total > 0
}

func mixString() string {
	var parts []string
	for _, l := range startupMix {
		parts = append(parts, fmt.Sprintf("%d %s", l.n, l.kind))
	}
	return strings.Join(parts, ", ")
}

func median[T int | float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

type startupResult struct {
	// curve is the complete share per second since exec, -1 where the
	// second has no sample.
	curve                                   []float64
	firstExport, accurateAt                 time.Duration
	tracesLost, eventsLost, mappingsDropped float64
	// mem is the daemon's resident set: its peak and at the end.
	mem rssWatch
	// roots of the incomplete stacks, most frequent first.
	roots string
}

// curveString is a curve as "s:share" pairs from the first second with
// samples.
func curveString(c []float64) string {
	var parts []string
	for s, v := range c {
		if v >= 0 {
			parts = append(parts, fmt.Sprintf("%d:%.0f%%", s, 100*v))
		}
	}
	return strings.Join(parts, " ")
}

func startupRun(bin string, hz int, pids []int, cache string) startupResult {
	dir, err := os.MkdirTemp("", "bench-startup")
	check(err)
	defer os.RemoveAll(dir)
	sk := startSink()
	start := time.Now()
	cmd, readLog := startDaemon(bin, dir, append(sk.args(), "-samples-per-second", strconv.Itoa(hz),
		"-reporter-interval", "1s", "-delta-cache", cache)...)
	var r startupResult
	stopWatch := r.mem.watch(cmd.Process.Pid, start)
	for r.firstExport == 0 && time.Since(start) < time.Minute {
		if sk.exported() {
			r.firstExport = time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Until(start.Add(startupSeconds * time.Second)))
	stopWatch()
	check(cmd.Process.Signal(syscall.SIGTERM))
	err = cmd.Wait()
	log := readLog()
	if err != nil {
		fatalf("daemon: %v\n%s", err, strings.Join(log, "\n"))
	}
	// Lost in BPF (ring buffer full) or in the daemon (event queue full).
	r.tracesLost = field(log, "bpf_traces_lost") + field(log, "queue_traces_lost")
	r.eventsLost = field(log, "bpf_process_events_lost") + field(log, "queue_process_events_lost")
	r.mappingsDropped = field(log, "delta_mappings_dropped")

	samples := sk.samples()
	r.curve = accuracyCurve(samples, pids, start, startupSeconds)
	r.accurateAt = accurateFrom(r.curve)
	roots := map[string]int64{}
	for _, smp := range samples {
		if slices.Contains(pids, int(smp.pid)) && !smp.complete() && smp.at.Sub(start) < startupSeconds*time.Second {
			roots[smp.root]++
		}
	}
	type rc struct {
		name string
		n    int64
	}
	var rs []rc
	for k, v := range roots {
		rs = append(rs, rc{k, v})
	}
	slices.SortFunc(rs, func(a, b rc) int { return int(b.n - a.n) })
	var parts []string
	for i, x := range rs {
		if i == 6 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s=%d", cmp.Or(x.name, "?"), x.n))
	}
	r.roots = strings.Join(parts, " ")
	return r
}

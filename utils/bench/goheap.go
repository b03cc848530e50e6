package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The Go heap benchmark (-goheap N) measures what reading Go programs'
// heap profiles costs the daemon: N copies of goheap's test program, each
// with some 2,360 allocation sites up to 25 frames deep (a service's
// profile), idle on the host, under the daemon exporting to the Collector
// and writing pprof files, once reading their heap profiles every 20 s and
// once not (-go-heap-interval=0). Memory and CPU are read every second.

// goHeapRounds is how many heap reads the measured run covers.
const goHeapRounds = 5

var goHeapMsRe = regexp.MustCompile(`go_heap="reads=(\d+) sites=(\d+) .*? ms=(\d+) `)

func runGoHeapBench(bin string, n int) {
	dir, err := os.MkdirTemp("", "bench-goheap")
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	prog := filepath.Join(dir, "heapprog")
	build := exec.Command("go", "build", "-o", prog, ".")
	build.Dir = filepath.Join("processmanager", "goheap", "testdata", "heapprog")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fatalf("building heapprog (run from the repository root): %v\n%s", err, out)
	}
	var stops []func()
	for range n {
		cmd := exec.Command(prog, "mid")
		stdin, err := cmd.StdinPipe()
		check(err)
		out, err := cmd.StdoutPipe()
		check(err)
		check(cmd.Start())
		stop := func() { stdin.Close(); cmd.Wait() }
		atExit(stop)
		stops = append(stops, stop)
		for sc := bufio.NewScanner(out); sc.Scan() && sc.Text() != "ready"; {
		}
	}
	fmt.Printf("goheap: %d Go programs of some 2,360 allocation sites each, idle\n", n)
	for _, interval := range []string{"0", "20s"} {
		goHeapRun(bin, dir, interval)
	}
	for _, stop := range stops {
		stop()
	}
}

// goHeapRun runs the daemon for goHeapRounds heap intervals of 20 s and
// prints its memory and CPU, and what the status lines say of the reads.
func goHeapRun(bin, dir, interval string) {
	sk := startSink()
	out := filepath.Join(dir, "out-"+interval)
	cmd, readLog := startDaemon(bin, dir, append(sk.args(), "-go-heap-interval", interval, "-monitor-interval", "10s",
		"-output-dir", out, "-spool-dir", filepath.Join(dir, "spool-"+interval))...)
	pid := cmd.Process.Pid
	var rss []float64
	start := time.Now()
	for time.Since(start) < goHeapRounds*20*time.Second+5*time.Second {
		time.Sleep(time.Second)
		r, _ := memory(pid)
		rss = append(rss, r)
	}
	cpu := cpuTime(pid)
	_, peak := memory(pid)
	check(cmd.Process.Signal(os.Interrupt))
	cmd.Wait()
	sk.c.Stop()
	var reads, sites, ms int
	for _, l := range readLog() {
		if m := goHeapMsRe.FindStringSubmatch(l); m != nil {
			r, _ := strconv.Atoi(m[1])
			s, _ := strconv.Atoi(m[2])
			t, _ := strconv.Atoi(m[3])
			reads, sites, ms = reads+r, sites+s, ms+t
		}
	}
	sorted := slices.Sorted(slices.Values(rss))
	fmt.Printf("goheap: -go-heap-interval=%s: RSS median %.1f MiB, 90th percentile %.1f, peak %.1f; CPU %.1f s over %v",
		interval, median(rss), sorted[len(sorted)*9/10], peak, cpu.Seconds(), time.Since(start).Round(time.Second))
	if reads > 0 {
		fmt.Printf("; %d reads of %d sites in %d ms (%.1f ms a read, %.1f µs a site)", reads, sites, ms,
			float64(ms)/float64(reads), 1000*float64(ms)/float64(sites))
	}
	fmt.Println()
	if lines := strings.Join(lastN(readLog(), 3), "\n"); strings.Contains(lines, "level=error") {
		fmt.Println(lines)
	}
}

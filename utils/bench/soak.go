package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// The soak (-soak DURATION, make soak) runs the daemon as a long-lived
// host would: a mix of runtimes that changes every few minutes, processes
// starting and exiting all the time, the collector down for a while in the
// middle, and the web view asked for a flame graph every second. It
// records the daemon's memory and goroutines every 10 s and checks that
// they stay flat once the first 10 minutes are past, and that every sample
// the daemon reported reached the collector or was counted as lost.

// soakLoads rotate, two at a time, through the soak.
var soakLoads = []string{"c", "python", "java", "go", "node", "golabels", "ruby", "php", "perl", "luajit", "beam"}

// soakPoint is one reading of the daemon.
type soakPoint struct {
	at     time.Duration
	rssMiB float64
	// anonMiB and fileMiB split the RSS: the daemon's own memory, and
	// the pages of files it maps (executables read for symbols), which
	// the kernel can drop. goHeapMiB is the Go heap's allocated objects,
	// garbage not yet collected included (HeapAlloc; -1: not read).
	anonMiB, fileMiB, goHeapMiB float64
	goroutines                  int
	cpu                         time.Duration
	spoolMiB                    float64
}

// soakSettle is when memory and goroutines must have settled.
const soakSettle = 10 * time.Minute

func runSoak(bin string, d time.Duration, outDir string) {
	// Every load has run by the time memory must have settled (six
	// phases of two of the eleven), and the web view's history is at its
	// age bound: what the daemon keeps of a load it has seen once (its
	// files' symbols, debug information, stacks) must not grow after.
	phase := min(soakSettle/6, d/6)
	outageAt, outage := 2*d/5, min(10*time.Minute, d/6)
	dir, err := os.MkdirTemp("", "bench-soak")
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	sk := startSink()
	outputs := []string{sk.c.OutPath}
	httpAddr, pprofAddr := freeLoopback(), freeLoopback()
	cmd, readLog := startDaemon(bin, dir, append(sk.args(), "-samples-per-second", "20", "-reporter-interval", "5s",
		"-http", httpAddr, "-http-history", soakSettle.String(), "-pprof", pprofAddr, "-spool-dir", filepath.Join(dir, "spool"),
		"-off-cpu-threshold", "0.01", "-monitor-interval", "10s")...)
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("soak: %v, loads rotating every %v, collector down at %v for %v, web view polled every second\n",
		d, phase, outageAt, outage)

	churn := &spawner{argv: []string{"/bin/true"}, rate: 20}
	churn.start()
	stopPoll := pollWebView(httpAddr)

	start := time.Now()
	var points []soakPoint
	var stopLoads func()
	nextPhase, phaseN := time.Duration(0), 0
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	down, back := false, false
	nextHeap := soakSettle
	// The outage's span in wall time, and how long after its end the
	// daemon's status line first showed an empty spool.
	var outageStart, outageEnd time.Time
	drainedAfter := time.Duration(-1)
	for elapsed := time.Duration(0); elapsed < d; elapsed = time.Since(start) {
		if elapsed >= nextPhase {
			if stopLoads != nil {
				stopLoads()
			}
			a, b := soakLoads[(2*phaseN)%len(soakLoads)], soakLoads[(2*phaseN+1)%len(soakLoads)]
			stopA, _ := busyProcesses(a, 1)
			stopB, _ := busyProcesses(b, 1)
			stopLoads = func() { stopA(); stopB() }
			fmt.Printf("soak: %v: loads %s and %s\n", elapsed.Round(time.Second), a, b)
			nextPhase += phase
			phaseN++
		}
		if !down && elapsed >= outageAt {
			check(sk.c.Stop())
			down, outageStart = true, time.Now()
			fmt.Printf("soak: %v: collector stopped\n", elapsed.Round(time.Second))
		}
		if down && !back && elapsed >= outageAt+outage {
			check(sk.c.Restart())
			outputs = append(outputs, sk.c.OutPath)
			back, outageEnd = true, time.Now()
			fmt.Printf("soak: %v: collector started again\n", elapsed.Round(time.Second))
		}
		select {
		case err := <-exited:
			fatalf("daemon exited: %v\n%s", err, strings.Join(lastN(readLog(), 40), "\n"))
		case <-tick.C:
		}
		if back && drainedAfter < 0 && lastSpoolHeld(readLog()) == 0 {
			drainedAfter = time.Since(outageEnd)
		}
		if elapsed >= nextHeap && outDir != "" {
			// The daemon's own heap from when it settled, every ten
			// minutes: what grew, should memory grow.
			saveHeapProfile(pprofAddr, filepath.Join(outDir, fmt.Sprintf("heap-%dm.pb.gz", int(nextHeap.Minutes()))))
			nextHeap += soakSettle
		}
		st, _ := statusMiB(pid)
		// The heap profile costs the daemon a few milliseconds to write:
		// read once a minute, so that its CPU stays the daemon's own.
		heap := -1.0
		if len(points)%6 == 5 {
			heap = goHeapMiB(pprofAddr)
		}
		points = append(points, soakPoint{at: time.Since(start), rssMiB: st["VmRSS"], anonMiB: st["RssAnon"], fileMiB: st["RssFile"],
			goHeapMiB: heap, goroutines: goroutines(pprofAddr),
			cpu: cpuTime(pid), spoolMiB: float64(dirBytes(filepath.Join(dir, "spool"))) / (1 << 20)})
	}
	stopLoads()
	churn.stop()
	stopPoll()
	if down && !back {
		check(sk.c.Restart())
		outputs = append(outputs, sk.c.OutPath)
	}
	// Let the spool drain (1 MiB/s), then stop.
	if outDir != "" {
		saveHeapProfile(pprofAddr, filepath.Join(outDir, "heap-end.pb.gz"))
	}
	drainStart := time.Now()
	for time.Since(drainStart) < 5*time.Minute && lastSpoolHeld(readLog()) != 0 {
		time.Sleep(5 * time.Second)
	}
	drained := time.Since(drainStart)
	check(cmd.Process.Signal(syscall.SIGTERM))
	if err := <-exited; err != nil {
		fatalf("daemon: %v", err)
	}
	check(sk.c.Stop())
	var received, inOutage int64
	for _, out := range outputs {
		pds, err := collector.ReadOutput(out, false)
		check(err)
		for _, pd := range pds {
			for _, rp := range pd.GetResourceProfiles() {
				for _, sp := range rp.GetScopeProfiles() {
					for _, p := range sp.GetProfiles() {
						// One timestamp per sample, CPU or off-CPU (whose
						// values are nanoseconds).
						for _, s := range p.GetSamples() {
							for _, ts := range s.GetTimestampsUnixNano() {
								received++
								if t := time.Unix(0, int64(ts)); !outageStart.IsZero() && !t.Before(outageStart) && t.Before(outageEnd) {
									inOutage++
								}
							}
						}
					}
				}
			}
		}
	}
	sum := summaryFields(readLog())
	if down {
		drainedMsg := "not before the end of the run"
		if drainedAfter >= 0 {
			drainedMsg = drainedAfter.Round(time.Second).String() + " after its return (status line every 10 s)"
		}
		fmt.Printf("soak: %d samples taken while the collector was down reached it once it was back; the spool was empty again %s\n",
			inOutage, drainedMsg)
	}
	ok := reportSoak(points, sum, received, drained, outage, outDir)
	if !ok {
		fatalf("soak failed")
	}
}

// reportSoak prints the soak's figures, writes its readings (CSV) and plot
// (SVG) into outDir, and says whether it passed. Flat means the median of
// the last ten minutes is within 10% of the median of the ten after
// settling (a reading's RSS swings with the garbage collector).
func reportSoak(points []soakPoint, sum map[string]int64, received int64, drained, outage time.Duration, outDir string) bool {
	ok := true
	var peakSpool float64
	for _, p := range points {
		peakSpool = max(peakSpool, p.spoolMiB)
	}
	end := points[len(points)-1].at
	window := func(from, to time.Duration) (rss []float64, g []int) {
		for _, p := range points {
			if p.at >= from && p.at < to {
				rss, g = append(rss, p.rssMiB), append(g, p.goroutines)
			}
		}
		return rss, g
	}
	if end < soakSettle+20*time.Minute {
		fmt.Printf("soak: shorter than %v; no flatness check\n", soakSettle+20*time.Minute)
	} else {
		rssA, gA := window(soakSettle, soakSettle+10*time.Minute)
		rssB, gB := window(end-10*time.Minute, end+time.Second)
		ra, rb, ga, gb := median(rssA), median(rssB), median(gA), median(gB)
		fmt.Printf("soak: median RSS %.1f MiB in minutes 10-20, %.1f MiB in the last ten (%+.1f%%, peak %.1f); median goroutines %d, then %d (%+.1f%%)\n",
			ra, rb, 100*(rb/ra-1), slices.Max(rssB), ga, gb, 100*(float64(gb)/float64(ga)-1))
		if rb > 1.1*ra || float64(gb) > 1.1*float64(ga) {
			fmt.Println("soak: FAIL: memory or goroutines grew by more than 10% after settling")
			ok = false
		}
	}
	if outage > 0 {
		fmt.Printf("soak: the spool held at most %.2f MiB after a %v outage: %.3f MiB a minute, so the default 256 MiB holds %.0f hours of this host\n",
			peakSpool, outage, peakSpool/outage.Minutes(), 256/(peakSpool/outage.Minutes())/60)
	}
	last := points[len(points)-1]
	fmt.Printf("soak: daemon CPU %.1f s over %v (%.2f s/min)\n", last.cpu.Seconds(), last.at.Round(time.Second),
		last.cpu.Seconds()/last.at.Minutes())
	lost := sum["samples_lost_in_spool"]
	fmt.Printf("soak: samples reported %d, exported %d, received by the collector %d, lost in the spool (counted) %d; requests spooled %d, replayed %d, dropped %d; waited %v after the end for the spool to drain\n",
		sum["samples_reported"], sum["samples_exported"], received, lost, sum["requests_spooled"], sum["requests_replayed"],
		sum["requests_dropped"], drained.Round(time.Second))
	if received+lost != sum["samples_reported"] {
		fmt.Println("soak: FAIL: samples reported != received + counted losses")
		ok = false
	}
	if outDir != "" {
		check(os.MkdirAll(outDir, 0o755))
		var csv strings.Builder
		csv.WriteString("seconds,rss_mib,rss_anon_mib,rss_file_mib,go_heap_mib,goroutines,cpu_s,spool_mib\n")
		for _, p := range points {
			fmt.Fprintf(&csv, "%.0f,%.1f,%.1f,%.1f,%.1f,%d,%.2f,%.1f\n", p.at.Seconds(), p.rssMiB, p.anonMiB, p.fileMiB, p.goHeapMiB,
				p.goroutines, p.cpu.Seconds(), p.spoolMiB)
		}
		check(os.WriteFile(filepath.Join(outDir, "soak.csv"), []byte(csv.String()), 0o644))
		check(os.WriteFile(filepath.Join(outDir, "soak.svg"), []byte(soakSVG(points)), 0o644))
		fmt.Printf("soak: readings in %s\n", filepath.Join(outDir, "soak.csv"))
	}
	return ok
}

// soakSVG plots RSS and goroutines over the soak.
func soakSVG(points []soakPoint) string {
	const w, h, pad = 800, 300, 50
	end := points[len(points)-1].at.Seconds()
	var maxRSS float64
	var maxG int
	for _, p := range points {
		maxRSS, maxG = max(maxRSS, p.rssMiB), max(maxG, p.goroutines)
	}
	maxRSS, maxG = maxRSS*1.2, maxG+maxG/5+1
	x := func(s float64) float64 { return pad + (w-2*pad)*s/end }
	line := func(y func(soakPoint) float64, color string) string {
		var b strings.Builder
		for i, p := range points {
			cmd := "L"
			if i == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&b, "%s%.1f,%.1f ", cmd, x(p.at.Seconds()), h-pad-(h-2*pad)*y(p))
		}
		return fmt.Sprintf(`<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`, b.String(), color)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`, w, h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`, pad, h-pad, w-pad, h-pad)
	for m := 0.0; m <= end/60; m += 10 {
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%.0f min</text>`, x(m*60), h-pad+16, m)
	}
	b.WriteString(line(func(p soakPoint) float64 { return p.rssMiB / maxRSS }, "steelblue"))
	b.WriteString(line(func(p soakPoint) float64 { return float64(p.goroutines) / float64(maxG) }, "darkorange"))
	fmt.Fprintf(&b, `<text x="%d" y="20" fill="steelblue">RSS (MiB, top %.0f)</text>`, pad, maxRSS)
	fmt.Fprintf(&b, `<text x="%d" y="20" fill="darkorange">goroutines (top %d)</text>`, w/2, maxG)
	b.WriteString(`</svg>`)
	return b.String()
}

// pollWebView asks the web view for a flame graph every second until the
// returned function is called.
func pollWebView(addr string) func() {
	done := make(chan struct{})
	go func() {
		client := &http.Client{Timeout: 10 * time.Second}
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			for _, path := range []string{"/api/flame", "/api/summary"} {
				if resp, err := client.Get("http://" + addr + path); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}
	}()
	return func() { close(done) }
}

// saveHeapProfile writes the daemon's heap profile (its -pprof address)
// to path; a failure is printed, not fatal.
func saveHeapProfile(addr, path string) {
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap")
	if err == nil {
		defer resp.Body.Close()
		var b []byte
		if b, err = io.ReadAll(resp.Body); err == nil {
			if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
				err = os.WriteFile(path, b, 0o644)
			}
		}
	}
	if err != nil {
		fmt.Printf("soak: saving the daemon's heap profile: %v\n", err)
	}
}

// goroutines reads the daemon's goroutine count from its -pprof endpoint.
func goroutines(addr string) int {
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total")))
	return n
}

// goHeapMiB reads the daemon's allocated Go heap (HeapAlloc: live objects
// and garbage not yet collected) from its -pprof endpoint; -1 when it
// cannot.
func goHeapMiB(addr string) float64 {
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n / (1 << 20)
		}
	}
	return -1
}

var spoolHeld = regexp.MustCompile(`held=(\d+) \(([\d.]+) MiB\)`)

// lastSpoolHeld is how many requests the last status line said the spool
// holds (0 before it was used).
func lastSpoolHeld(log []string) int {
	m := lastMatch(log, spoolHeld)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func lastMatch(log []string, re *regexp.Regexp) []string {
	for _, l := range slices.Backward(log) {
		if m := re.FindStringSubmatch(l); m != nil {
			return m
		}
	}
	return nil
}

// summaryFields are the integer fields of the daemon's "Stopped" line.
func summaryFields(log []string) map[string]int64 {
	out := map[string]int64{}
	for _, l := range log {
		if !strings.Contains(l, "msg=Stopped") {
			continue
		}
		for _, m := range regexp.MustCompile(`(\w+)=(\d+)(\s|$)`).FindAllStringSubmatch(l, -1) {
			out[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
		}
	}
	return out
}

func lastN(lines []string, n int) []string { return lines[max(0, len(lines)-n):] }

// freeLoopback is a loopback address nothing listens on (for now).
func freeLoopback() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	defer l.Close()
	return l.Addr().String()
}

// dirBytes is the size of the files in dir.
func dirBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

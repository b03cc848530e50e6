// Command bench measures the daemon's overhead the way a user would see it:
// it starts the built ebpf-profiler with both cores kept busy, at several
// sampling rates, and prints CPU time per minute (user+system, and the BPF
// programs' own run time, run_time_ns with kernel.bpf_stats_enabled=1), RSS,
// BPF map memory, the share of expected samples that reached user space,
// and start-up time and CPU until the first export. The daemon exports to
// a local OpenTelemetry Collector (utils/collector, built on first use), and
// what the Collector received gives the short-lived capture and how soon
// stacks are complete.
//
// Without -rates it runs the scenarios of scenarios.go (busy loops at 20
// and 100 Hz, exec churn, short-lived processes, an idle host) and prints
// one table; with -rates, the given rates under one -load.
//
// Usage (root): go run ./utils/bench -bin ./ebpf-profiler [-duration 60s] [-runs 3]
// [-rates 20,100,1000 [-load shell|c|python|java|node|ruby|php|perl|apm|apm-off] [-procs N]]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
	"github.com/hostprof/ebpf-profiler/utils/luajitfetch"
	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

func main() {
	bin := flag.String("bin", "./ebpf-profiler", "daemon binary")
	duration := flag.Duration("duration", time.Minute, "profiling time per rate")
	rates := flag.String("rates", "", "sampling rates to measure under -load (default: the scenario table)")
	runs := flag.Int("runs", 3, "runs per rate; the table shows each figure's median")
	load := flag.String("load", "shell", "what keeps the CPUs busy: shell loops, c (utils/workloads/fpchain.c, -O2), "+
		"python (utils/workloads/python/pyworkload.py chain under python3), golabels (utils/workloads/golabels: "+
		"goroutines under pprof labels), manymaps (utils/workloads/manymaps.c: "+
		"30,000 file mappings, 15,000 executable), pingpong (utils/workloads/pingpong.c: two threads "+
		"ping-ponging on pipes, a context-switch storm), java (utils/workloads/java "+
		"JWorkload chain under JDK 17), node (utils/workloads/node/v8work.js chain under Node 20), "+
		"ruby (utils/workloads/ruby/rbworkload.rb chain under Debian 12's Ruby 3.1), "+
		"php (utils/workloads/php/phpworkload.php chain under Debian 12's PHP 8.2), "+
		"perl (utils/workloads/perl/plworkload.pl chain under Debian 12's perl 5.36), "+
		"beam (utils/workloads/erlang/ewl.erl chain under Debian's Erlang/OTP 29), luajit (utils/workloads/luajit/ljworkload.lua chain "+
		"under Debian sid's luajit); a runtime's version after a colon: "+
		"python:3.15, python:tailcall, java:26, node:26, ruby:3.4, php:8.4, perl:5.42, beam:27), apm (utils/testagent's app: "+
		"two threads per process, 80% of the time in APM transactions) or apm-off (the same with the agent "+
		"library renamed, so that it is not correlated)")
	procs := flag.Int("procs", runtime.NumCPU(), "busy processes")
	extra := flag.String("daemon-args", "", "more flags for the daemon, space-separated (e.g. -http=127.0.0.1:8231)")
	only := flag.String("scenarios", "", "run only the scenarios whose name contains this")
	startup := flag.Int("startup", 0, "instead: start the daemon at this rate on a host of 18 busy processes "+
		"(C, Go, Python, Java, Node) and print how soon their stacks are complete")
	soak := flag.Duration("soak", 0, "instead: run the daemon this long under a rotating mix of runtimes, process churn, "+
		"a collector outage and web view polling, and check that its memory and goroutines stay flat (make soak)")
	soakOut := flag.String("soak-out", "", "with -soak: where its readings (soak.csv) and plot (soak.svg) go")
	goHeap := flag.Int("goheap", 0, "instead: measure the daemon's memory and CPU with this many idle Go programs "+
		"of 2,360 allocation sites each, reading their heap profiles every 20 s and not")
	flag.Parse()
	extraDaemonArgs = strings.Fields(*extra)
	if os.Geteuid() != 0 {
		fatalf("run as root")
	}
	if err := os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("1"), 0); err != nil {
		fatalf("enabling BPF run-time stats: %v", err)
	}
	atExit(func() { os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("0"), 0) })
	if *soak > 0 {
		defer runAtExit()
		runSoak(*bin, *soak, *soakOut)
		return
	}
	if *goHeap > 0 {
		defer runAtExit()
		runGoHeapBench(*bin, *goHeap)
		return
	}
	if *startup > 0 {
		defer runAtExit()
		runStartup(*bin, *startup, *runs)
		return
	}
	if *rates == "" {
		defer runAtExit()
		runScenarios(*bin, *duration, *runs, *only)
		return
	}

	stopBusy, busy := busyProcesses(*load, *procs)
	atExit(stopBusy)
	defer runAtExit()
	fmt.Printf("%d CPUs kept busy by %d %s processes; medians of %d runs of %v per rate\n\n",
		runtime.NumCPU(), *procs, *load, *runs, *duration)
	fmt.Printf("%6s %10s %10s %9s %8s %9s %9s %10s %6s %6s %9s %12s\n",
		"Hz", "CPU s/min", "BPF s/min", "BPF ns/smp", "RSS MiB", "peak MiB", "maps MiB", "delivered", "lost", "idle",
		"attach s", "1st export")
	for _, r := range strings.Split(*rates, ",") {
		hz, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil {
			fatalf("bad rate %q", r)
		}
		var all []result
		for range *runs {
			all = append(all, measureWith(*bin, hz, *duration, nil, busy))
		}
		m := medians(all)
		fmt.Printf("%6d %10.3f %10.3f %9.0f %8.1f %9.1f %9.2f %9.2f%% %6.0f %6.0f %9.2f %5.2fs/%.2fs\n",
			hz, m.cpuPerMin, m.bpfPerMin, m.bpfPerSample, m.rssMiB, m.peakMiB, m.mapMiB, 100*m.delivered,
			m.lost, m.idle, m.attach.Seconds(), m.firstExport.Seconds(), m.startupCPU.Seconds())
	}
	fmt.Println("\ndelivered: traces user space received / (CPUs × Hz × seconds from attach to SIGTERM).")
	fmt.Println("lost: samples BPF started to unwind that never reached user space; idle: idle-task samples, not reported.")
	fmt.Println("1st export: wall time / daemon CPU time from exec until the first profile was written.")
	fmt.Println("BPF ns/smp: the BPF programs' run time per perf event (sample_entry's runs; tail calls included).")
}

// warmup is how long after the first export the steady state begins.
const warmup = 10 * time.Second

type result struct {
	cpuPerMin, bpfPerMin    float64
	bpfPerSample            float64
	rssMiB, peakMiB, mapMiB float64
	delivered, lost, idle   float64
	attach, firstExport     time.Duration
	startupCPU              time.Duration
	// capture is the share of the side load's CPU time that arrived as
	// samples; -1 when it is not measured.
	capture float64
	// accurate is the time from exec from which the busy processes'
	// stacks are at least 90% complete; -1 when there are none.
	accurate time.Duration
}

// extraDaemonArgs are -daemon-args, given to every daemon started.
var extraDaemonArgs []string

// startDaemon starts the daemon with args, its log in dir/daemon.log
// (a file, not a pipe: a pipe nobody drains during a long run would block
// its logging), killed at exit if still running. readLog returns the
// log's lines so far.
func startDaemon(bin, dir string, args ...string) (cmd *exec.Cmd, readLog func() []string) {
	logPath := filepath.Join(dir, "daemon.log")
	logFile, err := os.Create(logPath)
	check(err)
	defer logFile.Close() // the daemon keeps its own descriptor
	cmd = exec.Command(bin, append(args, extraDaemonArgs...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	check(cmd.Start())
	atExit(func() { cmd.Process.Kill() })
	return cmd, func() []string {
		b, _ := os.ReadFile(logPath)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
}

// measureWith measures the daemon at hz for d after its first export, with
// side spawning processes meanwhile (nil: nothing); busy are the pids whose
// stacks must be complete.
func measureWith(bin string, hz int, d time.Duration, side *spawner, busy []int) result {
	dir, err := os.MkdirTemp("", "bench-daemon")
	check(err)
	defer os.RemoveAll(dir)
	sk := startSink()
	start := time.Now()
	cmd, readLog := startDaemon(bin, dir, append(sk.args(), "-samples-per-second", strconv.Itoa(hz),
		"-reporter-interval", "5s")...)
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var r result
	// Wait for attach and the first export.
	for r.attach == 0 || r.firstExport == 0 {
		select {
		case <-exited:
			fatalf("daemon exited early:\n%s", strings.Join(readLog(), "\n"))
		case <-time.After(20 * time.Millisecond):
		}
		if r.attach == 0 && slices.ContainsFunc(readLog(), func(l string) bool { return strings.Contains(l, "Sampling ") }) {
			r.attach = time.Since(start)
		}
		if r.firstExport == 0 && sk.exported() {
			r.firstExport = time.Since(start)
			r.startupCPU = cpuTime(pid)
		}
		if time.Since(start) > time.Minute {
			fatalf("no export within a minute:\n%s", strings.Join(readLog(), "\n"))
		}
	}

	// Steady state is measured from warmup on: what start-up leaves for
	// later (debug information opened in the background at the first
	// samples of a file, about 0.1 CPU s for libc's) is no per-minute cost.
	time.Sleep(warmup)
	if side != nil {
		side.start()
	}
	cpu0, bpf0, runs0 := cpuTime(pid), bpfRunTime(pid), bpfRunCount(pid)
	t0 := time.Now()
	time.Sleep(d)
	cpu1, bpf1, runs1 := cpuTime(pid), bpfRunTime(pid), bpfRunCount(pid)
	elapsed := time.Since(t0)
	var sr sideResult
	if side != nil {
		sr = side.stop()
	}
	r.rssMiB, r.peakMiB = memory(pid)
	r.mapMiB = float64(bpfMapBytes(pid)) / (1 << 20)
	perMin := time.Minute.Seconds() / elapsed.Seconds()
	r.cpuPerMin = (cpu1 - cpu0).Seconds() * perMin
	r.bpfPerMin = (bpf1 - bpf0).Seconds() * perMin
	r.bpfPerSample = float64(bpf1-bpf0) / float64(max(runs1-runs0, 1))

	sampled := time.Since(start) - r.attach
	check(cmd.Process.Signal(syscall.SIGTERM))
	if err := <-exited; err != nil {
		fatalf("daemon: %v\n%s", err, strings.Join(readLog(), "\n"))
	}
	log := readLog()
	// Delivered: traces user space received over the samples the CPUs could
	// have produced while the perf events were attached.
	received := field(log, "traces_received")
	expected := float64(runtime.NumCPU()*hz) * sampled.Seconds()
	r.delivered = received / expected
	r.lost = field(log, "bpf_samples") - received
	r.idle = field(log, "bpf_idle_samples")
	samples := sk.samples()
	r.capture = -1
	if sr.process != "" {
		var got float64
		for _, smp := range samples {
			if smp.process == sr.process {
				got++
			}
		}
		r.capture = got / (sr.cpu.Seconds() * float64(hz))
	}
	r.accurate = -1
	if len(busy) > 0 {
		r.accurate = accurateFrom(accuracyCurve(samples, busy, start, int(time.Since(start)/time.Second)+1))
	}
	return r
}

// medians returns, field by field, the median of the runs.
func medians(runs []result) result {
	med := func(get func(*result) float64) float64 {
		v := make([]float64, len(runs))
		for i := range runs {
			v[i] = get(&runs[i])
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	dur := func(get func(*result) time.Duration) time.Duration {
		return time.Duration(med(func(r *result) float64 { return float64(get(r)) }))
	}
	return result{
		cpuPerMin:    med(func(r *result) float64 { return r.cpuPerMin }),
		bpfPerMin:    med(func(r *result) float64 { return r.bpfPerMin }),
		bpfPerSample: med(func(r *result) float64 { return r.bpfPerSample }),
		rssMiB:       med(func(r *result) float64 { return r.rssMiB }),
		peakMiB:      med(func(r *result) float64 { return r.peakMiB }),
		mapMiB:       med(func(r *result) float64 { return r.mapMiB }),
		delivered:    med(func(r *result) float64 { return r.delivered }),
		lost:         med(func(r *result) float64 { return r.lost }),
		idle:         med(func(r *result) float64 { return r.idle }),
		attach:       dur(func(r *result) time.Duration { return r.attach }),
		firstExport:  dur(func(r *result) time.Duration { return r.firstExport }),
		startupCPU:   dur(func(r *result) time.Duration { return r.startupCPU }),
		capture:      med(func(r *result) float64 { return r.capture }),
		accurate:     dur(func(r *result) time.Duration { return r.accurate }),
	}
}

var fieldRE = regexp.MustCompile(`(\w+)=(\d+)`)

// field returns a numeric field of the daemon's final "Stopped" log line.
func field(log []string, name string) float64 {
	for i := len(log) - 1; i >= 0; i-- {
		if !strings.Contains(log[i], "msg=Stopped") {
			continue
		}
		for _, m := range fieldRE.FindAllStringSubmatch(log[i], -1) {
			if m[1] == name {
				v, _ := strconv.ParseFloat(m[2], 64)
				return v
			}
		}
	}
	fatalf("no %s in the daemon's final log line:\n%s", name, strings.Join(log, "\n"))
	return 0
}

// cpuTime is utime+stime of pid from /proc/PID/stat.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	check(err)
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}

func memory(pid int) (rss, peak float64) {
	st, err := statusMiB(pid)
	check(err)
	return st["VmRSS"], st["VmHWM"]
}

// statusMiB reads the sizes /proc/PID/status gives in kB, in MiB by field
// name ("VmRSS", "RssAnon", ...).
func statusMiB(pid int) (map[string]float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(l, ":")
		f := strings.Fields(rest)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
			out[name] = kb / 1024
		}
	}
	return out, nil
}

// bpfObjects reads the fdinfo of every BPF program or map fd pid holds,
// keyed by object id: the same counters `bpftool prog show` and `bpftool map
// show` print (run_time_ns, memlock), without needing a bpftool built with
// pid support.
func bpfObjects(pid int, kind string) map[string]map[string]string {
	idKey, typeKey := kind+"_id", kind+"_type"
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	check(err)
	objs := map[string]map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		kv := map[string]string{}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				kv[k] = strings.TrimSpace(v)
			}
		}
		// Links name their program's id too; only the object's own fd
		// carries its type.
		if id, ok := kv[idKey]; ok && kv[typeKey] != "" {
			objs[id] = kv
		}
	}
	return objs
}

// bpfRunTime sums run_time_ns over pid's programs. Tail-called programs run
// inside the entry program and are accounted to it.
func bpfRunTime(pid int) time.Duration {
	var ns int64
	for _, p := range bpfObjects(pid, "prog") {
		v, _ := strconv.ParseInt(p["run_time_ns"], 10, 64)
		ns += v
	}
	return time.Duration(ns)
}

// bpfRunCount is how often the sampling entry program ran: once per perf
// event.
func bpfRunCount(pid int) int64 {
	for _, p := range bpfObjects(pid, "prog") {
		if p["prog_type"] == "7" { // BPF_PROG_TYPE_PERF_EVENT
			if v, err := strconv.ParseInt(p["run_cnt"], 10, 64); err == nil && v > 0 {
				return v
			}
		}
	}
	return 0
}

func bpfMapBytes(pid int) uint64 {
	var total uint64
	for _, m := range bpfObjects(pid, "map") {
		v, _ := strconv.ParseUint(m["memlock"], 10, 64)
		total += v
	}
	return total
}

// busyProcesses starts n busy processes of the given kind and returns the
// func that stops them and their pids. A runtime's kind may name its
// version after a colon (python:3.15, python:tailcall, java:26, node:26,
// ruby:3.4, php:8.4, perl:5.42, beam:27); without one, the version the tables of
// docs/overhead.md were measured with.
func busyProcesses(load string, n int) (stop func(), pids []int) {
	var argv []string
	kind, version, _ := strings.Cut(load, ":")
	or := func(def string) string {
		if version == "" {
			return def
		}
		return version
	}
	switch kind {
	case "shell":
		argv = []string{"sh", "-c", "while :; do :; done"}
	case "c":
		argv = []string{buildLoad("fpchain", "gcc", "-O2", "-o", "BIN", "utils/workloads/fpchain.c"), "1000000"}
	case "go":
		argv = []string{buildLoad("gochain", "go", "build", "-o", "BIN", "./utils/workloads/gochain"), "1000000"}
	case "otelspans":
		// Two threads in and out of OpenTelemetry spans (OTEP 4947);
		// otelspans:off publishes no process context, so their records
		// are not read.
		argv = []string{buildLoad("otelspans", "gcc", "-O2", "-pthread", "-Wl,--export-dynamic-symbol=otel_thread_ctx_v1",
			"-o", "BIN", "utils/workloads/otelspans.c"), "1000000"}
		if version == "off" {
			argv = append(argv, "nocontext")
		}
	case "golabels":
		// Four goroutines, three under pprof labels (two, two and ten).
		argv = []string{buildLoad("golabels", "go", "build", "-C", "utils/workloads/golabels", "-o", "BIN", "."), "1000000"}
	case "manymaps":
		argv = []string{buildLoad("manymaps", "gcc", "-O2", "-o", "BIN", "utils/workloads/manymaps.c"), "1000000"}
	case "pingpong":
		// A context-switch storm, for off-CPU profiling's cost
		// (-daemon-args=-off-cpu-threshold=1).
		argv = []string{buildLoad("pingpong", "gcc", "-O2", "-pthread", "-o", "BIN", "utils/workloads/pingpong.c"), "1000000"}
	case "python":
		py := "python3"
		var err error
		switch version {
		case "":
		case "tailcall":
			py, err = pyfetch.TailCallPython("3.14")
		default:
			// pyenv's 3.6-3.13, or Debian sid's 3.14 and 3.15.
			if py, err = pyfetch.PyenvPython(version); err != nil {
				py, err = pyfetch.Python(version)
			}
		}
		check(err)
		argv = []string{py, "utils/workloads/python/pyworkload.py", "chain", "1000000"}
	case "apm", "apm-off":
		argv = apmLoad(kind == "apm")
	case "java":
		// The chain workload, mid interpreted between compiled leaf and
		// top, in a JVM of Debian 12's JDK 17 (or the version named),
		// compiled for JDK 8 by the system's javac.
		java, err := jdkfetch.Java(or("17"))
		check(err)
		dir, err := os.MkdirTemp("", "bench-java")
		check(err)
		atExit(func() { os.RemoveAll(dir) })
		javac := filepath.Join(filepath.Dir(jdkfetch.SystemJava), "javac")
		out, err := exec.Command(javac, "--release", "8", "-d", dir, "utils/workloads/java/JWorkload.java").CombinedOutput()
		if err != nil {
			fatalf("compiling the Java load (run from the repository root): %v\n%s", err, out)
		}
		argv = []string{java, "-XX:CompileCommand=quiet", "-XX:CompileCommand=exclude,JWorkload::mid",
			"-cp", dir, "JWorkload", "chain", "1000000"}
	case "ruby":
		rb, err := rubyfetch.Ruby(or("3.1"))
		check(err)
		argv = []string{rb, "utils/workloads/ruby/rbworkload.rb", "chain", "1000000"}
	case "php":
		b, err := phpfetch.PHP(or("8.2"))
		check(err)
		argv = append([]string{b.CLI}, append(b.Args, "utils/workloads/php/phpworkload.php", "chain", "1000000")...)
	case "perl":
		pl, err := perlfetch.Perl(or("5.36"))
		check(err)
		argv = []string{pl, "utils/workloads/perl/plworkload.pl", "chain", "1000000"}
	case "beam":
		// The chain workload (a frameless tail-recursive leaf) in Debian's
		// Erlang/OTP 29 (or the release named), compiled by its erlc.
		erlc, err := beamfetch.Erlc(or("29"))
		check(err)
		erl, err := beamfetch.Erl(or("29"))
		check(err)
		dir, err := os.MkdirTemp("", "bench-beam")
		check(err)
		atExit(func() { os.RemoveAll(dir) })
		if out, err := exec.Command(erlc, "-o", dir, "utils/workloads/erlang/ewl.erl").CombinedOutput(); err != nil {
			fatalf("compiling the Erlang load (run from the repository root): %v\n%s", err, out)
		}
		// ewl reads its seconds as a float.
		argv = []string{erl, "-noshell", "-pa", dir, "-s", "ewl", "main", "chain", "1000000.0"}
	case "luajit":
		// The chain workload, JIT on, in Debian sid's luajit (or the
		// version named, "2.1-20250117").
		lj, err := luajitfetch.Executable(or(luajitfetch.Versions[len(luajitfetch.Versions)-1]), runtime.GOARCH)
		check(err)
		argv = []string{lj, "utils/workloads/luajit/ljworkload.lua", "chain", "1000000"}
	case "node":
		// The chain workload with default flags (TurboFan inlines leaf
		// and mid into top) in the machine's Node 20 (or the version
		// named).
		node, err := nodefetch.Node(or("20"))
		check(err)
		argv = []string{node, "utils/workloads/node/v8work.js", "chain", "1000000"}
	default:
		fatalf("unknown load %q", load)
	}
	var cmds []*exec.Cmd
	for i := range n {
		args := slices.Clone(argv[1:])
		for j := range args {
			args[j] = strings.ReplaceAll(args[j], "%d", strconv.Itoa(i))
		}
		c := exec.Command(argv[0], args...)
		check(c.Start())
		cmds = append(cmds, c)
		pids = append(pids, c.Process.Pid)
	}
	return func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}, pids
}

// buildLoad builds a load's binary, name, into a temporary directory
// removed at exit, with the command given (BIN standing for the binary's
// path), run from the repository root.
func buildLoad(name string, command ...string) string {
	dir, err := os.MkdirTemp("", "bench-"+name)
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, name)
	args := slices.Clone(command[1:])
	for i := range args {
		if args[i] == "BIN" {
			args[i] = bin
		}
	}
	if out, err := exec.Command(command[0], args...).CombinedOutput(); err != nil {
		fatalf("building %s (run from the repository root): %v\n%s", name, err, out)
	}
	return bin
}

// apmLoad builds utils/testagent and returns the command line of its app,
// with %d in the socket path for the process's number. Without correlate,
// the agent library gets a name the correlation spec's pattern misses.
func apmLoad(correlate bool) []string {
	dir, err := os.MkdirTemp("", "bench-apm")
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	if out, err := exec.Command("make", "-C", "utils/testagent", "OUT="+dir).CombinedOutput(); err != nil {
		fatalf("building the test agent (run from the repository root): %v\n%s", err, out)
	}
	libs, _ := filepath.Glob(filepath.Join(dir, "elastic-jvmti-linux-*.so"))
	if len(libs) != 1 {
		fatalf("no test agent library in %s", dir)
	}
	lib := libs[0]
	if !correlate {
		lib = filepath.Join(dir, "libtestagent.so")
		check(os.Rename(libs[0], lib))
	}
	return []string{filepath.Join(dir, "app"), lib, filepath.Join(dir, "agent-%d.sock"), "1000000"}
}

func check(err error) {
	if err != nil {
		fatalf("%v", err)
	}
}

// cleanups undo what the benchmark started (load, daemons, the BPF stats
// sysctl), also when it fails.
var cleanups []func()

func atExit(f func()) { cleanups = append(cleanups, f) }

func runAtExit() {
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	runAtExit()
	os.Exit(1)
}

package integration

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracer"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// requireRoot skips an integration test unless the suite runs them. A run
// that only prepares workloads needs neither root nor BPF.
func requireRoot(t *testing.T) {
	t.Helper()
	if !preparing() {
		testenv.RequireBPF(t)
	}
}

// sample is one reported sample.
type sample struct {
	trace *libpf.Trace
	meta  libpf.SampleMeta
}

// recorder is a processmanager.TraceReporter that keeps every sample.
type recorder struct {
	mu      sync.Mutex
	samples []sample
}

func (r *recorder) ReportSample(t *libpf.Trace, m *libpf.SampleMeta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, sample{t, *m})
}

// ofPID returns the samples of one process in the order they were taken.
func (r *recorder) ofPID(pid int) []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sample
	for _, s := range r.samples {
		if s.meta.Process != nil && int(s.meta.Process.PID) == pid {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].meta.Time.Before(out[j].meta.Time) })
	return out
}

// eventLog sits between the tracer and the trace handler and records, in
// order, which pid each trace and process event was for.
type eventLog struct {
	*processmanager.Handler
	mu     sync.Mutex
	events []pidEvent
}

type pidEvent struct {
	kind string // "trace", "exit", "exec" or "unknown-pc"
	pid  libpf.PID
	at   time.Time
	pc   uint64 // of an unknown-pc event
}

func (l *eventLog) record(kind string, pid libpf.PID) { l.recordPC(kind, pid, 0) }

func (l *eventLog) recordPC(kind string, pid libpf.PID, pc uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, pidEvent{kind, pid, time.Now(), pc})
}

func (l *eventLog) HandleTrace(raw *support.Trace) {
	l.record("trace", libpf.PID(raw.PID))
	l.Handler.HandleTrace(raw)
}

func (l *eventLog) ProcessExited(pid libpf.PID) {
	l.record("exit", pid)
	l.Handler.ProcessExited(pid)
}

func (l *eventLog) ProcessExeced(pid libpf.PID, program support.FileKey) {
	l.record("exec", pid)
	l.Handler.ProcessExeced(pid, program)
}

func (l *eventLog) UnknownPC(pid libpf.PID, pc uint64) {
	l.recordPC("unknown-pc", pid, pc)
	l.Handler.UnknownPC(pid, pc)
}

// unknownPCs describes the unknown-PC reports for pid, each at its time
// from since: where code was not yet mapped for the unwinder.
func (l *eventLog) unknownPCs(pid int, since time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if int(e.pid) == pid && e.kind == "unknown-pc" {
			out = append(out, fmt.Sprintf("%+dms:%#x", e.at.Sub(since).Milliseconds(), e.pc))
		}
	}
	return strings.Join(out, " ")
}

// of returns the kinds of events for one pid, in order.
func (l *eventLog) of(pid int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var kinds []string
	for _, e := range l.events {
		if int(e.pid) == pid {
			kinds = append(kinds, e.kind)
		}
	}
	return kinds
}

// session is the real pipeline minus the reporter: tracer, process manager
// and trace handler, recording every sample and event.
type session struct {
	tr     *tracer.Tracer
	pm     *processmanager.Manager
	log    *eventLog
	rec    *recorder
	cancel context.CancelFunc
	done   chan error
}

func startSession(t *testing.T, hz int) *session {
	t.Helper()
	return startSessionWith(t, hz, nil)
}

// startSessionWith is startSession with the process manager's
// configuration changed by configure.
func startSessionWith(t *testing.T, hz int, configure func(*processmanager.Config)) *session {
	t.Helper()
	return startTracing(t, tracer.Config{SamplesPerSecond: hz, Runtimes: interpreter.All()}, configure)
}

// startTracing is startSessionWith with the tracer's configuration.
func startTracing(t *testing.T, tc tracer.Config, configure func(*processmanager.Config)) *session {
	t.Helper()
	skipIfPreparing(t)
	runtimes := tc.Runtimes
	cpuBefore := processmanager.ReadCPUTimes("")
	tr, err := tracer.New(tc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := processmanager.Config{Unwinding: &unwindmaps.Unwinding{
		Maps: tr, Capacity: tr.DeltaCapacity(), Extract: nativeunwind.ExtractReader, Runtimes: tr, APM: tr,
		GoLabels: tr, ThreadCtx: tr, ReadAtFirstSample: tr.ResolvesUnread(), Tracked: tr,
	}, Runtimes: runtimes}
	if configure != nil {
		configure(&cfg)
	}
	pm, err := processmanager.New(cfg)
	if err != nil {
		tr.Close()
		t.Fatal(err)
	}
	rec := &recorder{}
	h, err := processmanager.NewHandler(pm, rec, 0)
	if err != nil {
		tr.Close()
		t.Fatal(err)
	}
	// As the daemon does: the processes busy while the programs loaded
	// (this one) are set up before sampling starts.
	prepCtx, cancelPrep := context.WithTimeout(context.Background(), 10*time.Second)
	pm.PrepareBusy(prepCtx, cpuBefore)
	cancelPrep()
	if err := tr.Attach(); err != nil {
		tr.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{tr: tr, pm: pm, log: &eventLog{Handler: h}, rec: rec, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- tr.Run(ctx, s.log) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop detaches, drains the ring buffer and unloads; safe to call twice.
func (s *session) stop(t *testing.T) {
	if s.cancel == nil {
		return
	}
	s.tr.Detach()
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil {
		t.Errorf("event pump: %v", err)
	}
	s.log.Close()
	t.Logf("lifecycle: %+v", s.log.Stats().Lifecycle)
	s.pm.Close()
	s.tr.Close()
}

// setSampling switches the perf events on or off.
func (s *session) setSampling(t *testing.T, on bool) {
	t.Helper()
	if err := s.tr.SetSampling(on); err != nil {
		t.Fatal(err)
	}
}

// warmup is how many of a new process's samples (in time order) come
// before the first whose stack matches want: until the process manager
// has read its files. The machine's speed sets its length (ten times
// longer under emulation), so tests measure it apart and bound it by
// maxWarmupSamples.
func warmup(t *testing.T, samples []sample, bin string, syms *symbolTable, want *regexp.Regexp) int {
	t.Helper()
	i := slices.IndexFunc(samples, func(smp sample) bool { return want.MatchString(stackString(smp.trace, bin, syms)) })
	if i < 0 || i > maxWarmupSamples {
		stacks := map[string]int{}
		for _, smp := range samples {
			stacks[stackString(smp.trace, bin, syms)]++
		}
		logTopStacks(t, stacks, 5)
		t.Fatalf("%d samples before the first with the stack %s (-1: none of %d), want <= %d",
			i, want, len(samples), maxWarmupSamples)
	}
	return i
}

// waitExited waits until the process exit event of pid has been handled:
// BPF emitted every sample of the process before it, and the lifecycle has
// reported those it held (a new process's first samples wait there for its
// set-up, a second of them under emulation).
func (s *session) waitExited(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if slices.Contains(s.log.of(pid), "exit") {
			s.log.Flush()
			return
		}
	}
	t.Fatalf("no exit event for process %d within a minute", pid)
}

// runWorkload runs bin for the given time and returns its pid and the CPU
// time it used.
func runWorkload(t *testing.T, bin string, d time.Duration) (pid int, cpu time.Duration) {
	t.Helper()
	cmd := exec.Command(bin, formatSeconds(d))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	return cmd.Process.Pid, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

func formatSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}

// functionNames lists a trace's frames' function names, leaf first.
func functionNames(tr *libpf.Trace) []string {
	names := make([]string, len(tr.Frames))
	for i := range tr.Frames {
		names[i] = tr.Frames[i].FunctionName
	}
	return names
}

// hasChain reports whether chain (leaf first) appears as consecutive frames.
func hasChain(names, chain []string) bool {
	for i := 0; i+len(chain) <= len(names); i++ {
		match := true
		for j, c := range chain {
			if names[i+j] != c {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// pairUp lets the calling subtest, one runtime version's, run beside one
// other (go test's -parallel is GOMAXPROCS, 2 here): each has its own
// session, both see a busy host, as users run it, and a version's suite
// takes half the time. Not in a VM, whose one emulated CPU would delay
// the JITs' warm-up (utils/kernelmatrix).
func pairUp(t *testing.T) {
	if !inVM() {
		t.Parallel()
	}
}

// shareResults are a table's shares (logShareTable), written by subtests
// that may run at once.
type shareResults struct {
	mu sync.Mutex
	m  map[string][]float64
}

// init gives version n cases, n/a until set.
func (r *shareResults) init(version string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[version] = slices.Repeat([]float64{math.NaN()}, n)
}

func (r *shareResults) set(version string, i int, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[version][i] = v
}

// logShareTable logs a Markdown table of shares: a row per version, a
// column per case.
func logShareTable(t *testing.T, head string, versions, cases []string, results map[string][]float64) {
	t.Helper()
	var table strings.Builder
	fmt.Fprintf(&table, "\n| %s |", head)
	for _, c := range cases {
		fmt.Fprintf(&table, " %s |", c)
	}
	table.WriteString("\n|---|" + strings.Repeat("---|", len(cases)) + "\n")
	for _, v := range versions {
		fmt.Fprintf(&table, "| %s |", v)
		for _, r := range results[v] {
			if math.IsNaN(r) { // the case does not apply to the version, or was not run
				table.WriteString(" n/a |")
				continue
			}
			fmt.Fprintf(&table, " %.1f%% |", 100*r)
		}
		table.WriteString("\n")
	}
	t.Log(table.String())
}

package main

import (
	"os"
	"slices"
	"strings"
	"time"

	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// The daemon exports to a real OpenTelemetry Collector (the one the e2e
// tests run, utils/collector), as in production: what it costs includes
// OTLP encoding and gRPC. What the Collector wrote is how the benchmark
// sees the samples.

// sink is a Collector the daemon exports to during one run.
type sink struct {
	c *collector.Collector
}

// startSink starts the pinned Collector (built by utils/collector/build.sh
// on first use) on a free port.
func startSink() *sink {
	bin, err := collector.Binary(".")
	if err != nil {
		fatalf("the Collector (run from the repository root): %v", err)
	}
	gate, _, err := collector.GateArgs(bin)
	check(err)
	dir, err := os.MkdirTemp("", "bench-collector")
	check(err)
	atExit(func() { os.RemoveAll(dir) })
	c, err := collector.Start(bin, gate, dir, nil, "basic")
	check(err)
	atExit(func() { c.Stop() })
	return &sink{c: c}
}

// args are the daemon's flags that export to the sink.
func (s *sink) args() []string { return []string{"-collection-agent", s.c.Addr, "-disable-tls"} }

// exported says whether the Collector wrote anything yet.
func (s *sink) exported() bool {
	st, err := os.Stat(s.c.OutPath)
	return err == nil && st.Size() > 0
}

// sample is what the benchmark reads of the exported samples.
type sample struct {
	pid     int64
	process string
	// root is the outermost frame's function, "" when unnamed.
	root string
	at   time.Time
}

// samples stops the Collector (it flushes on SIGTERM) and returns every
// sample it received, one per timestamp.
func (s *sink) samples() []sample {
	check(s.c.Stop())
	pds, err := collector.ReadOutput(s.c.OutPath, false)
	check(err)
	var out []sample
	for _, pd := range pds {
		check(collector.ResolveAttributeRefs(pd))
		d := pd.GetDictionary()
		for _, rp := range pd.GetResourceProfiles() {
			var pid int64
			for _, kv := range rp.GetResource().GetAttributes() {
				if kv.GetKey() == "process.pid" {
					pid = kv.GetValue().GetIntValue()
				}
			}
			name := collector.ResourceAttr(rp, "process.executable.name")
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					for _, smp := range p.GetSamples() {
						root := outermost(d, smp)
						for _, ts := range smp.GetTimestampsUnixNano() {
							out = append(out, sample{pid: pid, process: name, root: root, at: time.Unix(0, int64(ts))})
						}
					}
				}
			}
		}
	}
	return out
}

// outermost is the name of a sample's outermost function, "" when its
// frame has no name. Stacks list the innermost location first, and a
// location's lines the innermost inlined function first.
func outermost(d *profilespb.ProfilesDictionary, smp *profilespb.Sample) string {
	at := func(i int32, n int) bool { return i >= 0 && int(i) < n }
	st := d.GetStackTable()
	if !at(smp.GetStackIndex(), len(st)) {
		return ""
	}
	locs := st[smp.GetStackIndex()].GetLocationIndices()
	if len(locs) == 0 || !at(locs[len(locs)-1], len(d.GetLocationTable())) {
		return ""
	}
	lines := d.GetLocationTable()[locs[len(locs)-1]].GetLines()
	if len(lines) == 0 || !at(lines[len(lines)-1].GetFunctionIndex(), len(d.GetFunctionTable())) {
		return ""
	}
	fn := d.GetFunctionTable()[lines[len(lines)-1].GetFunctionIndex()]
	if !at(fn.GetNameStrindex(), len(d.GetStringTable())) {
		return ""
	}
	return d.GetStringTable()[fn.GetNameStrindex()]
}

// threadRoots are the functions a thread's stack ends in (Go's named with
// or without their ABI suffix).
var threadRoots = []string{"_start", "start_thread", "__clone", "__clone3", "runtime.goexit", "runtime.mstart", "runtime.rt0_go"}

// complete says whether a sample's stack reaches where its thread began:
// anything else was cut short (deltas not loaded yet, a frame the unwinder
// could not pass).
func (s *sample) complete() bool {
	return slices.Contains(threadRoots, strings.TrimSuffix(s.root, ".abi0"))
}

// accuracyCurve is, per second since start (seconds of them), the share
// of the samples of pids with complete stacks; -1 where a second has none.
func accuracyCurve(samples []sample, pids []int, start time.Time, seconds int) []float64 {
	complete := make([]float64, seconds)
	total := make([]float64, seconds)
	for _, s := range samples {
		sec := int(s.at.Sub(start) / time.Second)
		if sec < 0 || sec >= seconds || !slices.Contains(pids, int(s.pid)) {
			continue
		}
		total[sec]++
		if s.complete() {
			complete[sec]++
		}
	}
	curve := make([]float64, seconds)
	for i := range curve {
		curve[i] = -1
		if total[i] > 0 {
			curve[i] = complete[i] / total[i]
		}
	}
	return curve
}

// accurateFrom is the first second of curve from which every later second
// with samples is at least 90% complete; -1 if none is.
func accurateFrom(curve []float64) time.Duration {
	at := time.Duration(-1)
	for s := len(curve) - 1; s >= 0 && (curve[s] < 0 || curve[s] >= 0.9); s-- {
		if curve[s] >= 0 {
			at = time.Duration(s) * time.Second
		}
	}
	return at
}

package tracer

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Off-CPU profiling (support/ebpf/off_cpu.ebpf.c): at a context switch
// the thread leaving the CPU is unwound by a second copy of the unwinders,
// loaded as raw tracepoint programs (a prog array holds programs of one
// type); when it runs again, BPF reports how long it waited, and the pump
// joins that with its trace.

// OffCPUConfig says which context switches are traced.
type OffCPUConfig struct {
	// Threshold is the share of switch-outs traced, from 0 (off) to 1
	// (all): the reference profiler's -off-cpu-threshold.
	Threshold float64
	// MinWait is the shortest wait reported.
	MinWait time.Duration
	// PerSecond bounds the switch-outs unwound per CPU and second
	// (DefaultOffCPUPerSecond when 0): with a million switches a second,
	// the threshold alone would not bound the CPU time spent.
	PerSecond uint32
}

// DefaultOffCPUPerSecond is OffCPUConfig.PerSecond's default.
const DefaultOffCPUPerSecond = 2000

func (c OffCPUConfig) perSecond() uint32 {
	if c.PerSecond == 0 {
		return DefaultOffCPUPerSecond
	}
	return c.PerSecond
}

// Enabled says whether off-CPU profiling is on.
func (c OffCPUConfig) Enabled() bool { return c.Threshold > 0 }

// Validate checks the bounds of c.
func (c OffCPUConfig) Validate() error {
	if c.Threshold < 0 || c.Threshold > 1 {
		return fmt.Errorf("the off-CPU threshold must be from 0 (off) to 1 (every context switch), got %g", c.Threshold)
	}
	if c.MinWait < 0 {
		return fmt.Errorf("the minimum off-CPU wait must not be negative, got %v", c.MinWait)
	}
	return nil
}

// OffCPUSwitch is the sched_switch program.
const OffCPUSwitch = "off_cpu_switch"

// offCPUMaps are the maps only off-CPU profiling uses: left out when off
// (the scratch record alone is 8 KiB per CPU).
var offCPUMaps = []string{"off_cpu_starts", "off_cpu_budgets", "off_cpu_progs", "off_cpu_records", "off_cpu_paused"}

// prepareOffCPU takes the sched_switch program out of spec (it is loaded
// on its own, loadOffCPU) and sets its constants; nil when off.
func prepareOffCPU(spec *ebpf.CollectionSpec, cfg OffCPUConfig) (*ebpf.ProgramSpec, error) {
	ps := splitProgram(spec, OffCPUSwitch)
	if !cfg.Enabled() {
		for _, name := range offCPUMaps {
			delete(spec.Maps, name)
		}
		return nil, nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ps == nil {
		return nil, errors.New("BPF object lacks " + OffCPUSwitch)
	}
	// A switch-out is traced when a random u32 is below the threshold;
	// 2^32 traces all.
	threshold := uint64(cfg.Threshold * (1 << 32))
	return ps, setConstants(spec, map[string]any{
		"off_cpu_threshold":  threshold,
		"off_cpu_per_second": uint64(cfg.perSecond()),
		"off_cpu_min_ns":     uint64(cfg.MinWait),
		"off_cpu_self_pid":   uint32(os.Getpid()),
	})
}

// loadOffCPU loads the sched_switch program and a raw tracepoint copy of
// every tail-call target, with off_cpu_progs and off_cpu_records in place
// of progs and records, and fills off_cpu_progs. Nil when off.
func (t *Tracer) loadOffCPU(spec *ebpf.CollectionSpec, ls *preparedSpec, opts ebpf.ProgramOptions,
	cache *btf.Cache) (*ebpf.Collection, error) {
	if ls.offCPU == nil {
		return nil, nil
	}
	one := spec.Copy()
	one.Programs = map[string]*ebpf.ProgramSpec{OffCPUSwitch: ls.offCPU.Copy()}
	for name := range t.progSlots() {
		ps := spec.Programs[name]
		if name == ReadContext {
			ps = ls.readContext
		}
		if ps == nil {
			return nil, fmt.Errorf("BPF object lacks program %s", name)
		}
		c := ps.Copy()
		c.Type, c.AttachType, c.AttachTo = ebpf.RawTracepoint, ebpf.AttachNone, ""
		one.Programs[name] = c
	}
	repl := maps.Clone(t.coll.Maps)
	repl["progs"], repl["records"] = t.coll.Maps["off_cpu_progs"], t.coll.Maps["off_cpu_records"]
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{MapReplacements: repl, Programs: opts, Cache: cache})
	if err != nil {
		return nil, fmt.Errorf("loading the off-CPU programs: %w", loadError(err))
	}
	progs := maps.Clone(coll.Programs)
	delete(progs, OffCPUSwitch)
	if err := t.fillProgArray(t.coll.Maps["off_cpu_progs"], progs); err != nil {
		coll.Close()
		return nil, err
	}
	t.offCPUPending = newOffCPUPending()
	return coll, nil
}

// pauseOffCPU stops or resumes tracing switches (off_cpu_paused): waits
// traced before a pause still end.
func (t *Tracer) pauseOffCPU(paused bool) error {
	if err := t.coll.Maps["off_cpu_paused"].Put(uint32(0), boolToU32(paused)); err != nil {
		return fmt.Errorf("pausing off-CPU tracing: %w", err)
	}
	return nil
}

// attachOffCPU attaches the sched_switch program, if loaded.
func (t *Tracer) attachOffCPU() error {
	if t.offCPU == nil {
		return nil
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_switch", Program: t.offCPU.Programs[OffCPUSwitch]})
	if err != nil {
		return fmt.Errorf("attaching to the sched_switch tracepoint: %w", err)
	}
	t.procLinks = append(t.procLinks, l)
	c := t.cfg.OffCPU
	log.Infof("Tracing %g of context switches off the CPU (raw tracepoint sched_switch; waits from %v; at most %d unwinds per CPU per second)",
		c.Threshold, c.MinWait, c.perSecond())
	return nil
}

// OffCPUUnmatched counts the waits that ended whose trace the pump did not
// hold (dropped for a full ring buffer, or evicted): lost.
func (t *Tracer) OffCPUUnmatched() uint64 {
	if t.offCPUPending == nil {
		return 0
	}
	return t.offCPUPending.unmatched.Load()
}

// maxOffCPUPending and maxOffCPUPendingBytes bound the traces of the waits
// whose end the pump waits for: as many as BPF's off_cpu_starts holds, and
// their bytes (a trace is 1-2 KiB, at most 8).
const (
	maxOffCPUPending      = 16384
	maxOffCPUPendingBytes = 16 << 20
)

// offCPUPending holds the off-CPU traces whose wait has not ended, by
// thread: a thread waits once at a time, so a thread's next trace replaces
// one whose end BPF did not report (shorter than the minimum).
type offCPUPending struct {
	traces *libpf.LRU[uint32, pendingOffCPU]
	// unmatched counts ends without their trace (dropped: the ring buffer
	// was full, or the trace was evicted).
	unmatched atomic.Uint64
}

type pendingOffCPU struct {
	raw   []byte
	start uint64
}

func newOffCPUPending() *offCPUPending {
	return &offCPUPending{traces: libpf.NewLRU[uint32, pendingOffCPU](maxOffCPUPending, maxOffCPUPendingBytes)}
}

// hold keeps a copy of an off-CPU trace's record until its end.
func (p *offCPUPending) hold(trace *support.Trace, raw []byte) {
	p.traces.Add(trace.TID, pendingOffCPU{raw: append([]byte(nil), raw...), start: trace.KTime}, len(raw))
}

// Len is how many waits have not ended.
func (p *offCPUPending) Len() int { return p.traces.Len() }

// take returns the record of the trace that ev ends, if held; one not
// held is counted as unmatched where count is set.
func (p *offCPUPending) take(ev support.Event, count bool) ([]byte, bool) {
	held, ok := p.traces.Get(ev.TID)
	if !ok || held.start != ev.Start {
		if count {
			p.unmatched.Add(1)
		}
		return nil, false
	}
	p.traces.Remove(ev.TID)
	return held.raw, true
}

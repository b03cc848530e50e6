package main

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracecorr"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// monitor watches the counters of every stage: each interval it logs one
// status line, warns when samples are being lost or a map fills, and frees
// the state of processes that exited unnoticed.
type monitor struct {
	tr      *tracer.Tracer
	handler *processmanager.Handler
	pm      *processmanager.Manager
	rep     *reporter.Reporter
	corr    *tracecorr.Correlator
	prob    *probabilistic
	hist    *reporter.History // the web view's, nil without -http
	heaps   *goheap.Reader    // nil without -go-heap-interval
	// last is the snapshot at the previous check.
	last snapshot
	// fullMaps are the maps already warned about.
	fullMaps map[string]bool
	// lastKsymsReload is when kernel symbols were last read.
	lastKsymsReload time.Time
}

// snapshot is every stage's counters at one check.
type snapshot struct {
	bpf       map[string]uint64
	malformed uint64
	// offCPUUnmatched counts waits whose trace the pump did not hold.
	offCPUUnmatched uint64
	queue           tracer.QueueStats
	handler         processmanager.Stats
	rep             reporter.Stats
	corr            tracecorr.Stats
	web             reporter.HistoryStats // zero without -http
	heaps           goheap.Stats
}

// ksymsReloadInterval is how often kernel symbols are read again, so that
// modules and BPF programs loaded since are symbolized. Reading them costs
// tens of milliseconds.
const ksymsReloadInterval = 10 * time.Minute

// mapFullWarning is the fill level of a map that earns a warning.
const mapFullWarning = 0.9

func newMonitor(tr *tracer.Tracer, h *processmanager.Handler, pm *processmanager.Manager,
	rep *reporter.Reporter, corr *tracecorr.Correlator, prob *probabilistic, hist *reporter.History) *monitor {
	return &monitor{tr: tr, handler: h, pm: pm, rep: rep, corr: corr, prob: prob, hist: hist,
		last: snapshot{bpf: map[string]uint64{}}, fullMaps: map[string]bool{}, lastKsymsReload: time.Now()}
}

// lossCounters are the BPF counters that mean samples were lost.
var lossCounters = []string{"err_trace_dropped", "err_process_event_dropped", "err_record_lookup", "err_tail_call"}

func (m *monitor) check() {
	m.pm.Sweep()
	if time.Since(m.lastKsymsReload) >= ksymsReloadInterval {
		m.pm.ReloadKernelSymbols()
		m.lastKsymsReload = time.Now()
	}
	cur := snapshot{malformed: m.tr.MalformedEvents(), offCPUUnmatched: m.tr.OffCPUUnmatched(), queue: m.tr.QueueStats(), handler: m.handler.Stats(), rep: m.rep.Stats(),
		corr: m.corr.Stats()}
	if m.hist != nil {
		cur.web = m.hist.Stats()
	}
	if m.heaps != nil {
		cur.heaps = m.heaps.Stats()
	}
	var err error
	if cur.bpf, err = m.tr.Metrics(); err != nil {
		log.Warnf("Reading BPF counters: %v", err)
		cur.bpf = m.last.bpf
	}
	if n := cur.malformed - m.last.malformed; n > 0 {
		log.Warnf("%d BPF events did not decode (BPF object and daemon out of step?)", n)
	}
	for _, name := range lossCounters {
		if d := cur.bpf[name] - m.last.bpf[name]; d > 0 {
			log.Warnf("BPF counter %s grew by %d: samples are being lost", name, d)
		}
	}
	if n := cur.queue.TracesDropped + cur.queue.EventsDropped - m.last.queue.TracesDropped - m.last.queue.EventsDropped; n > 0 {
		log.Warnf("The event queue was full: %d traces and process events dropped (the daemon is behind)", n)
	}
	fills := m.mapFills(cur.handler)
	m.warnFullMaps(fills)
	log.WithFields(statusFields(m.last, cur, fills, m.samplingState())).Info("Status")
	if log.IsLevelEnabled(log.DebugLevel) {
		log.Debugf("BPF counters: %s", counterDeltas(m.last.bpf, cur.bpf, func(string) bool { return true }))
		log.Debugf("Trace handling: %+v", cur.handler)
		log.Debugf("Reporter: %+v", cur.rep)
		log.Debugf("APM correlation: %+v", cur.corr)
	}
	m.last = cur
}

// samplingState is "on" or "off" under probabilistic profiling, else "".
func (m *monitor) samplingState() string {
	if !m.prob.enabled() {
		return ""
	}
	return onOff(m.prob.on.Load())
}

// mapFill is how full a BPF map that user space fills is.
type mapFill struct {
	name       string
	used       int
	capacity   uint32
	scalesWith bool // -map-scale-factor enlarges it
}

func (f mapFill) ratio() float64 {
	if f.capacity == 0 {
		return 0
	}
	return float64(f.used) / float64(f.capacity)
}

func (m *monitor) mapFills(hs processmanager.Stats) []mapFill {
	r := hs.DeltasResident
	capacity := m.tr.DeltaCapacity()
	return []mapFill{
		{"stack_deltas", r.Deltas, capacity.Deltas, true},
		{"delta_pages", r.Pages, m.tr.MapMaxEntries("delta_pages"), true},
		{"pid_mappings", r.MappingPrefixes, m.tr.MapMaxEntries("pid_mappings"), true},
		{"unwind_rules", r.Rules, capacity.Rules, true},
		{"known_files", r.Files, m.tr.MapMaxEntries("known_files"), false},
		{"runtime_procs", hs.RuntimeConfigs, m.tr.MapMaxEntries("runtime_procs"), false},
	}
}

// warnFullMaps warns once per map that crosses mapFullWarning: what does
// not fit falls back to frame pointers.
func (m *monitor) warnFullMaps(fills []mapFill) {
	for _, f := range fills {
		if f.ratio() < mapFullWarning || m.fullMaps[f.name] {
			continue
		}
		m.fullMaps[f.name] = true
		advice := ""
		if f.scalesWith {
			advice = "; raise -map-scale-factor"
		}
		log.Warnf("BPF map %s is %.0f%% full (%d of %d)%s", f.name, 100*f.ratio(), f.used, f.capacity, advice)
	}
}

// statusFields is the one-line status of the interval between two
// snapshots: what was sampled and exported, what was lost or failed and
// why, and how full the maps are. Counts are the interval's; sizes are
// current.
func statusFields(prev, cur snapshot, fills []mapFill, sampling string) log.Fields {
	d := func(a, b uint64) uint64 { return b - a }
	f := log.Fields{
		"samples":         d(prev.bpf["samples"], cur.bpf["samples"]),
		"traces_sent":     d(prev.bpf["traces_sent"], cur.bpf["traces_sent"]),
		"traces_received": d(prev.handler.TracesReceived, cur.handler.TracesReceived),
		"reported": d(prev.rep.SamplesReceived, cur.rep.SamplesReceived) -
			min(d(prev.rep.SamplesDropped, cur.rep.SamplesDropped), d(prev.rep.SamplesReceived, cur.rep.SamplesReceived)),
		"exported": d(prev.rep.SamplesExported, cur.rep.SamplesExported),
		"export_errors": d(prev.rep.ExportErrors, cur.rep.ExportErrors) +
			d(prev.rep.PprofErrors, cur.rep.PprofErrors),
		"processes":  cur.handler.ProcessesTracked,
		"bpf_errors": counterDeltas(prev.bpf, cur.bpf, func(name string) bool { return strings.HasPrefix(name, "err_") }),
		"drops": nonZero(map[string]uint64{
			"reporter_samples":    d(prev.rep.SamplesDropped, cur.rep.SamplesDropped),
			"heap_profiles":       d(prev.rep.HeapProfilesDropped, cur.rep.HeapProfilesDropped),
			"export_requests":     d(prev.rep.RequestsDropped, cur.rep.RequestsDropped),
			"correlation_samples": d(prev.corr.SamplesDropped, cur.corr.SamplesDropped),
			"undecodable_events":  d(prev.malformed, cur.malformed),
			"queue_full_traces":   d(prev.queue.TracesDropped, cur.queue.TracesDropped),
			"queue_full_events":   d(prev.queue.EventsDropped, cur.queue.EventsDropped),
			"conversion_errors":   d(prev.handler.ConversionErrors, cur.handler.ConversionErrors),
			"mappings_queue_full": d(prev.handler.DeltaMappingsDropped, cur.handler.DeltaMappingsDropped),
			"web_history_samples": d(prev.web.DroppedSamples, cur.web.DroppedSamples),
		}),
		"maps":    fillSummary(fills),
		"rss_mib": rssMiB(),
	}
	if sampling != "" {
		f["sampling"] = sampling
	}
	if w := cur.web; w.MaxBytes > 0 {
		f["web_history"] = fmt.Sprintf("%.1f/%d MiB, %v", float64(w.Bytes)/(1<<20), w.MaxBytes>>20,
			w.End.Sub(w.Start).Round(time.Second))
	}
	if pe := processErrors(prev.handler, cur.handler); pe != "none" {
		f["process_errors"] = pe
	}
	if sp := spoolStatus(prev.rep, cur.rep); sp != "" {
		f["spool"] = sp
	}
	if off := offCPUStatus(prev, cur); off != "" {
		f["off_cpu"] = off
	}
	if gh := goHeapStatus(prev.heaps, cur.heaps); gh != "" {
		f["go_heap"] = gh
	}
	// Mappings of processes over the per-process bound, handed to the
	// unwinder only when sampled: not lost, but worth knowing.
	if n := d(prev.handler.DeltaMappingsDeferred, cur.handler.DeltaMappingsDeferred); n > 0 {
		f["mappings_deferred"] = fmt.Sprintf("%d (processes over %d executable mappings: loaded when sampled)",
			n, processmanager.MaxEagerMappings)
	}
	// Traces that waited for their process's set-up on the lifecycle
	// goroutine, and how often the pump waited for room there.
	if lc, plc := cur.handler.Lifecycle, prev.handler.Lifecycle; lc.TracesQueued > plc.TracesQueued || lc.Queue > 0 {
		f["lifecycle"] = fmt.Sprintf("traces_waited=%d queue=%d full_waits=%d",
			lc.TracesQueued-plc.TracesQueued, lc.Queue, lc.QueueFullWaits-plc.QueueFullWaits)
	}
	// Symbol names shown mangled because they did not demangle.
	if n := d(prev.handler.DemangleFailures, cur.handler.DemangleFailures); n > 0 {
		f["demangle_failures"] = n
	}
	// Native frames of the traces converted in the interval: the share
	// named, demangled and with a line, and the inlined frames added.
	if n := d(prev.handler.Native.Frames, cur.handler.Native.Frames); n > 0 {
		pct := func(prev, cur uint64) string { return fmt.Sprintf("%.1f%%", 100*float64(cur-prev)/float64(n)) }
		p, c := prev.handler.Native, cur.handler.Native
		f["native_frames"] = fmt.Sprintf("converted=%d named=%s demangled=%s lines=%s inlined=+%d",
			n, pct(p.Named, c.Named), pct(p.Demangled, c.Demangled), pct(p.WithLine, c.WithLine), c.Inlined-p.Inlined)
	}
	// Debug information: files opened for lines, what it holds, and
	// what could not be read.
	if cur.handler.DebugInfoBytesHeld > 0 || cur.handler.DebugFileErrors > 0 {
		f["debuginfo"] = fmt.Sprintf("files=%d held_mib=%.1f missing=%d errors=%d evicted=%d",
			sumValues(cur.handler.DebugFilesOpened), float64(cur.handler.DebugInfoBytesHeld)/(1<<20),
			cur.handler.DebugFilesMissing, cur.handler.DebugFileErrors, cur.handler.DebugFilesEvicted)
	}
	return f
}

// processErrors counts what processes' own data made the daemon give up
// on (hostile or damaged processes): runtimes' tables that did not read,
// runtime frames that did not name, processes a runtime refused for good
// (by reason), re-reads of a process's maps skipped for coming too often.
func processErrors(prev, cur processmanager.Stats) string {
	counts := map[string]uint64{
		"runtime_tables":       cur.InterpreterErrors - prev.InterpreterErrors,
		"runtime_frames":       cur.RuntimeFrameErrors - prev.RuntimeFrameErrors,
		"maps_rereads_limited": cur.MapsRereadsLimited - prev.MapsRereadsLimited,
	}
	for k, v := range cur.RuntimeRefusals {
		counts["refused_"+k] = v - prev.RuntimeRefusals[k]
	}
	return nonZero(counts)
}

// spoolStatus says what the spool holds and did in the interval, once it
// was used: requests written, replayed, merged while waiting, dropped at
// its bound, damaged (torn), failed writes; "" while unused.
func spoolStatus(prev, cur reporter.Stats) string {
	p, c := prev.Spool, cur.Spool
	if c.Appended == 0 && c.Records == 0 && c.Torn == 0 && c.WriteErrors == 0 && cur.IntervalsMerged == 0 {
		return ""
	}
	return fmt.Sprintf("held=%d (%.1f MiB) written=%d replayed=%d merged=%d dropped=%d torn=%d write_errors=%d",
		c.Records, float64(c.Bytes)/(1<<20), c.Appended-p.Appended, cur.RequestsReplayed-prev.RequestsReplayed,
		cur.IntervalsMerged-prev.IntervalsMerged, c.Dropped-p.Dropped, c.Torn-p.Torn, c.WriteErrors-p.WriteErrors)
}

// offCPUStatus says what became of the interval's context switches when
// off-CPU profiling is on: switch-outs to wait, those unwound, those left
// out by the threshold and the per-CPU budget, waits reported, waits under
// the minimum, and waits lost (their end dropped for a full ring buffer,
// or their trace not held); "" when off.
func offCPUStatus(prev, cur snapshot) string {
	d := func(name string) uint64 { return cur.bpf[name] - prev.bpf[name] }
	if _, on := cur.bpf["off_cpu_switches"]; !on || d("off_cpu_switches") == 0 {
		return ""
	}
	lost := d("err_off_cpu_end_dropped") + cur.offCPUUnmatched - prev.offCPUUnmatched
	ends := d("off_cpu_ends")
	return fmt.Sprintf("waits=%d traced=%d sampled_out=%d over_budget=%d reported=%d short=%d lost=%d",
		d("off_cpu_switches"), d("off_cpu_traces"), d("off_cpu_sampled_out"), d("off_cpu_over_budget"),
		ends-min(lost, ends), d("off_cpu_short"), lost)
}

func sumValues(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// counterDeltas lists the counters that grew, "name=+n" joined by commas,
// or "none".
func counterDeltas(prev, cur map[string]uint64, include func(string) bool) string {
	grew := map[string]uint64{}
	for name, v := range cur {
		if include(name) {
			grew[name] = v - prev[name]
		}
	}
	return nonZero(grew)
}

func nonZero(counts map[string]uint64) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[name]; n > 0 {
			parts = append(parts, name+"=+"+strconv.FormatUint(n, 10))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

func fillSummary(fills []mapFill) string {
	parts := make([]string, 0, len(fills))
	for _, f := range fills {
		parts = append(parts, fmt.Sprintf("%s=%.1f%%", f.name, 100*f.ratio()))
	}
	return strings.Join(parts, ",")
}

// rssMiB is the daemon's resident memory in MiB, -1 when unreadable.
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return -1
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return -1
	}
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return -1
	}
	mib := float64(pages) * float64(os.Getpagesize()) / (1 << 20)
	return float64(int(mib*10)) / 10
}

// summary logs what the whole run did, once at exit.
func (m *monitor) summary() {
	hs, rs := m.last.handler, m.last.rep
	log.WithFields(log.Fields{
		"bpf_samples":               m.last.bpf["samples"],
		"bpf_idle_samples":          m.last.bpf["idle_samples"],
		"bpf_traces_sent":           m.last.bpf["traces_sent"],
		"bpf_traces_lost":           m.last.bpf["err_trace_dropped"],
		"bpf_process_events_lost":   m.last.bpf["err_process_event_dropped"],
		"queue_traces_lost":         m.last.queue.TracesDropped,
		"queue_process_events_lost": m.last.queue.EventsDropped,
		"event_queue_peak_kib":      m.last.queue.PeakBytes >> 10,
		"lifecycle_traces_waited":   hs.Lifecycle.TracesQueued,
		"lifecycle_peak_traces":     hs.Lifecycle.QueuedTracesPeak,
		"delta_mappings_dropped":    hs.DeltaMappingsDropped,
		"traces_received":           hs.TracesReceived,
		"samples_reported":          rs.SamplesReceived - rs.SamplesDropped,
		"samples_exported":          rs.SamplesExported,
		"samples_lost_in_spool":     rs.Spool.DroppedSamples,
		"processes":                 hs.ProcessesSeen,
		"delta_files":               hs.DeltasResident.Files,
		"deltas":                    hs.DeltasResident.Deltas,
		"delta_mappings":            hs.DeltasResident.Mappings,
		"requests_dropped":          rs.RequestsDropped,
		"requests_spooled":          rs.Spool.Appended,
		"requests_replayed":         rs.RequestsReplayed,
		"spool_held":                rs.Spool.Records,
		"delta_cache_hits":          hs.DeltaCache.Hits,
	}).Info("Stopped")
	if hs.GoPrograms+hs.ProcessContexts+hs.ThreadContexts+hs.ContainersNamed+hs.CRIErrors > 0 {
		log.WithFields(log.Fields{
			"go_programs":            hs.GoPrograms,
			"go_labelled_samples":    m.last.bpf["go_labels"],
			"go_labels_cut":          m.last.bpf["go_labels_cut"],
			"process_contexts":       hs.ProcessContexts,
			"process_context_errors": hs.ProcessContextErrors,
			"thread_contexts":        hs.ThreadContexts,
			"span_samples":           m.last.bpf["span_contexts"],
			"unknown_attribute_keys": hs.UnknownAttributeKeys,
			"containers_named":       hs.ContainersNamed,
			"cri_errors":             hs.CRIErrors,
		}).Info("Attribution")
	}
	if cs := m.last.corr; cs.Registrations > 0 || cs.SamplesDropped > 0 || refusals(cs) > 0 {
		log.WithFields(log.Fields{
			"registrations":           cs.Registrations,
			"correlation_messages":    cs.Messages,
			"correlated_samples":      cs.SamplesSent,
			"correlation_deferred":    cs.Deferred,
			"correlation_dropped":     cs.SamplesDropped,
			"apm_sockets_refused":     refusals(cs),
			"correlation_send_errors": cs.SendErrors,
		}).Info("APM correlation")
	}
}

// refusals is how many APM socket paths were refused, for any reason.
func refusals(s tracecorr.Stats) uint64 {
	var n uint64
	for _, r := range s.Refused {
		n += r
	}
	return n
}

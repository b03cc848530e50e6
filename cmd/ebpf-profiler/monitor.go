package main

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracecorr"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// monitor watches the counters of every stage: it warns when samples are
// being lost and frees the state of processes that exited unnoticed.
type monitor struct {
	tr      *tracer.Tracer
	handler *processmanager.Handler
	pm      *processmanager.Manager
	rep     *reporter.Reporter
	corr    *tracecorr.Correlator
	last    map[string]uint64
	// refused is the correlator's count of refused APM sockets at the last
	// check.
	refused uint64
	// malformed is the tracer's count of undecodable events at the last
	// check.
	malformed uint64
	// lastKsymsReload is when kernel symbols were last read.
	lastKsymsReload time.Time
}

// ksymsReloadInterval is how often kernel symbols are read again, so that
// modules and BPF programs loaded since are symbolized. Reading them costs
// tens of milliseconds.
const ksymsReloadInterval = 10 * time.Minute

func newMonitor(tr *tracer.Tracer, h *processmanager.Handler, pm *processmanager.Manager,
	rep *reporter.Reporter, corr *tracecorr.Correlator) *monitor {
	return &monitor{tr: tr, handler: h, pm: pm, rep: rep, corr: corr, last: map[string]uint64{},
		lastKsymsReload: time.Now()}
}

// lossCounters are the BPF counters that mean samples were lost.
var lossCounters = []string{"err_trace_dropped", "err_process_event_dropped", "err_record_lookup", "err_tail_call"}

func (m *monitor) check() {
	m.pm.Sweep()
	if time.Since(m.lastKsymsReload) >= ksymsReloadInterval {
		m.pm.ReloadKernelSymbols()
		m.lastKsymsReload = time.Now()
	}
	if n := m.tr.MalformedEvents(); n > m.malformed {
		log.Warnf("%d BPF events did not decode (BPF object and daemon out of step?)", n-m.malformed)
		m.malformed = n
	}
	counters, err := m.tr.Metrics()
	if err != nil {
		log.Warnf("Reading BPF counters: %v", err)
		return
	}
	for _, name := range lossCounters {
		if d := counters[name] - m.last[name]; d > 0 {
			log.Warnf("BPF counter %s grew by %d: samples are being lost", name, d)
		}
	}
	if log.IsLevelEnabled(log.DebugLevel) {
		var b strings.Builder
		for _, name := range slices.Sorted(maps.Keys(counters)) {
			if d := counters[name] - m.last[name]; d > 0 {
				b.WriteString(" " + name + "=+" + strconv.FormatUint(d, 10))
			}
		}
		log.Debugf("BPF counters:%s", b.String())
		log.Debugf("Trace handling: %+v", m.handler.Stats())
		log.Debugf("Reporter: %+v", m.rep.Stats())
		log.Debugf("APM correlation: %+v", m.corr.Stats())
	}
	m.last = counters
}

// summary logs what the whole run did, once at exit.
func (m *monitor) summary() {
	hs := m.handler.Stats()
	rs := m.rep.Stats()
	log.WithFields(log.Fields{
		"bpf_samples":      m.last["samples"],
		"bpf_idle_samples": m.last["idle_samples"],
		"bpf_traces_sent":  m.last["traces_sent"],
		"bpf_traces_lost":  m.last["err_trace_dropped"],
		"traces_received":  hs.TracesReceived,
		"samples_exported": rs.SamplesExported,
		"processes":        hs.ProcessesSeen,
		"delta_files":      hs.DeltasResident.Files,
		"deltas":           hs.DeltasResident.Deltas,
		"delta_mappings":   hs.DeltasResident.Mappings,
		"requests_dropped": rs.RequestsDropped,
	}).Info("Stopped")
	if cs := m.corr.Stats(); cs.Registrations > 0 || cs.SamplesDropped > 0 || refusals(cs) > 0 {
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

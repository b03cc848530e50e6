package main

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// monitor watches the counters of every stage: it warns when samples are
// being lost and frees the state of processes that exited unnoticed.
type monitor struct {
	tr      *tracer.Tracer
	handler *processmanager.Handler
	pm      *processmanager.Manager
	rep     *reporter.Reporter
	last    map[string]uint64
}

func newMonitor(tr *tracer.Tracer, h *processmanager.Handler, pm *processmanager.Manager,
	rep *reporter.Reporter) *monitor {
	return &monitor{tr: tr, handler: h, pm: pm, rep: rep, last: map[string]uint64{}}
}

// lossCounters are the BPF counters that mean samples were lost.
var lossCounters = []string{"err_trace_dropped", "err_process_event_dropped", "err_record_lookup", "err_tail_call"}

func (m *monitor) check() {
	m.pm.Sweep()
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
		"requests_dropped": rs.RequestsDropped,
	}).Info("Stopped")
}

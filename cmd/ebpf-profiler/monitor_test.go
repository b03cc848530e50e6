package main

import (
	"testing"
	"time"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

func TestStatusFields(t *testing.T) {
	prev := snapshot{
		bpf:       map[string]uint64{"samples": 100, "traces_sent": 90, "err_no_mapping": 5, "err_trace_dropped": 1},
		malformed: 1,
		handler:   processmanager.Stats{TracesReceived: 90},
		rep:       reporter.Stats{SamplesReceived: 90, SamplesExported: 80, ExportErrors: 2, SamplesDropped: 1},
		corr:      tracecorr.Stats{SamplesDropped: 3},
	}
	cur := snapshot{
		bpf: map[string]uint64{"samples": 300, "traces_sent": 280, "err_no_mapping": 12, "err_trace_dropped": 1,
			"err_tail_call": 4, "python_frames": 50},
		malformed: 1,
		handler: processmanager.Stats{TracesReceived: 279, ProcessesTracked: 17, ConversionErrors: 2,
			DeltasResident: unwindmaps.DeltaResidency{Deltas: 1000}},
		rep:  reporter.Stats{SamplesReceived: 279, SamplesExported: 260, ExportErrors: 3, SamplesDropped: 1, RequestsDropped: 1},
		corr: tracecorr.Stats{SamplesDropped: 3},
	}
	fills := []mapFill{{name: "stack_deltas", used: 1000, capacity: 4000}, {name: "python_procs", used: 0, capacity: 4096}}
	got := statusFields(prev, cur, fills, "off")
	want := log.Fields{
		"samples":         uint64(200),
		"traces_sent":     uint64(190),
		"traces_received": uint64(189),
		"reported":        uint64(189),
		"exported":        uint64(180),
		"export_errors":   uint64(1),
		"processes":       17,
		"bpf_errors":      "err_no_mapping=+7,err_tail_call=+4",
		"drops":           "conversion_errors=+2,export_requests=+1",
		"maps":            "stack_deltas=25.0%,python_procs=0.0%",
		"sampling":        "off",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v (%T), want %v (%T)", k, got[k], got[k], v, v)
		}
	}
	if _, ok := got["rss_mib"].(float64); !ok {
		t.Errorf("rss_mib = %v, want a number", got["rss_mib"])
	}
	if len(got) != len(want)+1 {
		t.Errorf("fields %v, want those of %v and rss_mib", got, want)
	}
	// With the web view: its history's size and span, and what it dropped.
	cur.web = reporter.HistoryStats{Bytes: 3 << 19, MaxBytes: 64 << 20, Start: time.Unix(100, 0), End: time.Unix(400, 0),
		DroppedSamples: 7}
	got = statusFields(prev, cur, fills, "")
	if got["web_history"] != "1.5/64 MiB, 5m0s" || got["drops"] != "conversion_errors=+2,export_requests=+1,web_history_samples=+7" {
		t.Errorf("web history fields: %v, %v", got["web_history"], got["drops"])
	}
	// Nothing happened: every count is zero, and errors and drops say none.
	quiet := statusFields(cur, cur, nil, "")
	if quiet["bpf_errors"] != "none" || quiet["drops"] != "none" || quiet["samples"] != uint64(0) {
		t.Errorf("quiet interval: %v", quiet)
	}
	if _, ok := quiet["sampling"]; ok {
		t.Error("sampling state logged without probabilistic profiling")
	}
}

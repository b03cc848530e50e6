package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/testagent/applog"
)

// apmStampSlack allows for the time between a sample's timestamp and the
// application's clock readings around set_trace: wider than the e2e
// test's 2 ms, as this test also runs under emulation.
const apmStampSlack = uint64(5 * time.Millisecond)

// TestAPMTraceContext runs the test agent's application: two threads
// alternate between 100 ms outside any trace and 400 ms in a transaction,
// published in the agent's thread-local record. BPF reads that record
// through the thread pointer (fsbase on x86_64, tp_value on arm64) at the
// offset the process manager resolved from the agent's TLSDESC
// relocation, so every sample must carry the transaction its thread was
// in, and none outside one.
func TestAPMTraceContext(t *testing.T) {
	requireRoot(t)
	agent, app := buildTestAgent(t)
	s := startSession(t, testHz)
	// 5 s: on one emulated vCPU (the amd64 kernel matrix) the agent's
	// record is found 1.5-2.5 s in, and 3 s left 31 samples in a
	// transaction after it.
	cmd := exec.Command(app, agent, filepath.Join(t.TempDir(), "apm.sock"), "5")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", app, err)
	}
	s.stop(t)
	l, err := applog.Parse(string(out))
	if err != nil {
		t.Fatal(err)
	}
	samples := s.rec.ofPID(cmd.Process.Pid)

	bySpan := map[[8]byte]*applog.Tx{}
	for i := range l.Txs {
		bySpan[l.Txs[i].SpanID] = &l.Txs[i]
	}
	var firstLinked time.Time
	linkedThreads := map[int]bool{}
	for _, smp := range samples {
		at, tid, apm := uint64(smp.meta.Time.UnixNano()), int(smp.meta.TID), smp.meta.APM
		for _, w := range l.Idles {
			if w.Inside(tid, at, apmStampSlack) && apm.Valid {
				t.Errorf("sample of thread %d at %d, outside any trace, carries span %x", tid, at, apm.SpanID)
			}
		}
		if !apm.Valid {
			continue
		}
		// The thread leaves a transaction only when it clears the record
		// after printing its window (slow under emulation): a sample
		// after a window's end may still carry it, but not one in a
		// later window.
		w := bySpan[apm.SpanID]
		switch {
		case w == nil || w.TraceID != apm.TraceID || w.TransactionID != apm.TransactionID:
			t.Errorf("sample carries an unknown trace %x/%x/%x", apm.TraceID, apm.TransactionID, apm.SpanID)
		case w.TID != tid || at+apmStampSlack < w.Start:
			t.Errorf("sample of thread %d at %d carries the transaction of thread %d from %d",
				tid, at, w.TID, w.Start)
		}
		for _, o := range l.Txs {
			if o.SpanID != apm.SpanID && o.Inside(tid, at, apmStampSlack) {
				t.Errorf("sample of thread %d at %d inside transaction %x carries %x", tid, at, o.SpanID, apm.SpanID)
			}
		}
		if firstLinked.IsZero() {
			firstLinked = smp.meta.Time
		}
		linkedThreads[tid] = true
	}
	if firstLinked.IsZero() {
		t.Fatalf("none of %d samples carries a trace context (%d transactions)", len(samples), len(l.Txs))
	}

	// From the first sample with a context on (before, the process manager
	// had not yet found the agent), every sample inside a transaction has
	// it.
	inTx, linked := 0, 0
	for _, smp := range samples {
		if smp.meta.Time.Before(firstLinked) {
			continue
		}
		at, tid := uint64(smp.meta.Time.UnixNano()), int(smp.meta.TID)
		for _, w := range l.Txs {
			if w.Inside(tid, at, apmStampSlack) {
				inTx++
				if smp.meta.APM.Valid {
					linked++
				}
				break
			}
		}
	}
	t.Logf("%d samples; the first with a trace context %v after the agent was loaded; "+
		"then %d of %d samples inside a transaction carry it; threads with one: %d",
		len(samples), time.Duration(uint64(firstLinked.UnixNano())-l.Loaded), linked, inTx, len(linkedThreads))
	if inTx < testHz/2 || float64(linked) < 0.95*float64(inTx) {
		t.Errorf("%d of %d samples inside a transaction carry its context, want >= 95%% of at least %d",
			linked, inTx, testHz/2)
	}
	if len(linkedThreads) != 2 {
		t.Errorf("samples of %d threads carry a trace context, want both workers", len(linkedThreads))
	}
}

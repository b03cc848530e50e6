package tracer

import (
	"bytes"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/support"
)

// TestOffCPUPending: a wait's end takes the trace its thread left the CPU
// with, once; an end whose start does not match (the trace was dropped or
// replaced) is counted and takes nothing.
func TestOffCPUPending(t *testing.T) {
	p := newOffCPUPending()
	raw := []byte("trace of 7")
	p.hold(&support.Trace{TID: 7, KTime: 100}, raw)
	raw[0] = 'X' // the ring buffer's memory is reused: the hold kept a copy
	// A newer switch-out of thread 8 replaces its older one.
	p.hold(&support.Trace{TID: 8, KTime: 200}, []byte("old"))
	p.hold(&support.Trace{TID: 8, KTime: 300}, []byte("new"))

	end := func(tid uint32, start uint64) support.Event {
		return support.Event{Kind: support.EventOffCPUEnd, TID: tid, Start: start, Duration: time.Millisecond}
	}
	if got, ok := p.take(end(7, 100), true); !ok || !bytes.Equal(got, []byte("trace of 7")) {
		t.Errorf("end of 7: %q %v", got, ok)
	}
	if _, ok := p.take(end(7, 100), true); ok {
		t.Error("a trace was taken twice")
	}
	if _, ok := p.take(end(8, 200), true); ok {
		t.Error("the end of a replaced wait took the newer trace")
	}
	if _, ok := p.take(end(9, 1), false); ok {
		t.Error("a trace never held was taken")
	}
	if got, ok := p.take(end(8, 300), true); !ok || string(got) != "new" {
		t.Errorf("end of 8: %q %v", got, ok)
	}
	if n := p.unmatched.Load(); n != 2 || p.Len() != 0 {
		t.Errorf("%d unmatched, %d held; want 2 and 0", n, p.Len())
	}
}

func TestOffCPUConfig(t *testing.T) {
	for _, c := range []struct {
		cfg OffCPUConfig
		ok  bool
	}{
		{OffCPUConfig{}, true},
		{OffCPUConfig{Threshold: 1, MinWait: time.Millisecond}, true},
		{OffCPUConfig{Threshold: 1.5}, false},
		{OffCPUConfig{Threshold: -0.1}, false},
		{OffCPUConfig{Threshold: 0.5, MinWait: -time.Second}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
}

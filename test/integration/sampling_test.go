package integration

import (
	"runtime"
	"testing"
	"time"
)

// TestSamplingSwitch turns sampling off and on again, as probabilistic
// profiling does: off, the perf events run no BPF at all.
func TestSamplingSwitch(t *testing.T) {
	requireRoot(t)
	s := startSession(t, testHz)
	// Keep a CPU busy: cpu-clock events of an idle CPU rarely fire.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	samples := func() uint64 {
		t.Helper()
		m, err := s.tr.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		return m["samples"]
	}
	samplesIn := func(d time.Duration) uint64 {
		t.Helper()
		before := samples()
		time.Sleep(d)
		return samples() - before
	}
	on := samplesIn(time.Second)
	t.Logf("%d samples in 1 s with sampling on (%d CPUs at %d Hz)", on, runtime.NumCPU(), testHz)
	if on == 0 {
		t.Fatal("no samples while sampling is on")
	}
	if err := s.tr.SetSampling(false); err != nil {
		t.Fatal(err)
	}
	if n := samplesIn(time.Second); n != 0 {
		t.Errorf("%d samples in 1 s with sampling off", n)
	}
	if err := s.tr.SetSampling(true); err != nil {
		t.Fatal(err)
	}
	n := samplesIn(time.Second)
	t.Logf("%d samples in 1 s after sampling was turned back on", n)
	if n == 0 {
		t.Error("no samples after sampling was turned back on")
	}
}

package processmanager

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	now := time.Unix(100, 0)
	b := newBackoff(50*time.Millisecond, 300*time.Millisecond)
	if !b.ready(now) {
		t.Fatal("a new backoff is not ready")
	}
	var waits []time.Duration
	for range 5 {
		waits = append(waits, b.failed(now))
	}
	want := []time.Duration{50, 100, 200, 300, 300}
	for i := range want {
		if waits[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", waits, want)
		}
	}
	if b.ready(now.Add(299*time.Millisecond)) || !b.ready(now.Add(300*time.Millisecond)) {
		t.Error("ready before the wait is over, or not after")
	}
	b.reset()
	if !b.ready(now) {
		t.Error("not ready after reset")
	}
}

package libpf

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	now := time.Unix(100, 0)
	b := NewBackoff(50*time.Millisecond, 300*time.Millisecond)
	if !b.Ready(now) {
		t.Fatal("a new backoff is not ready")
	}
	var waits []time.Duration
	for range 5 {
		waits = append(waits, b.Failed(now))
	}
	want := []time.Duration{50, 100, 200, 300, 300}
	for i := range want {
		if waits[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", waits, want)
		}
	}
	if b.Ready(now.Add(299*time.Millisecond)) || !b.Ready(now.Add(300*time.Millisecond)) {
		t.Error("ready before the wait is over, or not after")
	}
	b.Reset()
	if !b.Ready(now) {
		t.Error("not ready after reset")
	}
}

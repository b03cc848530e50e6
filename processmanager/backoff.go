package processmanager

import "time"

// backoff paces the retries of something a process publishes late (its
// interpreter, its APM agent): after each failure the wait doubles, from
// first up to last; news that may make the next try succeed (new
// mappings) resets it.
type backoff struct {
	first, last time.Duration
	wait        time.Duration
	next        time.Time
}

func newBackoff(first, last time.Duration) backoff { return backoff{first: first, last: last} }

// ready says whether a try is due at now.
func (b *backoff) ready(now time.Time) bool { return !now.Before(b.next) }

// failed schedules the next try after a failure at now and returns the wait.
func (b *backoff) failed(now time.Time) time.Duration {
	b.wait = min(max(2*b.wait, b.first), b.last)
	b.next = now.Add(b.wait)
	return b.wait
}

// reset makes the next try due at once.
func (b *backoff) reset() { b.next = time.Time{} }

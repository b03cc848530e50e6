package libpf

import "time"

// Backoff paces the retries of something a process publishes late (its
// interpreter, its APM agent, its socket): after each failure the wait
// doubles, from first up to last; news that may make the next try succeed
// (new mappings) resets it.
type Backoff struct {
	first, last time.Duration
	wait        time.Duration
	next        time.Time
}

// NewBackoff returns a Backoff whose first try is due at once.
func NewBackoff(first, last time.Duration) Backoff { return Backoff{first: first, last: last} }

// Ready says whether a try is due at now.
func (b *Backoff) Ready(now time.Time) bool { return !now.Before(b.next) }

// Failed schedules the next try after a failure at now and returns the wait.
func (b *Backoff) Failed(now time.Time) time.Duration {
	b.wait = min(max(2*b.wait, b.first), b.last)
	b.next = now.Add(b.wait)
	return b.wait
}

// Again schedules the next try after first, without backing off: the
// failure says the next try will soon succeed.
func (b *Backoff) Again(now time.Time) time.Duration {
	b.next = now.Add(b.first)
	return b.first
}

// Reset makes the next try due at once.
func (b *Backoff) Reset() { b.next = time.Time{} }

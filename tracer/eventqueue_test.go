package tracer

import (
	"bytes"
	"sync"
	"testing"
)

func TestEventQueueOrderAndBounds(t *testing.T) {
	q := newEventQueue(8 * 100)
	rec := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 100) }
	for i := range 10 {
		q.push(rec(i), true)
	}
	// Eight traces fit; the ninth and tenth are dropped.
	if got := q.tracesDropped.Load(); got != 2 {
		t.Errorf("%d traces dropped, want 2", got)
	}
	// A process event still fits in the reserve (an eighth: 100 bytes),
	// a second does not.
	q.push(rec(20), false)
	q.push(rec(21), false)
	if got := q.eventsDropped.Load(); got != 1 {
		t.Errorf("%d process events dropped, want 1", got)
	}
	if got := q.peakBytes.Load(); got != 900 {
		t.Errorf("peak %d bytes, want 900", got)
	}
	q.close()
	var got []byte
	for {
		raw, ok := q.pop()
		if !ok {
			break
		}
		got = append(got, raw[0])
		q.release(raw)
	}
	if want := []byte{0, 1, 2, 3, 4, 5, 6, 7, 20}; !bytes.Equal(got, want) {
		t.Errorf("popped %v, want %v", got, want)
	}
	if q.bytes != 0 {
		t.Errorf("%d bytes left in an empty queue", q.bytes)
	}
}

// The consumer gets every record a concurrent producer queued, in order,
// with buffers reused, and returns once the queue is closed.
func TestEventQueueConcurrent(t *testing.T) {
	q := newEventQueue(1 << 20)
	const n = 100000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			q.push([]byte{byte(i), byte(i >> 8), byte(i >> 16)}, i%7 != 0)
		}
		q.close()
	}()
	next := 0
	for {
		raw, ok := q.pop()
		if !ok {
			break
		}
		if i := int(raw[0]) | int(raw[1])<<8 | int(raw[2])<<16; i != next {
			t.Fatalf("record %d came as %d", i, next)
		}
		next++
		q.release(raw)
	}
	wg.Wait()
	if next+int(q.tracesDropped.Load()+q.eventsDropped.Load()) != n || q.tracesDropped.Load() != 0 {
		t.Errorf("%d popped, %d dropped of %d", next, q.tracesDropped.Load()+q.eventsDropped.Load(), n)
	}
}

func TestEventQueueBytes(t *testing.T) {
	for _, c := range []struct{ cpus, hz, want int }{
		{2, 20, minEventQueueBytes},
		{4, 100, 4 * 100 * queueSeconds * bytesPerTrace},
		{256, 100, maxEventQueueBytes},
	} {
		if got := eventQueueBytes(c.cpus, c.hz); got != c.want {
			t.Errorf("%d CPUs at %d Hz: %d bytes, want %d", c.cpus, c.hz, got, c.want)
		}
	}
}

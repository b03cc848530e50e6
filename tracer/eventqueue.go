package tracer

import (
	"sync"
	"sync/atomic"
)

// The ring buffer holds about half a second of events, and what the Handler
// does with an event may take longer: setting a new process up reads its
// files (a runtime's 100 MB binary, a large library's tables), and a
// daemon starting on a busy host meets dozens at once. So the reader only
// copies records out of the ring buffer into an eventQueue, and another
// goroutine hands them to the Handler: the ring buffer is drained while the
// Handler works, and what the Handler is behind on waits in the daemon's
// memory, bounded.

// Bounds of the event queue: about queueSeconds of traces at the
// configured rate.
const (
	queueSeconds       = 20
	minEventQueueBytes = 4 << 20
	maxEventQueueBytes = 64 << 20
)

func eventQueueBytes(cpus, hz int) int {
	return min(max(cpus*hz*queueSeconds*bytesPerTrace, minEventQueueBytes), maxEventQueueBytes)
}

// eventQueue is a FIFO of ring buffer records, bounded in bytes. A full
// queue drops traces (counted); process events, small and each needed to
// keep a process's state right, may use a reserve of an eighth more.
type eventQueue struct {
	mu      sync.Mutex
	records [][]byte
	head    int
	bytes   int
	closed  bool
	// ready has a token while records are queued or the queue is closed.
	ready chan struct{}
	// free are buffers of records handed back (release), for reuse.
	free [][]byte

	maxBytes                     int
	tracesDropped, eventsDropped atomic.Uint64
	peakBytes                    atomic.Int64
}

// maxFreeBuffers bounds the buffers kept for reuse.
const maxFreeBuffers = 256

func newEventQueue(maxBytes int) *eventQueue {
	return &eventQueue{maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

// push queues a copy of raw, or drops it if the queue is full; isTrace says
// which kind it is.
func (q *eventQueue) push(raw []byte, isTrace bool) {
	q.mu.Lock()
	limit := q.maxBytes
	if !isTrace {
		limit += q.maxBytes / 8
	}
	if q.bytes+len(raw) > limit {
		q.mu.Unlock()
		if isTrace {
			q.tracesDropped.Add(1)
		} else {
			q.eventsDropped.Add(1)
		}
		return
	}
	var buf []byte
	if n := len(q.free); n > 0 && cap(q.free[n-1]) >= len(raw) {
		buf, q.free = q.free[n-1][:len(raw)], q.free[:n-1]
	} else {
		buf = make([]byte, len(raw), max(len(raw), 1024))
	}
	copy(buf, raw)
	q.records = append(q.records, buf)
	q.bytes += len(raw)
	if int64(q.bytes) > q.peakBytes.Load() {
		q.peakBytes.Store(int64(q.bytes))
	}
	q.mu.Unlock()
	q.signal()
}

func (q *eventQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop returns the oldest record, waiting for one; ok is false once the
// queue is closed and empty. Hand the record back with release.
func (q *eventQueue) pop() (raw []byte, ok bool) {
	for {
		q.mu.Lock()
		if q.head < len(q.records) {
			raw = q.records[q.head]
			q.records[q.head] = nil
			q.head++
			q.bytes -= len(raw)
			switch {
			case q.head == len(q.records) && cap(q.records) > 4096:
				q.records, q.head = nil, 0 // let a burst's array go
			case q.head == len(q.records):
				q.records, q.head = q.records[:0], 0
			case q.head > 1024 && q.head*2 > len(q.records):
				// Keep the backing array from growing without end
				// while the queue never empties.
				n := copy(q.records, q.records[q.head:])
				clear(q.records[n:])
				q.records, q.head = q.records[:n], 0
			}
			q.mu.Unlock()
			return raw, true
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return nil, false
		}
		<-q.ready
	}
}

// release hands a record's buffer back for reuse.
func (q *eventQueue) release(raw []byte) {
	q.mu.Lock()
	if len(q.free) < maxFreeBuffers {
		q.free = append(q.free, raw)
	}
	q.mu.Unlock()
}

// open (re)starts the queue for a Run.
func (q *eventQueue) open() {
	q.mu.Lock()
	q.closed = false
	q.mu.Unlock()
}

// close ends the queue: pop returns what is queued, then !ok.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

// QueueStats is what the event queue did.
type QueueStats struct {
	// TracesDropped and EventsDropped were not queued: it was full.
	TracesDropped, EventsDropped uint64
	// PeakBytes is the most it held.
	PeakBytes int64
}

// QueueStats returns what the event queue did so far.
func (t *Tracer) QueueStats() QueueStats {
	return QueueStats{TracesDropped: t.queue.tracesDropped.Load(), EventsDropped: t.queue.eventsDropped.Load(),
		PeakBytes: t.queue.peakBytes.Load()}
}

package unwindmaps

import (
	"math"
	"sync"
	"time"
)

// Stack deltas are extracted on goroutines of their own, smallest file
// first, while one goroutine (Sync's worker) writes the BPF maps. On
// a cold start libLLVM's million deltas take over a second to extract, and
// a process that only needs a 16 KiB program's deltas would otherwise be
// unwound no further than its leaf until they are done.

// Two lanes extract: one takes any file, the other only files smaller than
// smallFileSize. Small files pass a large one, and large ones are never
// extracted two at a time: on a busy 2-core host two at once took CPU
// from the profiled processes and the event pump (a runtime's JIT code was
// claimed later at its start, more of its first samples unnamed).
const smallFileSize = 4 << 20

// maxExtractWait is how long a file may wait before it goes next whatever
// its size, so that a stream of small files cannot hold a large one back.
const maxExtractWait = time.Second

// extraction is one file whose deltas are to be extracted.
type extraction struct {
	// job is a mapping of the file: its open reads the file.
	job *unwindJob
	// size is the file's size in bytes, which orders the queue.
	size   int64
	queued time.Time
}

// extracted is an extraction's outcome.
type extracted struct {
	x      *extraction
	deltas deltaSeq
	err    error
}

// extractQueue runs extractions on its two lanes' goroutines and sends
// each outcome to results.
type extractQueue struct {
	extract func(*extraction) (deltaSeq, error)
	results chan extracted
	now     func() time.Time

	mu      sync.Mutex
	ready   *sync.Cond
	waiting []*extraction
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newExtractQueue(extract func(*extraction) (deltaSeq, error)) *extractQueue {
	q := &extractQueue{
		extract: extract,
		results: make(chan extracted),
		now:     time.Now,
		stop:    make(chan struct{}),
	}
	q.ready = sync.NewCond(&q.mu)
	q.wg.Add(2)
	go q.work(math.MaxInt64)
	go q.work(smallFileSize)
	return q
}

// push queues an extraction.
func (q *extractQueue) push(x *extraction) {
	q.mu.Lock()
	x.queued = q.now()
	q.waiting = append(q.waiting, x)
	q.mu.Unlock()
	q.ready.Broadcast() // a lane that cannot take it waits on
}

// close stops the workers once their extractions in flight are done; their
// outcomes are not sent.
func (q *extractQueue) close() {
	q.mu.Lock()
	q.stopped = true
	q.mu.Unlock()
	close(q.stop)
	q.ready.Broadcast()
	q.wg.Wait()
}

// work extracts files smaller than maxSize until the queue is closed.
func (q *extractQueue) work(maxSize int64) {
	defer q.wg.Done()
	for {
		x := q.next(maxSize)
		if x == nil {
			return
		}
		d, err := q.extract(x)
		select {
		case q.results <- extracted{x: x, deltas: d, err: err}:
		case <-q.stop:
			return
		}
	}
}

// next waits for an extraction of a file smaller than maxSize and takes
// it off the queue; nil once the queue is closed.
func (q *extractQueue) next(maxSize int64) *extraction {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.stopped {
			return nil
		}
		if i := pickExtraction(q.waiting, q.now(), maxSize); i >= 0 {
			x := q.waiting[i]
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return x
		}
		q.ready.Wait()
	}
}

// pickExtraction is the index of the extraction of a file smaller than
// maxSize to run next, -1 if there is none: the one waiting longest if it
// waited maxExtractWait, else the smallest file (the first queued of equal
// ones).
func pickExtraction(waiting []*extraction, now time.Time, maxSize int64) int {
	best := -1
	for i, x := range waiting {
		if x.size >= maxSize {
			continue
		}
		// Queued in order: the first that waited long enough waited
		// longest.
		if now.Sub(x.queued) >= maxExtractWait {
			return i
		}
		if best < 0 || x.size < waiting[best].size {
			best = i
		}
	}
	return best
}

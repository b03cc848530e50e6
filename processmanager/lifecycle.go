package processmanager

import (
	"sync"
	"sync/atomic"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Process set-up runs on its own goroutine, the lifecycle's, so that the
// goroutine converting traces (the tracer's event pump) never waits on
// /proc, a file or a runtime's tables: a new process's first read may parse
// a 100 MB binary, and a daemon starting on a busy host meets dozens.
//
// The lifecycle takes work in the order the pump hands it over: process
// events (exec, exit, new mappings, unknown PCs) and traces the pump could
// not convert without reading first (a process's first sample, a sample
// that reveals an exec, an address a re-read of the maps may find). It
// applies each event, and sets up and converts each such trace. While a pid
// has work queued, the pump queues that pid's later traces behind it too,
// so a process's samples are converted in order, each with the state the
// events before it made. Work a sample finds due that no trace must wait
// for (a periodic check, a runtime to attach again) is queued once per
// process and done when the lifecycle gets to it.

// maxQueuedTraces bounds the traces waiting for the lifecycle: about two
// seconds of a 2-CPU host at 100 Hz where every sample waits, or the first
// seconds of a large host. The pump waits for room beyond it (counted),
// and the event queue in front of it takes the backlog.
const maxQueuedTraces = 4096

type lifecycleKind uint8

const (
	lifeTrace lifecycleKind = iota
	lifeExec
	lifeExit
	lifeMapped
	lifeUnknownPC
	// lifeRefresh is due work no trace waits for.
	lifeRefresh
)

type lifecycleItem struct {
	kind    lifecycleKind
	pid     uint32
	trace   *support.Trace // lifeTrace: the lifecycle's copy
	program support.FileKey
	mapping support.ExecMapping
	pc      uint64
}

// lifecycle is the queue of process work and the goroutine doing it.
type lifecycle struct {
	mu    sync.Mutex
	items []lifecycleItem
	head  int
	// queued counts, per pid, the items queued that its traces must wait
	// for (all but lifeRefresh).
	queued map[uint32]int
	// anyQueued is the sum of queued, read without the lock: most traces
	// come while nothing waits.
	anyQueued atomic.Int64
	traces    int
	// working is set while an item taken off the queue is being done.
	working bool
	closed  bool
	// changed is signalled when an item is queued or done, or on close.
	changed *sync.Cond

	do   func(*lifecycleItem)
	done chan struct{}

	// counts are the counters stats reports (Queue aside).
	counts LifecycleStats
}

func newLifecycle(do func(*lifecycleItem)) *lifecycle {
	l := &lifecycle{queued: map[uint32]int{}, do: do, done: make(chan struct{})}
	l.changed = sync.NewCond(&l.mu)
	go l.run()
	return l
}

// waits says whether traces of pid must queue behind work queued for it.
func (l *lifecycle) waits(pid uint32) bool {
	if l.anyQueued.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queued[pid] > 0
}

// queueTrace queues a copy of raw, waiting for room while the queue holds
// maxQueuedTraces.
func (l *lifecycle) queueTrace(raw *support.Trace) {
	c := *raw
	c.Frames = append([]support.Frame(nil), raw.Frames...)
	c.KernelStack = append([]uint64(nil), raw.KernelStack...)
	c.Labels = append([]libpf.Label(nil), raw.Labels...)
	c.ContextAttrs = append([]support.ContextAttr(nil), raw.ContextAttrs...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.traces >= maxQueuedTraces && !l.closed {
		l.counts.QueueFullWaits++
		for l.traces >= maxQueuedTraces && !l.closed {
			l.changed.Wait()
		}
	}
	if !l.closed {
		l.traces++
		l.counts.TracesQueued++
		l.counts.QueuedTracesPeak = max(l.counts.QueuedTracesPeak, l.traces)
	}
	l.pushLocked(lifecycleItem{kind: lifeTrace, pid: raw.PID, trace: &c})
}

// queue queues an event or due work.
func (l *lifecycle) queue(it lifecycleItem) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pushLocked(it)
}

// pushLocked queues it; once closed, it is done at once instead (the
// caller holds l.mu, which is let go meanwhile).
func (l *lifecycle) pushLocked(it lifecycleItem) {
	if l.closed {
		l.mu.Unlock()
		l.do(&it)
		l.mu.Lock()
		return
	}
	if it.kind != lifeRefresh {
		l.queued[it.pid]++
		l.anyQueued.Add(1)
	}
	l.items = append(l.items, it)
	l.changed.Broadcast()
}

func (l *lifecycle) run() {
	defer close(l.done)
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for l.head == len(l.items) && !l.closed {
			l.changed.Wait()
		}
		if l.head == len(l.items) {
			return // closed and done
		}
		it := l.items[l.head]
		l.items[l.head] = lifecycleItem{}
		l.head++
		if l.head == len(l.items) {
			l.items, l.head = l.items[:0], 0
		}
		l.working = true
		l.mu.Unlock()
		l.do(&it)
		l.mu.Lock()
		l.working = false
		if it.kind != lifeRefresh {
			if l.queued[it.pid]--; l.queued[it.pid] == 0 {
				delete(l.queued, it.pid)
			}
			l.anyQueued.Add(-1)
		}
		if it.kind == lifeTrace {
			l.traces--
		}
		l.changed.Broadcast()
	}
}

// flush returns once everything queued before it was done.
func (l *lifecycle) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.head < len(l.items) || l.working {
		l.changed.Wait()
	}
}

// close does what is queued and stops the goroutine.
func (l *lifecycle) close() {
	l.mu.Lock()
	l.closed = true
	l.changed.Broadcast()
	l.mu.Unlock()
	<-l.done
}

// LifecycleStats are the lifecycle queue's counters.
type LifecycleStats struct {
	// TracesQueued counts traces converted by the lifecycle after their
	// process was read; QueuedTracesPeak is the most that waited at once,
	// QueueFullWaits how often the pump waited for room.
	TracesQueued     uint64
	QueuedTracesPeak int
	QueueFullWaits   uint64
	// Queue is how many items wait now.
	Queue int
}

func (l *lifecycle) stats() LifecycleStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.counts
	s.Queue = len(l.items) - l.head
	return s
}

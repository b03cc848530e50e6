package processmanager

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// TraceReporter receives every sample. The trace and the process info are
// shared between samples and must not be modified; the meta is the
// reporter's to keep.
type TraceReporter interface {
	ReportSample(*libpf.Trace, *libpf.SampleMeta)
}

// DefaultTraceCacheSize is how many distinct BPF traces a Handler remembers
// when NewHandler is given 0.
const DefaultTraceCacheSize = 16384

// clockResyncInterval is how often, in sample time, the monotonic to wall
// clock offset is measured again, so NTP adjustments reach sample times.
const clockResyncInterval = time.Minute

// Handler converts each distinct BPF trace once and reports every sample.
// Its tracer.Handler methods must be called from one goroutine at a time
// (the tracer's event pump), in the order BPF emitted the events; Stats may
// be called from any goroutine. Traces whose process must be read first,
// and every process event, are handed to the lifecycle goroutine (see
// lifecycle.go); Flush waits for it, Close stops it.
type Handler struct {
	m        *Manager
	reporter TraceReporter
	life     *lifecycle

	// convMu serializes conversions and reports: the pump's, and the
	// lifecycle's of the traces it was handed.
	convMu sync.Mutex
	// cache maps a BPF trace hash to its conversion.
	cache *libpf.LRU[uint64, cachedTrace]

	// monoToWall is added to a CLOCK_MONOTONIC time to get Unix time, in ns;
	// measured at monoSyncedAt (CLOCK_MONOTONIC ns).
	monoToWall   int64
	monoSyncedAt uint64

	received, hits, misses, errors atomic.Uint64
	cacheSize                      atomic.Int64
	// unknownAttrKeys counts thread context attributes whose key index
	// the process's key table lacked.
	unknownAttrKeys atomic.Uint64

	// exited are the processes that exited since the cache was last swept
	// of their traces (lastSweep): a trace's hash covers its pid, so they
	// can never be hit again, and a pre-forking server's workers come and
	// go by the thousand; left to age out, they would fill the cache.
	exitMu    sync.Mutex
	exited    map[uint32]struct{}
	lastSweep time.Time
}

// exitSweepInterval paces the sweeps of exited processes' traces: one pass
// over the cache each.
const exitSweepInterval = time.Second

// traceIdleExpiry: a cached trace not seen for this long is dropped, so that
// the cache holds what the host runs now. Long-lived processes with a long
// tail of distinct stacks (the kernel's, a busy Go server's) otherwise fill
// it over hours: in an hour's soak their frames grew from 3 to 10.5 MiB. A
// trace seen again later is converted again (3.5 µs for 30 frames, see
// docs/overhead.md).
const traceIdleExpiry = 10 * time.Minute

// traceTouchInterval is how stale a cached trace's last use may be before
// a hit writes it again: its time is kept to this precision, not more.
const traceTouchInterval = time.Minute

type cachedTrace struct {
	trace *libpf.Trace
	info  *libpf.ProcessInfo
	pid   uint32
	// gen is the generation of the process state the trace was made with.
	gen uint64
	// usedAt is when it was last stored or hit, to traceTouchInterval.
	usedAt time.Time
	// retryAt, linesSettled: see conversion.
	retryAt      time.Time
	linesSettled uint64
}

// NewHandler returns a Handler that converts traces with m and reports them
// to reporter, caching up to cacheSize conversions (DefaultTraceCacheSize
// when 0).
func NewHandler(m *Manager, reporter TraceReporter, cacheSize int) (*Handler, error) {
	if cacheSize <= 0 {
		cacheSize = DefaultTraceCacheSize
	}
	h := &Handler{m: m, reporter: reporter, cache: libpf.NewLRU[uint64, cachedTrace](cacheSize, 0)}
	if err := h.syncClock(); err != nil {
		return nil, err
	}
	h.life = newLifecycle(h.doLifecycle)
	return h, nil
}

// Flush returns once the lifecycle did everything handed to it so far:
// the traces that waited for their process are reported.
func (h *Handler) Flush() { h.life.flush() }

// Close does what the lifecycle was handed and stops it; what comes after
// is done on the caller's goroutine.
func (h *Handler) Close() { h.life.close() }

// syncClock measures the offset between CLOCK_MONOTONIC, which BPF stamps
// samples with, and the wall clock. Reading the monotonic clock on both sides
// of the wall clock and taking the midpoint halves the error; of a few such
// readings the tightest is kept, since a thread preempted between two reads
// (a busy host, the kernel verifying programs on the other CPU) would be off
// by as long as it waited: 5 ms in an emulated VM, enough to put a sample in
// the wrong APM transaction.
func (h *Handler) syncClock() error {
	best := int64(-1)
	for range clockSyncReadings {
		var mono1, wall, mono2 unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono1); err != nil {
			return fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
		}
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &wall); err != nil {
			return fmt.Errorf("reading CLOCK_REALTIME: %w", err)
		}
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono2); err != nil {
			return fmt.Errorf("reading CLOCK_MONOTONIC: %w", err)
		}
		if gap := mono2.Nano() - mono1.Nano(); best < 0 || gap < best {
			best = gap
			mono := (mono1.Nano() + mono2.Nano()) / 2
			h.monoToWall = wall.Nano() - mono
			h.monoSyncedAt = uint64(mono)
		}
	}
	return nil
}

// clockSyncReadings is how many readings syncClock takes (each three clock
// reads through the vDSO, well under a microsecond).
const clockSyncReadings = 16

// wallTime converts a sample's CLOCK_MONOTONIC time to wall-clock time.
func (h *Handler) wallTime(ktime uint64) time.Time {
	if ktime > h.monoSyncedAt+uint64(clockResyncInterval) {
		// Keep the old offset if the clock cannot be read; it is still close.
		_ = h.syncClock()
	}
	return time.Unix(0, int64(ktime)+h.monoToWall)
}

// HandleTrace converts a raw trace (or finds its earlier conversion) and
// reports the sample. A trace whose process must be read first (settled),
// or that met an address a re-read of the maps may find, and every trace of
// a process with work queued before it, is copied and handed to the
// lifecycle, which reports it once that is done.
func (h *Handler) HandleTrace(raw *support.Trace) {
	h.received.Add(1)
	if h.life.waits(raw.PID) || !h.convertSettled(raw) {
		h.life.queueTrace(raw)
	}
}

// convertSettled converts and reports a trace of a process that needs no
// reading, and reports false for any other.
func (h *Handler) convertSettled(raw *support.Trace) bool {
	p, gen, ready, due := h.m.settled(raw)
	if due {
		h.life.queue(lifecycleItem{kind: lifeRefresh, pid: raw.PID})
	}
	if !ready {
		return false
	}
	h.convMu.Lock()
	defer h.convMu.Unlock()
	h.sweep()
	if trace, info, ok := h.lookup(raw, gen); ok {
		h.hits.Add(1)
		h.report(raw, trace, info)
		return true
	}
	c := h.m.convert(raw, p)
	if c.unknown > 0 && h.m.rereadDue(p) {
		return false // the lifecycle reads the maps and converts it again
	}
	h.m.countUnattributed(c)
	h.store(raw, c)
	h.report(raw, c.trace, c.info)
	return true
}

// convertReading does a trace's lifecycle work (sampled), converts it,
// re-reading the maps after a miss, and reports it. It runs on the
// lifecycle goroutine.
func (h *Handler) convertReading(raw *support.Trace) {
	done := h.m.prepare(raw.PID, raw.Comm, len(raw.Frames) > 0)
	p, gen := h.m.sampled(raw)
	done()
	h.convMu.Lock()
	defer h.convMu.Unlock()
	h.sweep()
	if trace, info, ok := h.lookup(raw, gen); ok {
		h.hits.Add(1)
		h.report(raw, trace, info)
		return
	}
	c := h.m.convertRetrying(raw, p)
	h.store(raw, c)
	h.report(raw, c.trace, c.info)
}

// doLifecycle does one item of the lifecycle's queue.
func (h *Handler) doLifecycle(it *lifecycleItem) {
	pid := libpf.PID(it.pid)
	switch it.kind {
	case lifeTrace:
		h.convertReading(it.trace)
	case lifeRefresh:
		h.m.refresh(it.pid)
	case lifeExec:
		h.m.ProcessExeced(pid, it.program)
	case lifeExit:
		h.m.ProcessExited(pid)
	case lifeMapped:
		done := h.m.prepareMapped(it.pid, it.mapping)
		h.m.ExecMapped(pid, it.mapping)
		done()
	case lifeUnknownPC:
		done := h.m.prepare(it.pid, "", true)
		h.m.UnknownPC(pid, it.pc)
		done()
	}
}

// store caches a conversion that may be cached. The caller holds convMu.
func (h *Handler) store(raw *support.Trace, c conversion) {
	h.misses.Add(1)
	if c.gen == 0 {
		return
	}
	h.cache.Add(raw.Hash, cachedTrace{trace: c.trace, info: c.info, pid: raw.PID, gen: c.gen, retryAt: c.retryAt,
		linesSettled: c.linesSettled, usedAt: h.m.now()}, 0)
	h.cacheSize.Store(int64(h.cache.Len()))
}

// report hands one sample to the reporter. The caller holds convMu.
func (h *Handler) report(raw *support.Trace, trace *libpf.Trace, info *libpf.ProcessInfo) {
	// Agents are told of CPU samples: a wait is not one.
	if raw.APM.Valid && !raw.OffCPU && h.m.corr != nil {
		h.m.corr.Count(raw.PID, raw.APM, trace.Hash)
	}
	info = info.At(raw.KTime)
	h.reporter.ReportSample(trace, &libpf.SampleMeta{
		Time:       h.wallTime(raw.KTime),
		TID:        libpf.TID(raw.TID),
		ThreadName: raw.Comm,
		CPU:        int(raw.CPU),
		Process:    info,
		APM:        raw.APM,
		Span:       raw.Span,
		Labels:     libpf.MakeLabels(h.sampleLabels(raw, info)),
		OffCPU:     raw.Waited,
	})
}

// sampleLabels are a sample's labels: a goroutine's, and its thread
// context's attributes named by the process's key table (an index beyond
// it is counted and left out; the table grows with the process context's
// next publication).
func (h *Handler) sampleLabels(raw *support.Trace, info *libpf.ProcessInfo) []libpf.Label {
	if len(raw.ContextAttrs) == 0 {
		return raw.Labels
	}
	var keys []string
	if info != nil && info.AttributeKeys != nil {
		keys = *info.AttributeKeys
	}
	labels := raw.Labels
	for _, a := range raw.ContextAttrs {
		if int(a.Key) >= len(keys) {
			h.unknownAttrKeys.Add(1)
			continue
		}
		labels = append(labels, libpf.Label{Key: keys[a.Key], Value: a.Value})
	}
	return labels
}

// lookup returns the cached conversion of raw if it is still valid: made
// for the same pid, with the process state that pid has now (gen).
func (h *Handler) lookup(raw *support.Trace, gen uint64) (*libpf.Trace, *libpf.ProcessInfo, bool) {
	if raw == nil {
		return nil, nil, false
	}
	c, ok := h.cache.Get(raw.Hash)
	if !ok || c.pid != raw.PID || gen != c.gen {
		return nil, nil, false
	}
	now := h.m.now()
	if !c.retryAt.IsZero() && !now.Before(c.retryAt) {
		return nil, nil, false
	}
	if c.linesSettled != 0 && h.m.lines.settledFiles()+1 != c.linesSettled {
		return nil, nil, false
	}
	if now.Sub(c.usedAt) >= traceTouchInterval {
		c.usedAt = now
		h.cache.Add(raw.Hash, c, 0)
	}
	return c.trace, c.info, true
}

// ProcessExited forgets a process; see Manager.ProcessExited. Its cached
// traces go at the next sweep.
func (h *Handler) ProcessExited(pid libpf.PID) {
	h.life.queue(lifecycleItem{kind: lifeExit, pid: uint32(pid)})
	h.exitMu.Lock()
	if h.exited == nil {
		h.exited = map[uint32]struct{}{}
	}
	h.exited[uint32(pid)] = struct{}{}
	h.exitMu.Unlock()
}

// sweep drops the cached traces of the processes that exited and those
// idle for traceIdleExpiry, at most once per exitSweepInterval.
func (h *Handler) sweep() {
	now := h.m.now()
	if now.Sub(h.lastSweep) < exitSweepInterval {
		return
	}
	h.lastSweep = now
	h.dropIdle(now)
	h.exitMu.Lock()
	exited := h.exited
	h.exited = nil
	h.exitMu.Unlock()
	if len(exited) == 0 {
		return
	}
	var gone []uint64
	for hash, c := range h.cache.All() {
		if _, ok := exited[c.pid]; ok {
			gone = append(gone, hash)
		}
	}
	for _, hash := range gone {
		h.cache.Remove(hash)
	}
	h.cacheSize.Store(int64(h.cache.Len()))
}

// dropIdle drops the cached traces not used for traceIdleExpiry: the least
// recently used first, stopping at one that was used since.
func (h *Handler) dropIdle(now time.Time) {
	for {
		hash, c, ok := h.cache.Oldest()
		if !ok || now.Sub(c.usedAt) < traceIdleExpiry {
			break
		}
		h.cache.Remove(hash)
	}
	h.cacheSize.Store(int64(h.cache.Len()))
}

// ProcessExeced replaces the state of a process whose image was replaced;
// see Manager.ProcessExeced.
func (h *Handler) ProcessExeced(pid libpf.PID, program support.FileKey) {
	h.life.queue(lifecycleItem{kind: lifeExec, pid: uint32(pid), program: program})
}

// ExecMapped adds a process's new executable mapping; see
// Manager.ExecMapped.
func (h *Handler) ExecMapped(pid libpf.PID, m support.ExecMapping) {
	h.life.queue(lifecycleItem{kind: lifeMapped, pid: uint32(pid), mapping: m})
}

// UnknownPC reads the mappings of a process BPF found a PC of outside every
// mapping it knows: a new process, or new code.
func (h *Handler) UnknownPC(pid libpf.PID, pc uint64) {
	h.life.queue(lifecycleItem{kind: lifeUnknownPC, pid: uint32(pid), pc: pc})
}

// Stats returns the Handler's and the Manager's counters.
func (h *Handler) Stats() Stats {
	s := h.m.Stats()
	s.TracesReceived = h.received.Load()
	s.TraceCacheHits = h.hits.Load()
	s.TraceCacheMisses = h.misses.Load()
	s.TraceCacheSize = int(h.cacheSize.Load())
	s.ConversionErrors = h.errors.Load()
	s.UnknownAttributeKeys = h.unknownAttrKeys.Load()
	s.Lifecycle = h.life.stats()
	return s
}

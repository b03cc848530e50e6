package reporter

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// sampleKey identifies the samples of one interval that are counted together.
type sampleKey struct {
	hash libpf.TraceHash
	pid  libpf.PID
	// process tells apart the images one pid runs within an interval (exec,
	// pid reuse): the process manager makes a new ProcessInfo for each.
	process    *libpf.ProcessInfo
	tid        libpf.TID
	threadName string
	cpu        int
	// link is the APM trace and span the sample was taken in; zero
	// outside one.
	link traceLink
	// labels are the program's labels of the sampled work (a
	// goroutine's).
	labels libpf.Labels
	// offCPU says the samples are waits off the CPU (SampleMeta.OffCPU),
	// not CPU samples.
	offCPU bool
}

// traceLink is a sample's link to a distributed trace.
type traceLink struct {
	traceID [16]byte
	spanID  [8]byte
}

// sampleGroup is everything an interval keeps for one sampleKey.
type sampleGroup struct {
	key   sampleKey
	trace *libpf.Trace
	// timestamps are unix nanoseconds, one per sample, in arrival order.
	timestamps []uint64
	// waits are, in an off-CPU group, each sample's wait in nanoseconds,
	// one per timestamp.
	waits []int64
	// summed, when not zero, is the group's samples where they were
	// counted without their times (the history's exports; timestamps is
	// then empty), and the group has no thread id and CPU.
	summed int
}

// count is the group's number of samples.
func (g *sampleGroup) count() int { return len(g.timestamps) + g.summed }

// waited is an off-CPU group's time off the CPU, in nanoseconds.
func (g *sampleGroup) waited() int64 {
	var sum int64
	for _, w := range g.waits {
		sum += w
	}
	return sum
}

// interval is the immutable result of one reporting interval once it has
// been swapped out of the aggregator.
type interval struct {
	start, end time.Time
	groups     map[sampleKey]*sampleGroup
	// samples and waits are the numbers of CPU samples and of off-CPU
	// waits across all groups; each kind is bounded by the limit on its
	// own, so that waits never crowd out CPU samples.
	samples, waits int
	// dropped counts samples refused because the interval was full.
	dropped int
	// heaps are the heap profiles read in the interval (one per process
	// as read; a merged interval has each of its parts'); heapSites their
	// samples, bounded by the limit on their own.
	heaps     []*libpf.HeapProfile
	heapSites int
}

func newInterval(start time.Time) *interval {
	return &interval{start: start, groups: make(map[sampleKey]*sampleGroup)}
}

// aggregator collects samples into the current interval. Its mutex is held
// only for a map lookup and an append, so ReportSample stays cheap.
type aggregator struct {
	mu    sync.Mutex
	cur   *interval
	limit int
}

func newAggregator(start time.Time, limit int) *aggregator {
	return &aggregator{cur: newInterval(start), limit: limit}
}

// add counts one sample and reports whether it was kept.
func (a *aggregator) add(t *libpf.Trace, meta *libpf.SampleMeta, ts uint64) bool {
	key := sampleKey{
		hash:       t.Hash,
		tid:        meta.TID,
		threadName: meta.ThreadName,
		cpu:        meta.CPU,
		labels:     meta.Labels,
		offCPU:     meta.OffCPU > 0,
	}
	switch {
	case meta.APM.Valid:
		key.link = traceLink{traceID: meta.APM.TraceID, spanID: meta.APM.SpanID}
	case meta.Span.Valid:
		key.link = traceLink{traceID: meta.Span.TraceID, spanID: meta.Span.SpanID}
	}
	if meta.Process != nil {
		key.pid = meta.Process.PID
		key.process = meta.Process
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	iv := a.cur
	count := &iv.samples
	if key.offCPU {
		count = &iv.waits
	}
	if *count >= a.limit {
		iv.dropped++
		return false
	}
	g := iv.groups[key]
	if g == nil {
		g = &sampleGroup{key: key, trace: t}
		iv.groups[key] = g
	}
	g.timestamps = append(g.timestamps, ts)
	if key.offCPU {
		g.waits = append(g.waits, int64(meta.OffCPU))
	}
	*count++
	return true
}

// addHeap keeps a heap profile in the current interval, in place of one
// of the same process read earlier in it, and reports whether it was kept
// (not when its sites would take the interval's over the limit).
func (a *aggregator) addHeap(hp *libpf.HeapProfile) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	iv := a.cur
	for i, old := range iv.heaps {
		// By pid: the manager replaces a process's info when it learns
		// more of it.
		if samePID(old, hp) {
			if iv.heapSites-len(old.Samples)+len(hp.Samples) > a.limit {
				return false
			}
			iv.heapSites += len(hp.Samples) - len(old.Samples)
			iv.heaps[i] = hp
			return true
		}
	}
	if iv.heapSites+len(hp.Samples) > a.limit {
		return false
	}
	iv.heapSites += len(hp.Samples)
	iv.heaps = append(iv.heaps, hp)
	return true
}

// samePID says two heap profiles are of one process.
func samePID(a, b *libpf.HeapProfile) bool {
	return a.Process != nil && b.Process != nil && a.Process.PID == b.Process.PID
}

// empty says the interval has nothing to report.
func (iv *interval) empty() bool {
	return iv.samples == 0 && iv.waits == 0 && len(iv.heaps) == 0
}

// restartIfEmpty moves the start of the current interval to now if it has
// no samples yet.
func (a *aggregator) restartIfEmpty(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur.empty() && a.cur.dropped == 0 {
		a.cur.start = now
	}
}

// swap ends the current interval at end and starts the next one there.
func (a *aggregator) swap(end time.Time) *interval {
	next := newInterval(end)
	a.mu.Lock()
	iv := a.cur
	a.cur = next
	a.mu.Unlock()
	iv.end = end
	return iv
}

// maxMergedSamples bounds a merged interval's samples and waits: each
// costs 9 bytes or more in a request, which a collector takes up to 4 MiB
// by default (gRPC's receive limit, checked after decompression).
const maxMergedSamples = 1 << 16

// mergeable says whether b can be merged into a within limit samples (and
// waits), and within maxMergedSamples.
func mergeable(a, b *interval, limit int) bool {
	limit = min(limit, maxMergedSamples)
	return a.samples+b.samples <= limit && a.waits+b.waits <= limit && a.heapSites+b.heapSites <= maxHeapSitesPerRequest
}

// maxHeapSitesPerRequest bounds the heap sites of one request: a site
// takes some 500 bytes of a request (its stack, four values, its share of
// the locations and names), and a collector takes 4 MiB.
const maxHeapSitesPerRequest = 4096

// splitForExport is iv, with at most maxHeapSitesPerRequest heap sites,
// followed by intervals of the rest of its heap profiles, as many as it
// takes (a profile with more sites than one request holds is split in
// parts of the same time).
func splitForExport(iv *interval) []*interval {
	if iv.heapSites <= maxHeapSitesPerRequest {
		return []*interval{iv}
	}
	first := *iv
	first.heaps, first.heapSites = nil, 0
	out := []*interval{&first}
	cur := &first
	for _, hp := range iv.heaps {
		for rest := hp.Samples; len(rest) > 0; {
			if cur.heapSites == maxHeapSitesPerRequest {
				cur = &interval{start: iv.start, end: iv.end, groups: map[sampleKey]*sampleGroup{}}
				out = append(out, cur)
			}
			n := min(len(rest), maxHeapSitesPerRequest-cur.heapSites)
			part := *hp
			part.Samples = rest[:n:n]
			rest = rest[n:]
			cur.heaps = append(cur.heaps, &part)
			cur.heapSites += n
		}
	}
	return out
}

// mergeIntervals returns a new interval spanning a and b with the samples
// of both; a and b are left as they are (the history may hold their
// groups).
func mergeIntervals(a, b *interval) *interval {
	m := &interval{
		start:   a.start,
		end:     b.end,
		groups:  maps.Clone(a.groups),
		samples: a.samples + b.samples,
		waits:   a.waits + b.waits,
		dropped: a.dropped + b.dropped,
		// Each heap profile is a reading at its own time: both are kept.
		heaps:     slices.Concat(a.heaps, b.heaps),
		heapSites: a.heapSites + b.heapSites,
	}
	if b.start.Before(m.start) {
		m.start = b.start
	}
	if a.end.After(m.end) {
		m.end = a.end
	}
	for k, g := range b.groups {
		if og, ok := m.groups[k]; ok {
			g = &sampleGroup{key: k, trace: og.trace,
				timestamps: slices.Concat(og.timestamps, g.timestamps),
				waits:      slices.Concat(og.waits, g.waits),
				summed:     og.summed + g.summed}
		}
		m.groups[k] = g
	}
	return m
}

package reporter

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
	"weak"

	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Defaults of HistoryConfig's zero fields.
const (
	DefaultHistoryAge   = time.Hour
	DefaultHistoryBytes = 64 << 20
)

// HistoryConfig bounds what a History keeps.
type HistoryConfig struct {
	// MaxAge is how much time the history covers; older intervals are
	// dropped. Zero means DefaultHistoryAge.
	MaxAge time.Duration
	// MaxBytes bounds the history's estimated memory; the oldest intervals
	// are dropped to stay under it. Zero means DefaultHistoryBytes.
	MaxBytes int64
}

// History keeps the reporter's recent intervals in memory, compactly, for
// the web view: every interval the reporter exports is also added here, so
// what the page shows and what was exported agree. Stacks, frames and the
// processes' descriptions are interned in tables shared by all intervals;
// an interval is a list of (stack, process/thread, second, count) entries.
// The tables are rebuilt from the intervals still held when dropping
// intervals has left them mostly unused.
type History struct {
	maxAge   time.Duration
	maxBytes int64

	mu        sync.RWMutex
	tab       *histTables
	intervals []*histInterval // oldest first
	// entryBytes is the size of all intervals' entries.
	entryBytes int64
	// compactAt is the table size above which dropping intervals rebuilds
	// the tables.
	compactAt int64
	// droppedIntervals and droppedSamples count what the bounds dropped.
	droppedIntervals, droppedSamples uint64
	compactions                      uint64
	// droppedSinceCompact says whether the tables hold stacks of dropped
	// intervals.
	droppedSinceCompact bool
	// samplesHeld counts the samples of the intervals held.
	samplesHeld uint64
	// period is the reporter's sampling period in nanoseconds, for the
	// pprof profiles of selections.
	period atomic.Int64
	// heaps are the heap profiles read from processes, oldest first
	// (MeasureInUse, MeasureAlloc); heapBytes their size.
	heaps     []*histHeap
	heapBytes int64
}

// histHeap is one heap profile of a process: per series (a stack in the
// process) the bytes in use and allocated at the time it was read.
type histHeap struct {
	at           time.Time
	pid          libpf.PID
	series       []uint32
	inuse, alloc []uint64
}

// maxHistHeaps bounds the heap profiles a history keeps, whatever their
// age: an hour of 100 Go programs read every minute is 6,000.
const maxHistHeaps = 8192

// bytes is the memory the profile takes.
func (hh *histHeap) bytes() int64 { return 64 + int64(len(hh.series))*(4+8+8) }

// NewHistory returns an empty history with the given bounds.
func NewHistory(cfg HistoryConfig) (*History, error) {
	if cfg.MaxAge < 0 || cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("invalid history bounds: age %v, bytes %d", cfg.MaxAge, cfg.MaxBytes)
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultHistoryAge
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultHistoryBytes
	}
	return &History{
		maxAge:    cfg.MaxAge,
		maxBytes:  cfg.MaxBytes,
		tab:       newHistTables(),
		compactAt: minCompactBytes,
	}, nil
}

// minCompactBytes keeps small tables from being rebuilt at every drop.
const minCompactBytes = 4 << 20

// histEntry counts the samples of one series within one second of an
// interval. More than 65,535 samples take several entries.
type histEntry struct {
	series uint32
	count  uint16
	// sec is the second from the interval's first second.
	sec uint16
}

// histSeries is a stack in one process and thread name, and its call-tree
// node; entries refer to it, so that one is 8 bytes.
type histSeries struct {
	stack, meta, node uint32
}

const histEntrySize = int64(unsafe.Sizeof(histEntry{}))

type histInterval struct {
	// startSec is the unix second the entries' sec count from; start and
	// end are the interval's bounds.
	startSec   int64
	start, end time.Time
	entries    []histEntry
	samples    uint64
	// traces are, by trace id, the entries of the samples taken in a
	// distributed trace (an APM agent's or an OpenTelemetry span's): a
	// subset of entries, for Selection.Traces; nil without any.
	traces map[[16]byte][]histEntry
}

// traceKeyCost estimates a traces map entry's memory beside its entries.
const traceKeyCost = 16 + 24 + 16

// bytes is the memory the interval's entries take.
func (iv *histInterval) bytes() int64 {
	n := int64(len(iv.entries)) * histEntrySize
	for _, es := range iv.traces {
		n += traceKeyCost + int64(len(es))*histEntrySize
	}
	return n
}

// histMeta is what a sample's process and thread are filtered by.
type histMeta struct {
	pid       libpf.PID
	process   string
	container string
	// containerName, pod ("namespace/name") and namespace are the
	// container's Kubernetes names, empty outside Kubernetes.
	containerName, pod, namespace string
	// service is the process's service.name.
	service string
	thread  string
	// labels are the program's labels of the sampled work.
	labels libpf.Labels
	// offCPU says the series' entries count time off the CPU, in
	// OffCPUUnit, not CPU samples.
	offCPU bool
}

// OffCPUUnit is what one count of an off-CPU series' entry stands for: a
// stack's waits are added up per second and rounded to it.
const OffCPUUnit = 100 * time.Microsecond

// histFunc is one node name of the flame graph: frames that share it are
// merged. kind is the frame type ("native", a runtime's, or one of the kinds
// below that name no frames).
type histFunc struct {
	kind, name, file string
}

// The kinds of flame graph nodes that are not frames.
const (
	KindRoot      = "root"
	KindProcess   = "process"
	KindTruncated = "truncated"
	// KindGo is native code of a Go binary, shown apart from C's.
	KindGo = "go"
	// KindGroup is a group of samples by one value (FlameQuery.GroupBy).
	KindGroup = "group"
)

// id is the function's stable id: the web view's zoom path names nodes by
// it, and it survives table rebuilds.
func (f histFunc) id() uint64 {
	return xxh3.HashString(f.kind + "\x00" + f.name + "\x00" + f.file)
}

type histStack struct {
	// frames are indexes into histTables.frames, leaf first.
	frames    []uint32
	truncated bool
}

// histTables interns what intervals refer to.
type histTables struct {
	frames  []libpf.Frame
	frameFn []uint32 // frame index -> function index
	// frameIdx and funcIdx are keyed by hashes: the values' own bytes
	// would double the tables.
	frameIdx map[[2]uint64]uint32
	mappings map[libpf.Mapping]*libpf.Mapping

	funcs   []histFunc
	funcID  []uint64 // function index -> histFunc.id
	funcIdx map[uint64]uint32

	stacks   []histStack
	stackIdx map[[2]uint64]uint32
	// byTrace finds the stack of a trace seen before without interning its
	// frames again. Keyed by the trace itself, weakly: a hash leaves out
	// the mapping's place in the process and the symbols, which a later
	// conversion may add. Cleared when it has 4 times as many entries as
	// there are stacks (keys of collected traces stay until then).
	byTrace map[weak.Pointer[libpf.Trace]]uint32

	metas   []histMeta
	metaIdx map[histMeta]uint32

	// tree merges the stacks by function into one call tree under one
	// node per executable: queries count samples per node and add them
	// up, in time linear in the nodes, with no hashing. Node 0 is the
	// root; a node comes after its parent.
	tree []treeNode

	series    []histSeries
	seriesIdx map[[2]uint32]uint32 // (stack, meta) -> series

	// bytes estimates the tables' memory.
	bytes int64
}

func newHistTables() *histTables {
	return &histTables{
		frameIdx:  make(map[[2]uint64]uint32),
		mappings:  make(map[libpf.Mapping]*libpf.Mapping),
		funcIdx:   make(map[uint64]uint32),
		stackIdx:  make(map[[2]uint64]uint32),
		byTrace:   make(map[weak.Pointer[libpf.Trace]]uint32),
		metaIdx:   make(map[histMeta]uint32),
		tree:      []treeNode{{fn: noFunc}},
		seriesIdx: make(map[[2]uint32]uint32),
	}
}

// treeNode is a node of the call tree. Children are a linked list (child,
// next; 0 ends it, as the root is nobody's child): a map would cost more
// than the nodes, and only new stacks walk it.
type treeNode struct {
	parent, child, next uint32
	// fn is the function index; recursive marks a function that is also
	// an ancestor's, so that a sample counts once in its total.
	fn uint32
	// line is the line of the node's frames, mixedLines when they differ.
	line uint32
}

const (
	noFunc     = ^uint32(0)
	recursive  = 1 << 31
	mixedLines = ^uint32(0)
	nodeCost   = int64(unsafe.Sizeof(treeNode{}))
	seriesCost = int64(unsafe.Sizeof(histSeries{})) + 32
)

func (n *treeNode) function() uint32 { return n.fn &^ recursive }

// seriesOf interns a stack in a process and thread.
func (t *histTables) seriesOf(stack, meta uint32) uint32 {
	key := [2]uint32{stack, meta}
	if i, ok := t.seriesIdx[key]; ok {
		return i
	}
	proc := t.function(histFunc{kind: KindProcess, name: t.metas[meta].process})
	i := uint32(len(t.series))
	t.series = append(t.series, histSeries{stack: stack, meta: meta, node: t.node(proc, stack)})
	t.seriesIdx[key] = i
	t.bytes += seriesCost
	return i
}

// node returns the call-tree node of stack in the executable whose
// function is proc, adding the path if new.
func (t *histTables) node(proc, stack uint32) uint32 {
	cur := t.child(0, proc, 0)
	s := &t.stacks[stack]
	if s.truncated {
		cur = t.child(cur, t.function(histFunc{kind: KindTruncated, name: "[truncated]"}), 0)
	}
	for i := len(s.frames) - 1; i >= 0; i-- {
		f := s.frames[i]
		cur = t.child(cur, t.frameFn[f], t.frames[f].SourceLine)
	}
	return cur
}

func (t *histTables) child(parent, fn, line uint32) uint32 {
	for c := t.tree[parent].child; c != 0; c = t.tree[c].next {
		if n := &t.tree[c]; n.function() == fn {
			if n.line != line {
				n.line = mixedLines
			}
			return c
		}
	}
	n := treeNode{parent: parent, fn: fn, line: line, next: t.tree[parent].child}
	for a := parent; a != 0; a = t.tree[a].parent {
		if t.tree[a].function() == fn {
			n.fn |= recursive
			break
		}
	}
	i := uint32(len(t.tree))
	t.tree = append(t.tree, n)
	t.tree[parent].child = i
	t.bytes += nodeCost
	return i
}

// Rough per-entry costs of the tables, map overhead included.
const (
	frameCost = int64(unsafe.Sizeof(libpf.Frame{})) + 4 + 40
	funcCost  = int64(unsafe.Sizeof(histFunc{})) + 8 + 24
	stackCost = int64(unsafe.Sizeof(histStack{})) + 48
	metaCost  = int64(unsafe.Sizeof(histMeta{}))*2 + 24
	// byTraceCost is a map entry of 8+4 bytes with Go's map overhead, and
	// the runtime's record behind a weak pointer.
	byTraceCost = 64
)

// frame interns f. A symbolized frame loses its address, so that one
// function's line is one frame whatever instruction was sampled; the
// mapping is interned too, as many traces point to copies of one.
func (t *histTables) frame(f *libpf.Frame) uint32 {
	c := *f
	if c.FunctionName != "" {
		c.Address = 0
	}
	if c.Mapping != nil {
		m, ok := t.mappings[*c.Mapping]
		if !ok {
			m = c.Mapping
			t.mappings[*m] = m
			t.bytes += 2*int64(unsafe.Sizeof(*m)) + int64(len(m.Path)+len(m.GNUBuildID)+len(m.GoBuildID))
		}
		c.Mapping = m
	}
	key := frameKey(&c)
	if i, ok := t.frameIdx[key]; ok {
		return i
	}
	i := uint32(len(t.frames))
	t.frames = append(t.frames, c)
	t.frameFn = append(t.frameFn, t.function(funcOfFrame(&c)))
	t.frameIdx[key] = i
	t.bytes += frameCost + int64(len(c.FunctionName)+len(c.SourceFile)+len(c.SystemName)+len(c.Tier))
	return i
}

// frameKey hashes every field of an interned frame (its mapping is
// interned, so the pointer stands for it).
func frameKey(f *libpf.Frame) [2]uint64 {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, f.Address)
	b = binary.LittleEndian.AppendUint64(b, uint64(uintptr(unsafe.Pointer(f.Mapping))))
	b = binary.LittleEndian.AppendUint32(b, f.SourceLine)
	b = binary.LittleEndian.AppendUint32(b, f.SourceColumn)
	b = append(b, byte(f.Kind))
	if f.Inlined {
		b = append(b, 1)
	}
	for _, str := range []string{f.FunctionName, f.SourceFile, f.SystemName, f.Tier} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(str)))
		b = append(b, str...)
	}
	h := xxh3.Hash128(b)
	return [2]uint64{h.Hi, h.Lo}
}

// isGoFrame tells Go code from the C code that cgo links into the same
// binary: Go's symbols are qualified by their package ("runtime.goexit",
// "main.main"), C's are not.
func isGoFrame(f *libpf.Frame) bool {
	return f.Kind == libpf.FrameNative && f.Mapping != nil && f.Mapping.GoBuildID != "" &&
		strings.Contains(f.FunctionName, ".")
}

// funcOfFrame names the flame graph node of a frame: its function in its
// source file, or for native code without one, in its mapped file.
func funcOfFrame(f *libpf.Frame) histFunc {
	fn := histFunc{kind: f.Kind.String(), name: frameName(f), file: f.SourceFile}
	if isGoFrame(f) {
		fn.kind = KindGo
	}
	if fn.file == "" && f.Mapping != nil && f.Kind != libpf.FrameKernel {
		fn.file = f.Mapping.Path
	}
	return fn
}

func (t *histTables) function(f histFunc) uint32 {
	id := f.id()
	if i, ok := t.funcIdx[id]; ok {
		return i
	}
	i := uint32(len(t.funcs))
	t.funcs = append(t.funcs, f)
	t.funcID = append(t.funcID, id)
	t.funcIdx[id] = i
	t.bytes += funcCost + int64(len(f.kind)+len(f.name)+len(f.file))
	return i
}

// stack interns a trace's frames.
func (t *histTables) stack(tr *libpf.Trace) uint32 {
	key := weak.Make(tr)
	if i, ok := t.byTrace[key]; ok {
		return i
	}
	i := t.traceStack(tr)
	if len(t.byTrace) >= 4*len(t.stacks)+1024 {
		t.bytes -= int64(len(t.byTrace)) * byTraceCost
		clear(t.byTrace)
	}
	t.byTrace[key] = i
	t.bytes += byTraceCost
	return i
}

// traceStack interns a trace's frames and stack.
func (t *histTables) traceStack(tr *libpf.Trace) uint32 {
	frames := make([]uint32, len(tr.Frames))
	for i := range tr.Frames {
		frames[i] = t.frame(&tr.Frames[i])
	}
	return t.internStack(histStack{frames: frames, truncated: tr.Truncated})
}

func (t *histTables) internStack(s histStack) uint32 {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s.frames))), len(s.frames)*4)
	h := xxh3.Hash128(b)
	key := [2]uint64{h.Hi, h.Lo}
	if s.truncated {
		key[0] ^= 1
	}
	if i, ok := t.stackIdx[key]; ok {
		return i
	}
	i := uint32(len(t.stacks))
	t.stacks = append(t.stacks, s)
	t.stackIdx[key] = i
	t.bytes += stackCost + 4*int64(len(s.frames))
	return i
}

func (t *histTables) meta(m histMeta) uint32 {
	if i, ok := t.metaIdx[m]; ok {
		return i
	}
	i := uint32(len(t.metas))
	t.metas = append(t.metas, m)
	t.metaIdx[m] = i
	t.bytes += metaCost + int64(len(m.process)+len(m.container)+len(m.containerName)+len(m.pod)+len(m.namespace)+
		len(m.service)+len(m.thread)+m.labels.Size())
	return i
}

func metaOf(k *sampleKey) histMeta {
	m := processMeta(k.pid, k.process)
	m.thread, m.labels, m.offCPU = k.threadName, k.labels, k.offCPU
	return m
}

// processMeta is the part of a meta that describes the process.
func processMeta(pid libpf.PID, p *libpf.ProcessInfo) histMeta {
	m := histMeta{pid: pid}
	if p != nil {
		m.process, m.container = p.ExecutableName, p.ContainerID
		m.containerName, m.namespace, m.service = p.ContainerName, p.Namespace, p.ServiceName
		if p.PodName != "" {
			m.pod = p.Namespace + "/" + p.PodName
		}
	}
	if m.process == "" {
		m.process = "[unknown]"
	}
	return m
}

// heapTraces are the traces of heap profiles' sites that have bytes, made
// before the history is locked: there are thousands.
func heapTraces(heaps []*libpf.HeapProfile) [][]*libpf.Trace {
	out := make([][]*libpf.Trace, len(heaps))
	for j, hp := range heaps {
		out[j] = make([]*libpf.Trace, len(hp.Samples))
		for i := range hp.Samples {
			if s := &hp.Samples[i]; s.InUseBytes > 0 || s.AllocBytes > 0 {
				out[j][i] = hp.Trace(i)
			}
		}
	}
	return out
}

// addHeaps keeps an interval's heap profiles, whose sites' traces
// heapTraces made. The caller holds h.mu.
func (h *History) addHeaps(heaps []*libpf.HeapProfile, traces [][]*libpf.Trace) {
	for j, hp := range heaps {
		var pid libpf.PID
		if hp.Process != nil {
			pid = hp.Process.PID
		}
		meta := h.tab.meta(processMeta(pid, hp.Process))
		hh := &histHeap{at: hp.Time, pid: pid}
		for i := range hp.Samples {
			s, tr := &hp.Samples[i], traces[j][i]
			if tr == nil {
				continue
			}
			// Each trace was made for this call: byTrace would only
			// collect dead keys.
			hh.series = append(hh.series, h.tab.seriesOf(h.tab.traceStack(tr), meta))
			hh.inuse = append(hh.inuse, uint64(max(s.InUseBytes, 0)))
			hh.alloc = append(hh.alloc, uint64(max(s.AllocBytes, 0)))
		}
		h.heaps = append(h.heaps, hh)
		h.heapBytes += hh.bytes()
	}
}

// add appends an interval reported by the reporter and drops what the
// bounds no longer allow.
func (h *History) add(iv *interval, period int64) {
	h.period.Store(period)
	if len(iv.heaps) > 0 {
		traces := heapTraces(iv.heaps)
		h.mu.Lock()
		h.addHeaps(iv.heaps, traces)
		h.enforceBounds()
		h.mu.Unlock()
	}
	if iv.samples+iv.waits == 0 {
		return
	}
	// Samples count at their own time, which the pipeline's delays can put
	// a little before the interval: its start stretches to cover them, up
	// to a minute. A time beyond that, or after the interval, is a clock
	// gone wrong and clamped: it must not move the history's end, from
	// which its age is counted.
	lo, hi := iv.start.Add(-time.Minute).UnixNano(), iv.end.UnixNano()
	first, last := iv.start.UnixNano(), iv.end.UnixNano()
	for _, g := range iv.groups {
		for _, ts := range g.timestamps {
			t := min(max(int64(ts), lo), hi)
			first, last = min(first, t), max(last, t+1)
		}
	}
	startSec := first / int64(time.Second)
	type entryKey struct {
		series uint32
		sec    uint16
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	counts := make(map[entryKey]uint32)
	traceCounts := make(map[[16]byte]map[entryKey]uint32)
	// Off-CPU time is added up in nanoseconds per series and second, then
	// counted in OffCPUUnit.
	waits := make(map[entryKey]uint64)
	traceWaits := make(map[[16]byte]map[entryKey]uint64)
	for _, g := range iv.groups {
		series := h.tab.seriesOf(h.tab.stack(g.trace), h.tab.meta(metaOf(&g.key)))
		tc, tw := traceCounts[g.key.link.traceID], traceWaits[g.key.link.traceID]
		if g.key.link != (traceLink{}) && tc == nil {
			tc, tw = make(map[entryKey]uint32), make(map[entryKey]uint64)
			traceCounts[g.key.link.traceID], traceWaits[g.key.link.traceID] = tc, tw
		}
		for i, ts := range g.timestamps {
			sec := min(max(int64(ts), lo), hi)/int64(time.Second) - startSec
			k := entryKey{series, uint16(max(0, min(sec, 1<<16-1)))}
			if g.key.offCPU {
				waits[k] += uint64(g.waits[i])
				if tw != nil {
					tw[k] += uint64(g.waits[i])
				}
				continue
			}
			counts[k]++
			if tc != nil {
				tc[k]++
			}
		}
	}
	addWaits := func(counts map[entryKey]uint32, waits map[entryKey]uint64) {
		for k, ns := range waits {
			if n := (ns + uint64(OffCPUUnit)/2) / uint64(OffCPUUnit); n > 0 {
				counts[k] += uint32(min(n, math.MaxUint32))
			}
		}
	}
	addWaits(counts, waits)
	for id, tw := range traceWaits {
		addWaits(traceCounts[id], tw)
	}
	entriesOf := func(counts map[entryKey]uint32) []histEntry {
		es := make([]histEntry, 0, len(counts))
		for k, c := range counts {
			for ; c > 0; c -= min(c, math.MaxUint16) {
				es = append(es, histEntry{series: k.series, sec: k.sec, count: uint16(min(c, math.MaxUint16))})
			}
		}
		return es
	}
	hiv := &histInterval{startSec: startSec, start: time.Unix(0, first), end: time.Unix(0, last), samples: uint64(iv.samples)}
	hiv.entries = entriesOf(counts)
	for id, tc := range traceCounts {
		if hiv.traces == nil {
			hiv.traces = make(map[[16]byte][]histEntry, len(traceCounts))
		}
		hiv.traces[id] = entriesOf(tc)
	}
	h.intervals = append(h.intervals, hiv)
	h.entryBytes += hiv.bytes()
	h.samplesHeld += hiv.samples
	h.enforceBounds()
}

// enforceBounds drops the oldest intervals beyond MaxAge or MaxBytes, and
// rebuilds the tables when they have grown past compactAt since the last
// rebuild (the dropped intervals' stacks are still in them). Over MaxBytes
// it drops down to 90% of it, guessing that the tables shrink with the
// samples held, so that a full history is not rebuilt at every interval.
func (h *History) enforceBounds() {
	_, newest := h.span()
	for len(h.intervals) > 0 && newest.Sub(h.intervals[0].end) >= h.maxAge {
		h.dropOldest()
	}
	// Heap profiles take at most a quarter of the bound (their entries;
	// their stacks share the tables), so that they never push the CPU
	// samples out.
	for len(h.heaps) > 0 && (newest.Sub(h.heaps[0].at) >= h.maxAge || len(h.heaps) > maxHistHeaps ||
		h.heapBytes > h.maxBytes/4) {
		h.dropOldestHeap()
	}
	// Over the bound, heap profiles go first, the oldest half at a time
	// (their stacks are in the tables until a rebuild), down to the
	// newest: the CPU samples are what the web view is for.
	for h.bytesLocked() > h.maxBytes && len(h.heaps) > 1 {
		for range max(len(h.heaps)/2, 1) {
			h.dropOldestHeap()
		}
		h.compact()
	}
	// Each round drops what the guess says, then rebuilds the tables and
	// measures them: when every interval has the same stacks the tables do
	// not shrink with the samples, and the next round sees that. After 3
	// rounds whatever is left goes, so the work stays linear.
	for round := 0; h.bytesLocked() > h.maxBytes && len(h.intervals) > 0; round++ {
		target := h.maxBytes/10*9 - h.heapBytes
		if round == 3 {
			target = 0
		}
		held, tables := h.samplesHeld, float64(h.tab.bytes)
		h.dropOldest()
		for len(h.intervals) > 0 {
			guess := h.entryBytes + int64(tables*float64(h.samplesHeld)/float64(max(held, 1)))
			if guess <= target {
				break
			}
			h.dropOldest()
		}
		h.compact()
	}
	// The newest heap profile alone over the bound.
	if h.bytesLocked() > h.maxBytes && len(h.heaps) > 0 {
		h.dropOldestHeap()
		h.compact()
	}
	// Without drops since the last rebuild there is nothing to free.
	if h.droppedSinceCompact && h.tab.bytes > h.compactAt {
		h.compact()
	}
}

// span is the time the history covers: from its oldest interval's start
// or heap profile to its newest interval's end or past its newest heap
// profile. The caller holds h.mu.
func (h *History) span() (first, last time.Time) {
	if n := len(h.intervals); n > 0 {
		first, last = h.intervals[0].start, h.intervals[n-1].end
	}
	if n := len(h.heaps); n > 0 {
		if first.IsZero() || h.heaps[0].at.Before(first) {
			first = h.heaps[0].at
		}
		// A profile is a moment: the history covers its second.
		if end := h.heaps[n-1].at.Add(time.Second); end.After(last) {
			last = end
		}
	}
	return first, last
}

func (h *History) dropOldestHeap() {
	h.heapBytes -= h.heaps[0].bytes()
	h.heaps[0] = nil
	h.heaps = h.heaps[1:]
	h.droppedSinceCompact = true
}

func (h *History) dropOldest() {
	iv := h.intervals[0]
	h.intervals[0] = nil
	h.intervals = h.intervals[1:]
	h.entryBytes -= iv.bytes()
	h.droppedIntervals++
	h.droppedSinceCompact = true
	h.droppedSamples += iv.samples
	h.samplesHeld -= iv.samples
}

func (h *History) bytesLocked() int64 { return h.entryBytes + h.heapBytes + h.tab.bytes }

// compact rebuilds the tables from the intervals held, renumbering their
// entries.
func (h *History) compact() {
	old, nt := h.tab, newHistTables()
	seriesMap := make(map[uint32]uint32)
	stackMap := make(map[uint32]uint32)
	metaMap := make(map[uint32]uint32)
	remap := func(series uint32) uint32 {
		if ns, ok := seriesMap[series]; ok {
			return ns
		}
		sr := &old.series[series]
		st, ok := stackMap[sr.stack]
		if !ok {
			src := old.stacks[sr.stack]
			frames := make([]uint32, len(src.frames))
			for j, f := range src.frames {
				frames[j] = nt.frame(&old.frames[f])
			}
			st = nt.internStack(histStack{frames: frames, truncated: src.truncated})
			stackMap[sr.stack] = st
		}
		m, ok := metaMap[sr.meta]
		if !ok {
			m = nt.meta(old.metas[sr.meta])
			metaMap[sr.meta] = m
		}
		ns := nt.seriesOf(st, m)
		seriesMap[series] = ns
		return ns
	}
	for _, iv := range h.intervals {
		for i := range iv.entries {
			iv.entries[i].series = remap(iv.entries[i].series)
		}
		// The traces' entries are some of the entries: their series
		// were renumbered above.
		for _, es := range iv.traces {
			for i := range es {
				es[i].series = seriesMap[es[i].series]
			}
		}
	}
	for _, hh := range h.heaps {
		for i, sr := range hh.series {
			hh.series[i] = remap(sr)
		}
	}
	h.tab = nt
	h.droppedSinceCompact = false
	h.compactAt = max(2*nt.bytes, minCompactBytes)
	h.compactions++
}

// HistoryStats describe what a history holds.
type HistoryStats struct {
	// Start and End bound the intervals held; zero when empty.
	Start, End time.Time
	Intervals  int
	Samples    uint64
	// Bytes is the estimated memory held, MaxBytes its bound, MaxAge the
	// time bound.
	Bytes, MaxBytes int64
	MaxAge          time.Duration
	// Stacks, Frames and Functions count the distinct ones held.
	Stacks, Frames, Functions int
	// DroppedIntervals and DroppedSamples count what the bounds dropped;
	// Compactions counts table rebuilds.
	DroppedIntervals, DroppedSamples, Compactions uint64
	// Kinds are the frame types present, sorted.
	Kinds []string
	// OffCPU says the history holds off-CPU time (MeasureOffCPU).
	OffCPU bool
	// HeapProfiles counts the heap profiles held (MeasureInUse,
	// MeasureAlloc).
	HeapProfiles int
}

// Stats describes the history now.
func (h *History) Stats() HistoryStats {
	h.mu.RLock()
	defer h.mu.RUnlock()
	s := HistoryStats{
		Intervals:        len(h.intervals),
		Bytes:            h.bytesLocked(),
		MaxBytes:         h.maxBytes,
		MaxAge:           h.maxAge,
		Stacks:           len(h.tab.stacks),
		Frames:           len(h.tab.frames),
		Functions:        len(h.tab.funcs),
		DroppedIntervals: h.droppedIntervals,
		DroppedSamples:   h.droppedSamples,
		Compactions:      h.compactions,
		OffCPU:           slices.ContainsFunc(h.tab.metas, func(m histMeta) bool { return m.offCPU }),
		HeapProfiles:     len(h.heaps),
	}
	s.Start, s.End = h.span()
	s.Samples = h.samplesHeld
	kinds := make(map[string]bool)
	for i := range h.tab.funcs {
		if k := h.tab.funcs[i].kind; k != KindProcess && k != KindTruncated {
			kinds[k] = true
		}
	}
	s.Kinds = slices.Sorted(maps.Keys(kinds))
	return s
}

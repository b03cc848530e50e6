package reporter

import (
	"cmp"
	"container/heap"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Selection says which samples of a history a query counts. Zero fields
// select everything; the values of one field are alternatives.
type Selection struct {
	// From and To bound the samples' time to [From, To), to the second.
	From, To   time.Time
	PIDs       []libpf.PID
	Processes  []string // executable names
	Containers []string
	// Pods ("namespace/name") and Namespaces are Kubernetes'.
	Pods, Namespaces []string
	// Services are service.name values.
	Services []string
	Threads  []string // thread names
	// Kinds keeps the samples whose stack has a frame of one of the kinds.
	Kinds []string
	// Labels keeps the samples that have, for each key among them, one of
	// its values.
	Labels []libpf.Label
	// Traces keeps the samples taken in one of these distributed traces
	// (by trace id: an APM agent's or an OpenTelemetry span's).
	Traces [][16]byte
	// Measure says what the queries count (MeasureCPU when empty).
	Measure Measure
}

// Measure is what a history query counts.
type Measure string

const (
	// MeasureCPU counts CPU samples.
	MeasureCPU Measure = "cpu"
	// MeasureOffCPU counts time off the CPU, in OffCPUUnit.
	MeasureOffCPU Measure = "offcpu"
	// MeasureWall counts both in OffCPUUnit: a CPU sample as the sampling
	// period, so that a thread's counts add up to its wall time.
	MeasureWall Measure = "wall"
	// MeasureInUse counts the bytes in use in each process's last heap
	// profile within the selection's range: a difference between two
	// ranges is what grew between them.
	MeasureInUse Measure = "inuse"
	// MeasureAlloc counts the bytes allocated since each process started,
	// as of its last heap profile within the range.
	MeasureAlloc Measure = "alloc"
)

// Valid says whether m is one of the measures.
func (m Measure) Valid() bool {
	return m == "" || m == MeasureCPU || m == MeasureOffCPU || m == MeasureWall || m.memory()
}

// memory says m counts heap profiles' bytes.
func (m Measure) memory() bool { return m == MeasureInUse || m == MeasureAlloc }

// Unit is what one count of m stands for: a sample, OffCPUUnit, or a
// byte.
func (m Measure) Unit() string {
	switch {
	case m == MeasureOffCPU || m == MeasureWall:
		return "time"
	case m.memory():
		return "bytes"
	}
	return "samples"
}

// entriesOf are the entries of an interval a selection can select: those
// of its traces when it names traces.
func (s *Selection) entriesOf(iv *histInterval) []histEntry {
	if len(s.Traces) == 0 {
		return iv.entries
	}
	if len(s.Traces) == 1 {
		return iv.traces[s.Traces[0]]
	}
	var es []histEntry
	for _, id := range s.Traces {
		es = append(es, iv.traces[id]...)
	}
	return es
}

// hasLabels says whether labels satisfy want (Selection.Labels).
func hasLabels(labels libpf.Labels, want []libpf.Label) bool {
	for i, w := range want {
		if slices.ContainsFunc(want[:i], func(o libpf.Label) bool { return o.Key == w.Key }) {
			continue // the key was checked with its first value
		}
		v, ok := labels.Get(w.Key)
		if !ok || !slices.ContainsFunc(want[i:], func(o libpf.Label) bool { return o.Key == w.Key && o.Value == v }) {
			return false
		}
	}
	return true
}

// selector is a Selection prepared against the current tables. Its caches
// are per query: the tables do not change under the read lock.
type selector struct {
	tab            *histTables
	fromSec, toSec int64
	// 0 unknown, 1 selected, -1 not
	seriesOK, metaOK, stackOK []int8
	sel                       *Selection
	// cpuWeight and offCPUWeight multiply the counts of CPU and off-CPU
	// series: 0 leaves them out (Selection.Measure).
	cpuWeight, offCPUWeight uint64
}

func (h *History) selector(sel *Selection) *selector {
	s := &selector{tab: h.tab, sel: sel, fromSec: -1 << 62, toSec: 1 << 62, cpuWeight: 1}
	switch sel.Measure {
	case MeasureOffCPU:
		s.cpuWeight, s.offCPUWeight = 0, 1
	case MeasureWall:
		s.cpuWeight, s.offCPUWeight = h.cpuWeight(MeasureWall), 1
	}
	if !sel.From.IsZero() {
		// A second is in the range when it starts in it.
		s.fromSec = (sel.From.UnixMilli() + 999) / 1000
	}
	if !sel.To.IsZero() {
		s.toSec = (sel.To.UnixMilli() + 999) / 1000
	}
	s.seriesOK = make([]int8, len(h.tab.series))
	s.metaOK = make([]int8, len(h.tab.metas))
	if len(sel.Kinds) > 0 {
		s.stackOK = make([]int8, len(h.tab.stacks))
	}
	return s
}

func (s *selector) series(i uint32) bool {
	if v := s.seriesOK[i]; v != 0 {
		return v > 0
	}
	sr := &s.tab.series[i]
	ok := s.meta(sr.meta) && s.stack(sr.stack)
	s.seriesOK[i] = boolInt8(ok)
	return ok
}

func (s *selector) meta(i uint32) bool {
	if v := s.metaOK[i]; v != 0 {
		return v > 0
	}
	m := &s.tab.metas[i]
	ok := s.weight(m) > 0 && (len(s.sel.PIDs) == 0 || slices.Contains(s.sel.PIDs, m.pid)) &&
		(len(s.sel.Processes) == 0 || slices.Contains(s.sel.Processes, m.process)) &&
		(len(s.sel.Containers) == 0 || slices.Contains(s.sel.Containers, m.container)) &&
		(len(s.sel.Pods) == 0 || slices.Contains(s.sel.Pods, m.pod)) &&
		(len(s.sel.Namespaces) == 0 || slices.Contains(s.sel.Namespaces, m.namespace)) &&
		(len(s.sel.Services) == 0 || slices.Contains(s.sel.Services, m.service)) &&
		(len(s.sel.Threads) == 0 || slices.Contains(s.sel.Threads, m.thread)) &&
		hasLabels(m.labels, s.sel.Labels)
	s.metaOK[i] = boolInt8(ok)
	return ok
}

// cpuWeight is what a CPU sample counts for in measure m: one sample, or
// its sampling period in OffCPUUnit (MeasureWall).
func (h *History) cpuWeight(m Measure) uint64 {
	if m != MeasureWall {
		return 1
	}
	return max(uint64(h.period.Load())/uint64(OffCPUUnit), 1)
}

// weight is what one count of a series of m counts for.
func (s *selector) weight(m *histMeta) uint64 {
	if m.offCPU {
		return s.offCPUWeight
	}
	return s.cpuWeight
}

// seriesWeight is what one count of series i counts for, 0 where it is
// not selected.
func (s *selector) seriesWeight(i uint32) uint64 {
	if !s.series(i) {
		return 0
	}
	return s.weight(&s.tab.metas[s.tab.series[i].meta])
}

func (s *selector) stack(i uint32) bool {
	if s.stackOK == nil {
		return true
	}
	if v := s.stackOK[i]; v != 0 {
		return v > 0
	}
	ok := false
	for _, f := range s.tab.stacks[i].frames {
		if slices.Contains(s.sel.Kinds, s.tab.funcs[s.tab.frameFn[f]].kind) {
			ok = true
			break
		}
	}
	s.stackOK[i] = boolInt8(ok)
	return ok
}

func boolInt8(b bool) int8 {
	if b {
		return 1
	}
	return -1
}

// endSec is past the last second an interval's entries can have.
func (iv *histInterval) endSec() int64 { return iv.end.Unix() + 1 }

func (s *selector) overlaps(iv *histInterval) bool {
	return iv.endSec() >= s.fromSec && iv.startSec < s.toSec
}

// each calls fn for every entry the selection selects, with its series
// and unix second.
func (h *History) each(sel *Selection, fn func(sr *histSeries, count uint64, sec int64)) {
	s := h.selector(sel)
	for _, iv := range h.intervals {
		if !s.overlaps(iv) {
			continue
		}
		entries := sel.entriesOf(iv)
		for i := range entries {
			e := &entries[i]
			sec := iv.startSec + int64(e.sec)
			if sec < s.fromSec || sec >= s.toSec || !s.series(e.series) {
				continue
			}
			fn(&h.tab.series[e.series], uint64(e.count)*s.seriesWeight(e.series), sec)
		}
	}
}

// nodeCounts counts the selected samples per call-tree node: the samples
// whose stack ends there, indexed by node.
func (h *History) nodeCounts(sel *Selection) []uint64 {
	counts := make([]uint64, len(h.tab.tree))
	for i, n := range h.seriesCounts(sel) {
		if n > 0 {
			counts[h.tab.series[i].node] += n
		}
	}
	return counts
}

// seriesCounts counts the selected samples per series: there are some 20
// times fewer series than entries in an hour, so adding up per series
// first keeps the entries' pass within the caches.
func (h *History) seriesCounts(sel *Selection) []uint64 {
	if sel.Measure.memory() {
		return h.heapCounts(sel)
	}
	s := h.selector(sel)
	counts := make([]uint64, len(h.tab.series))
	for _, iv := range h.intervals {
		if !s.overlaps(iv) {
			continue
		}
		whole := iv.startSec >= s.fromSec && iv.endSec() < s.toSec
		for _, e := range sel.entriesOf(iv) {
			if !whole {
				if sec := iv.startSec + int64(e.sec); sec < s.fromSec || sec >= s.toSec {
					continue
				}
			}
			counts[e.series] += uint64(e.count)
		}
	}
	for i, n := range counts {
		if n > 0 {
			counts[i] = n * s.seriesWeight(uint32(i))
		}
	}
	return counts
}

// lastHeaps are the last heap profile of each process in the selection's
// range, in the order they were read.
func (h *History) lastHeaps(s *selector) []*histHeap {
	last := map[libpf.PID]int{}
	for i, hh := range h.heaps {
		if sec := hh.at.Unix(); sec >= s.fromSec && sec < s.toSec {
			last[hh.pid] = i
		}
	}
	out := make([]*histHeap, 0, len(last))
	for i, hh := range h.heaps {
		if last[hh.pid] == i {
			if sec := hh.at.Unix(); sec >= s.fromSec && sec < s.toSec {
				out = append(out, hh)
			}
		}
	}
	return out
}

// heapValue is the selected bytes of one of a heap profile's series, 0
// where it is not selected.
func (s *selector) heapValue(hh *histHeap, i int) uint64 {
	if !s.series(hh.series[i]) {
		return 0
	}
	if s.sel.Measure == MeasureAlloc {
		return hh.alloc[i]
	}
	return hh.inuse[i]
}

// heapCounts counts the bytes of each process's last heap profile in the
// selection's range per series.
func (h *History) heapCounts(sel *Selection) []uint64 {
	s := h.selector(sel)
	counts := make([]uint64, len(h.tab.series))
	if len(sel.Traces) > 0 {
		// A heap profile's sites are in no trace.
		return counts
	}
	for _, hh := range h.lastHeaps(s) {
		for i, sr := range hh.series {
			counts[sr] += s.heapValue(hh, i)
		}
	}
	return counts
}

// heapTimeline fills counts, buckets of step seconds from fromSec, with
// the selected bytes of the processes' heap profiles: each bucket holds
// the sum of every process's last profile read before its end, those read
// before the range included. A profile stands until its process's next,
// or for twice the time since the one before it (3 minutes after a
// process's first), so that a process that exited stops counting.
func (h *History) heapTimeline(sel *Selection, fromSec, stepSecs int64, counts []uint64) {
	s := h.selector(sel)
	type reading struct {
		bytes         uint64
		at, untilSecs int64
	}
	cur := map[libpf.PID]reading{}
	next := 0
	for b := range counts {
		end := fromSec + int64(b+1)*stepSecs
		for ; next < len(h.heaps) && h.heaps[next].at.Unix() < end; next++ {
			hh := h.heaps[next]
			r := reading{at: hh.at.Unix(), untilSecs: hh.at.Unix() + 180}
			if prev, ok := cur[hh.pid]; ok {
				r.untilSecs = r.at + 2*max(r.at-prev.at, 1)
			}
			for i := range hh.series {
				r.bytes += s.heapValue(hh, i)
			}
			cur[hh.pid] = r
		}
		var sum uint64
		for pid, r := range cur {
			if r.untilSecs < end-stepSecs {
				delete(cur, pid)
				continue
			}
			sum += r.bytes
		}
		counts[b] = sum
	}
}

// subtreeTotals turns per-node counts into the totals of the subtrees:
// children come after their parents, so one backward pass adds them up.
func subtreeTotals(tree []treeNode, self []uint64) []uint64 {
	total := slices.Clone(self)
	for n := len(total) - 1; n > 0; n-- {
		total[tree[n].parent] += total[n]
	}
	return total
}

// Timeline counts the selected samples per step from start, in at most
// maxBuckets buckets of whole seconds over the selection's range (or the
// history's, where the selection leaves it open).
func (h *History) Timeline(sel Selection, maxBuckets int) (start time.Time, step time.Duration, counts []uint64) {
	maxBuckets = max(maxBuckets, 1)
	h.mu.RLock()
	defer h.mu.RUnlock()
	first, last := h.span()
	if first.IsZero() {
		return time.Time{}, time.Second, nil
	}
	from, to := sel.From, sel.To
	if from.IsZero() {
		from = first.Truncate(time.Second)
	}
	if to.IsZero() {
		to = last
	}
	secs := max(int64(to.Sub(from)+time.Second-1)/int64(time.Second), 1)
	stepSecs := max((secs+int64(maxBuckets)-1)/int64(max(maxBuckets, 1)), 1)
	counts = make([]uint64, (secs+stepSecs-1)/stepSecs)
	fromSec := (from.UnixMilli() + 999) / 1000
	start = time.Unix(fromSec, 0)
	if sel.Measure.memory() {
		h.heapTimeline(&sel, fromSec, stepSecs, counts)
		return start, time.Duration(stepSecs) * time.Second, counts
	}
	h.each(&sel, func(_ *histSeries, n uint64, sec int64) {
		if b := (sec - fromSec) / stepSecs; b >= 0 && b < int64(len(counts)) {
			counts[b] += n
		}
	})
	return start, time.Duration(stepSecs) * time.Second, counts
}

// FilterValue is one value a filter can take and how many samples have it.
type FilterValue struct {
	Name      string
	PID       libpf.PID // processes only
	Container string    // processes only
	Samples   uint64
}

// FilterValues are the values the filters offer in a time range.
type FilterValues struct {
	Processes, Threads, Containers, Kinds []FilterValue
	// Pods are "namespace/name".
	Pods, Namespaces, Services []FilterValue
	// Labels are "key=value".
	Labels []FilterValue
}

// Filters lists the processes, thread names, containers and frame types of
// the samples in the selection's time range (its other fields are
// ignored), each by samples, at most limit of each.
func (h *History) Filters(sel Selection, limit int) FilterValues {
	limit = max(limit, 0)
	h.mu.RLock()
	defer h.mu.RUnlock()
	timeOnly := Selection{From: sel.From, To: sel.To, Measure: sel.Measure}
	byMeta := make([]uint64, len(h.tab.metas))
	byStack := make([]uint64, len(h.tab.stacks))
	for i, n := range h.seriesCounts(&timeOnly) {
		sr := &h.tab.series[i]
		byMeta[sr.meta] += n
		byStack[sr.stack] += n
	}
	procs := make(map[FilterValue]uint64)
	threads := make(map[string]uint64)
	containers := make(map[string]uint64)
	labels := make(map[string]uint64)
	pods, namespaces, services := make(map[string]uint64), make(map[string]uint64), make(map[string]uint64)
	for i, n := range byMeta {
		if n == 0 {
			continue
		}
		m := &h.tab.metas[i]
		procs[FilterValue{Name: m.process, PID: m.pid, Container: m.container}] += n
		threads[m.thread] += n
		if m.container != "" {
			containers[m.container] += n
		}
		for k, v := range m.labels.All() {
			labels[k+"="+v] += n
		}
		if m.pod != "" {
			pods[m.pod] += n
		}
		if m.namespace != "" {
			namespaces[m.namespace] += n
		}
		if m.service != "" {
			services[m.service] += n
		}
	}
	// A stack counts once for each kind of frame it has: kinds are few,
	// so a bit set per stack.
	var kindNames []string
	kindBit := make(map[string]uint64)
	kindsOfFunc := make([]uint64, len(h.tab.funcs))
	for i := range h.tab.funcs {
		k := h.tab.funcs[i].kind
		bit, ok := kindBit[k]
		if !ok && len(kindNames) < 64 {
			bit = 1 << len(kindNames)
			kindBit[k] = bit
			kindNames = append(kindNames, k)
		}
		kindsOfFunc[i] = bit
	}
	kindCounts := make([]uint64, len(kindNames))
	for stack, n := range byStack {
		if n == 0 {
			continue
		}
		var set uint64
		for _, f := range h.tab.stacks[stack].frames {
			set |= kindsOfFunc[h.tab.frameFn[f]]
		}
		for b := range kindNames {
			if set&(1<<b) != 0 {
				kindCounts[b] += n
			}
		}
	}
	kinds := make(map[string]uint64)
	for b, n := range kindCounts {
		if n > 0 {
			kinds[kindNames[b]] = n
		}
	}
	var fv FilterValues
	for v, n := range procs {
		v.Samples = n
		fv.Processes = append(fv.Processes, v)
	}
	fv.Threads = namedValues(threads)
	fv.Containers = namedValues(containers)
	fv.Kinds = namedValues(kinds)
	fv.Labels = namedValues(labels)
	fv.Pods, fv.Namespaces, fv.Services = namedValues(pods), namedValues(namespaces), namedValues(services)
	for _, l := range []*[]FilterValue{&fv.Processes, &fv.Threads, &fv.Containers, &fv.Kinds, &fv.Labels, &fv.Pods,
		&fv.Namespaces, &fv.Services} {
		slices.SortFunc(*l, func(a, b FilterValue) int {
			return cmp.Or(cmp.Compare(b.Samples, a.Samples), cmp.Compare(a.Name, b.Name), cmp.Compare(a.PID, b.PID))
		})
		*l = (*l)[:min(len(*l), limit)]
	}
	return fv
}

func namedValues(m map[string]uint64) []FilterValue {
	out := make([]FilterValue, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, FilterValue{Name: k, Samples: m[k]})
	}
	return out
}

// FlameQuery asks for the call tree of a selection.
type FlameQuery struct {
	Selection Selection
	// Baseline, when set, is counted beside the selection (BaseTotal,
	// BaseSelf) for a differential view.
	Baseline *Selection
	// Focus is the path of node ids from below the root to the node the
	// tree is rooted at; empty for the whole tree.
	Focus []uint64
	// MinShare leaves out nodes with a smaller share of the root's samples
	// (of the selection's or the baseline's, whichever is larger).
	MinShare float64
	// MaxNodes bounds the nodes returned; MinShare is raised to stay
	// under it. Zero means no bound.
	MaxNodes int
	// Search marks the nodes whose function or file name contains it,
	// case-insensitively, and counts the samples with such a frame.
	Search string
	// GroupBy, when set (ValidGroupBy), puts a level of groups between the
	// root and the executables: one node per container, thread name or
	// value of a label.
	GroupBy string
}

// FlameNode is one node of a call tree.
type FlameNode struct {
	// ID names the node's function; a path of them names the node.
	ID     uint64
	Parent int32 // index of the parent node, -1 for the root
	Kind   string
	Name   string
	File   string
	// Line is the line all of the node's frames were on, else 0.
	Line                uint32
	Total, Self         uint64
	BaseTotal, BaseSelf uint64
	Match               bool
}

// FlameGraph is a pruned call tree: Nodes in depth-first pre-order,
// siblings by name, the root first.
type FlameGraph struct {
	Nodes []FlameNode
	// Path is the root's ancestry from "all", for the breadcrumb; the root
	// itself is the last element.
	Path []FlameNode
	// Total and BaseTotal are the root's samples in the selection and the
	// baseline; Matched counts the selection's samples under the root with
	// a frame Search matched.
	Total, BaseTotal, Matched uint64
	// Pruned counts the subtrees left out below the nodes returned.
	Pruned int
}

// flameCounts are one query's counts over the history's call tree.
type flameCounts struct {
	tab                            *histTables
	self, total, baseSelf, baseTot []uint64
}

// Flame builds the call tree of q's selection.
func (h *History) Flame(q FlameQuery) FlameGraph {
	h.mu.RLock()
	defer h.mu.RUnlock()
	fc := &flameCounts{tab: h.tab}
	if q.GroupBy != "" {
		var base []uint64
		if q.Baseline != nil {
			base = h.seriesCounts(q.Baseline)
		}
		var selfs [][]uint64
		fc.tab, selfs = h.tab.grouped(q.GroupBy, h.seriesCounts(&q.Selection), base)
		fc.self, fc.baseSelf = selfs[0], selfs[1]
	} else {
		fc.self = h.nodeCounts(&q.Selection)
		if q.Baseline != nil {
			fc.baseSelf = h.nodeCounts(q.Baseline)
		}
	}
	fc.total = subtreeTotals(fc.tab.tree, fc.self)
	if fc.baseSelf != nil {
		fc.baseTot = subtreeTotals(fc.tab.tree, fc.baseSelf)
	}
	var g FlameGraph
	root, path := fc.find(q.Focus)
	g.Path = path
	if root < 0 {
		return g
	}
	g.Total = fc.total[root]
	if fc.baseTot != nil {
		g.BaseTotal = fc.baseTot[root]
	}
	m := newFuncMatcher(fc.tab, q.Search)
	g.Matched = fc.matched(uint32(root), m)
	g.Nodes, g.Pruned = fc.prune(uint32(root), q.MinShare, q.MaxNodes, m)
	return g
}

// find follows a focus path of function ids down from the root. It returns
// -1 when the path is not in the tree, and the path's nodes from "all".
func (fc *flameCounts) find(focus []uint64) (int64, []FlameNode) {
	path := []FlameNode{{Kind: KindRoot, Name: "all", Parent: -1}}
	cur := uint32(0)
	for _, id := range focus {
		next := uint32(0)
		for c := fc.tab.tree[cur].child; c != 0; c = fc.tab.tree[c].next {
			if fc.tab.funcID[fc.tab.tree[c].function()] == id && fc.weight(c) > 0 {
				next = c
				break
			}
		}
		if next == 0 {
			return -1, path
		}
		cur = next
		path = append(path, fc.node(cur, int32(len(path)-1), nil))
	}
	return int64(cur), path
}

// weight is a node's larger share of the selection's and the baseline's
// samples; zero when neither has any there.
func (fc *flameCounts) weight(n uint32) float64 {
	w := 0.0
	if t := fc.total[0]; t > 0 {
		w = float64(fc.total[n]) / float64(t)
	}
	if fc.baseTot != nil && fc.baseTot[0] > 0 {
		w = max(w, float64(fc.baseTot[n])/float64(fc.baseTot[0]))
	}
	return w
}

func (fc *flameCounts) node(n uint32, parent int32, m *funcMatcher) FlameNode {
	out := FlameNode{Kind: KindRoot, Name: "all", Parent: parent, Total: fc.total[n], Self: fc.self[n]}
	if n != 0 {
		tn := &fc.tab.tree[n]
		fi := tn.function()
		f := &fc.tab.funcs[fi]
		out.ID, out.Kind, out.Name, out.File, out.Match = fc.tab.funcID[fi], f.kind, f.name, f.file, m.match(fi)
		if tn.line != mixedLines {
			out.Line = tn.line
		}
	}
	if fc.baseTot != nil {
		out.BaseTotal, out.BaseSelf = fc.baseTot[n], fc.baseSelf[n]
	}
	return out
}

// matched counts the samples under root whose path from root has a frame
// the matcher matches.
func (fc *flameCounts) matched(root uint32, m *funcMatcher) uint64 {
	if m.needle == "" {
		return 0
	}
	var sum uint64
	var walk func(n uint32)
	walk = func(n uint32) {
		if n != 0 && m.match(fc.tab.tree[n].function()) {
			sum += fc.total[n]
			return
		}
		for c := fc.tab.tree[n].child; c != 0; c = fc.tab.tree[c].next {
			if fc.total[c] > 0 {
				walk(c)
			}
		}
	}
	walk(root)
	return sum
}

// prune keeps the nodes under root with at least minShare of its samples
// (in the selection or the baseline), at most maxNodes of them, and orders
// them depth-first with siblings by name.
func (fc *flameCounts) prune(root uint32, minShare float64, maxNodes int, m *funcMatcher) ([]FlameNode, int) {
	// Shares of the response's root, not of "all".
	rootW := fc.weight(root)
	keep := func(n uint32, threshold float64) bool {
		return fc.weight(n) > 0 && (rootW == 0 || fc.weight(n)/rootW >= threshold)
	}
	threshold := minShare
	if maxNodes > 0 {
		// A child never outweighs its parent, so the nodes over a
		// threshold are a tree: collect the candidates' weights and
		// raise the threshold until at most maxNodes remain.
		var ws []float64
		var walk func(n uint32)
		walk = func(n uint32) {
			ws = append(ws, fc.weight(n))
			for c := fc.tab.tree[n].child; c != 0; c = fc.tab.tree[c].next {
				if keep(c, threshold) {
					walk(c)
				}
			}
		}
		walk(root)
		if len(ws) > maxNodes {
			// Above the weight of the (maxNodes+1)-th heaviest: at most
			// maxNodes, fewer when nodes tie at the cut.
			slices.Sort(ws)
			threshold = max(threshold, nextAfter(ws[len(ws)-maxNodes-1])/max(rootW, 1e-300))
		}
	}
	var out []FlameNode
	pruned := 0
	var visit func(n uint32, parent int32)
	visit = func(n uint32, parent int32) {
		idx := int32(len(out))
		out = append(out, fc.node(n, parent, m))
		var kids []uint32
		for c := fc.tab.tree[n].child; c != 0; c = fc.tab.tree[c].next {
			switch {
			case keep(c, threshold):
				kids = append(kids, c)
			case fc.weight(c) > 0:
				pruned++
			}
		}
		slices.SortFunc(kids, func(a, b uint32) int {
			fa, fb := &fc.tab.funcs[fc.tab.tree[a].function()], &fc.tab.funcs[fc.tab.tree[b].function()]
			return cmp.Or(cmp.Compare(fa.name, fb.name), cmp.Compare(fa.kind, fb.kind), cmp.Compare(fa.file, fb.file))
		})
		for _, c := range kids {
			visit(c, idx)
		}
	}
	visit(root, -1)
	return out, pruned
}

// nextAfter is a weight just above f, so that ties at the cut are left out
// rather than exceeding the bound.
func nextAfter(f float64) float64 { return f + f*1e-12 + 1e-300 }

// funcMatcher decides once per function whether Search matches it.
type funcMatcher struct {
	tab    *histTables
	needle string
	memo   []int8 // per function: 0 unknown, 1 matches, -1 not
}

func newFuncMatcher(tab *histTables, search string) *funcMatcher {
	m := &funcMatcher{tab: tab, needle: strings.ToLower(search)}
	if m.needle != "" {
		m.memo = make([]int8, len(tab.funcs))
	}
	return m
}

func (m *funcMatcher) match(fn uint32) bool {
	if m == nil || m.needle == "" {
		return false
	}
	if v := m.memo[fn]; v != 0 {
		return v > 0
	}
	f := &m.tab.funcs[fn]
	v := strings.Contains(strings.ToLower(f.name), m.needle) || strings.Contains(strings.ToLower(f.file), m.needle)
	m.memo[fn] = boolInt8(v)
	return v
}

// TopFunction is one row of the top functions table.
type TopFunction struct {
	ID                  uint64
	Kind, Name, File    string
	Self, Total         uint64
	BaseSelf, BaseTotal uint64
}

// TopFunctions ranks the functions of sel by self samples (the function
// was the leaf) or, with byTotal, by total samples (anywhere on the stack,
// once per sample), the first limit of them; base, when set, is counted
// beside. total and baseTotal are the selections' samples.
func (h *History) TopFunctions(sel Selection, base *Selection, byTotal bool, limit int) (rows []TopFunction, total, baseTotal uint64) {
	limit = max(limit, 1)
	h.mu.RLock()
	defer h.mu.RUnlock()
	nf := len(h.tab.funcs)
	// Per function: self, total, baseline self, baseline total.
	acc := make([][4]uint64, nf)
	count := func(sel *Selection, col int) uint64 {
		self := h.nodeCounts(sel)
		tot := subtreeTotals(h.tab.tree, self)
		for n := 1; n < len(self); n++ {
			if tot[n] == 0 {
				continue
			}
			tn := &h.tab.tree[n]
			a := &acc[tn.function()]
			a[col] += self[n]
			// Below an ancestor of the same function, its samples are
			// in that ancestor's total already.
			if tn.fn&recursive == 0 {
				a[col+1] += tot[n]
			}
		}
		return tot[0]
	}
	total = count(&sel, 0)
	if base != nil {
		baseTotal = count(base, 2)
	}
	col := 0
	if byTotal {
		col = 1
	}
	key := func(fi uint32) uint64 { return max(acc[fi][col], acc[fi][col+2]) }
	// Higher key first, then by name: the order of the table.
	before := func(a, b uint32) int {
		if c := cmp.Compare(key(b), key(a)); c != 0 {
			return c
		}
		fa, fb := &h.tab.funcs[a], &h.tab.funcs[b]
		return cmp.Or(cmp.Compare(fa.name, fb.name), cmp.Compare(fa.file, fb.file))
	}
	// The first limit of some 100,000 functions: a heap of the best so
	// far, its worst on top, costs a comparison for most functions.
	best := &topHeap{less: func(a, b uint32) bool { return before(a, b) > 0 }}
	for fi := range acc {
		kind := h.tab.funcs[fi].kind
		if acc[fi][1] == 0 && acc[fi][3] == 0 || kind == KindProcess || kind == KindTruncated {
			continue
		}
		switch {
		case best.Len() < limit:
			heap.Push(best, uint32(fi))
		case before(uint32(fi), best.fns[0]) < 0:
			best.fns[0] = uint32(fi)
			heap.Fix(best, 0)
		}
	}
	fns := best.fns
	slices.SortFunc(fns, before)
	for _, fi := range fns {
		f, a := &h.tab.funcs[fi], &acc[fi]
		rows = append(rows, TopFunction{ID: h.tab.funcID[fi], Kind: f.kind, Name: f.name, File: f.file,
			Self: a[0], Total: a[1], BaseSelf: a[2], BaseTotal: a[3]})
	}
	return rows, total, baseTotal
}

// topHeap is a container/heap of function indexes.
type topHeap struct {
	fns  []uint32
	less func(a, b uint32) bool
}

func (t *topHeap) Len() int           { return len(t.fns) }
func (t *topHeap) Less(i, j int) bool { return t.less(t.fns[i], t.fns[j]) }
func (t *topHeap) Swap(i, j int)      { t.fns[i], t.fns[j] = t.fns[j], t.fns[i] }
func (t *topHeap) Push(x any)         { t.fns = append(t.fns, x.(uint32)) }
func (t *topHeap) Pop() any {
	x := t.fns[len(t.fns)-1]
	t.fns = t.fns[:len(t.fns)-1]
	return x
}

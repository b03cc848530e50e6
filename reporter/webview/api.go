package webview

import (
	"net/http"
	"strconv"

	"github.com/hostprof/ebpf-profiler/reporter"
)

// The JSON shapes of api.md.

type summaryJSON struct {
	Host             string   `json:"host"`
	Version          string   `json:"version"`
	SamplesPerSecond int      `json:"samplesPerSecond"`
	IntervalSeconds  float64  `json:"intervalSeconds"`
	Start            int64    `json:"start"`
	End              int64    `json:"end"`
	Samples          uint64   `json:"samples"`
	Intervals        int      `json:"intervals"`
	DroppedIntervals uint64   `json:"droppedIntervals"`
	Bytes            int64    `json:"bytes"`
	MaxBytes         int64    `json:"maxBytes"`
	MaxAgeSeconds    float64  `json:"maxAgeSeconds"`
	Kinds            []string `json:"kinds"`
	// OffCPU says off-CPU time is held (measure=offcpu and wall);
	// OffCPUUnitNs is what one count of those measures stands for.
	OffCPU       bool  `json:"offCPU"`
	OffCPUUnitNs int64 `json:"offCPUUnitNs"`
	// HeapProfiles counts the heap profiles held (measure=inuse and
	// alloc, counted in bytes).
	HeapProfiles int `json:"heapProfiles"`
}

func (s *Server) summary(w http.ResponseWriter, r *http.Request) {
	if _, err := parseParams(r.URL.RawQuery); err != nil {
		fail(w, err)
		return
	}
	st := s.cfg.History.Stats()
	out := summaryJSON{
		Host:             s.cfg.Host,
		Version:          s.cfg.Version,
		SamplesPerSecond: s.cfg.SamplesPerSecond,
		IntervalSeconds:  s.cfg.Interval.Seconds(),
		Samples:          st.Samples,
		Intervals:        st.Intervals,
		DroppedIntervals: st.DroppedIntervals,
		Bytes:            st.Bytes,
		MaxBytes:         st.MaxBytes,
		MaxAgeSeconds:    st.MaxAge.Seconds(),
		Kinds:            nonNil(st.Kinds),
		OffCPU:           st.OffCPU,
		OffCPUUnitNs:     int64(reporter.OffCPUUnit),
		HeapProfiles:     st.HeapProfiles,
	}
	if st.Intervals > 0 || st.HeapProfiles > 0 {
		out.Start, out.End = st.Start.UnixMilli(), st.End.UnixMilli()
	}
	s.writeJSON(w, r, out)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

type timelineJSON struct {
	Start  int64    `json:"start"`
	Step   int64    `json:"step"`
	Counts []uint64 `json:"counts"`
}

func (s *Server) timeline(w http.ResponseWriter, r *http.Request) {
	p, sel, _, ok := readRequest(w, r, false, "buckets")
	if !ok {
		return
	}
	buckets, err := p.int("buckets", defaultBuckets, 1, maxBuckets)
	if err != nil {
		fail(w, err)
		return
	}
	start, step, counts := s.cfg.History.Timeline(sel, buckets)
	out := timelineJSON{Step: step.Milliseconds(), Counts: nonNil(counts)}
	if !start.IsZero() {
		out.Start = start.UnixMilli()
	}
	s.writeJSON(w, r, out)
}

type processJSON struct {
	Name      string `json:"name"`
	PID       uint32 `json:"pid"`
	Container string `json:"container"`
	Samples   uint64 `json:"samples"`
}

type namedJSON struct {
	Name    string `json:"name"`
	Samples uint64 `json:"samples"`
}

type containerJSON struct {
	ID      string `json:"id"`
	Samples uint64 `json:"samples"`
}

type filtersJSON struct {
	Processes  []processJSON   `json:"processes"`
	Threads    []namedJSON     `json:"threads"`
	Containers []containerJSON `json:"containers"`
	Kinds      []namedJSON     `json:"kinds"`
	// Pods are "namespace/name".
	Pods       []namedJSON `json:"pods"`
	Namespaces []namedJSON `json:"namespaces"`
	Services   []namedJSON `json:"services"`
	// Labels are "key=value".
	Labels []namedJSON `json:"labels"`
}

func (s *Server) filters(w http.ResponseWriter, r *http.Request) {
	_, sel, _, ok := readRequest(w, r, false)
	if !ok {
		return
	}
	fv := s.cfg.History.Filters(sel, maxFilterValues)
	out := filtersJSON{Processes: []processJSON{}, Containers: []containerJSON{}, Threads: named(fv.Threads),
		Kinds: named(fv.Kinds), Labels: named(fv.Labels), Pods: named(fv.Pods), Namespaces: named(fv.Namespaces),
		Services: named(fv.Services)}
	for _, v := range fv.Processes {
		out.Processes = append(out.Processes, processJSON{v.Name, uint32(v.PID), v.Container, v.Samples})
	}
	for _, v := range fv.Containers {
		out.Containers = append(out.Containers, containerJSON{v.Name, v.Samples})
	}
	s.writeJSON(w, r, out)
}

// named lists filter values by name; [] for none.
func named(vs []reporter.FilterValue) []namedJSON {
	out := make([]namedJSON, 0, len(vs))
	for _, v := range vs {
		out = append(out, namedJSON{v.Name, v.Samples})
	}
	return out
}

type pathJSON struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Kind string `json:"kind"`
}

// nodesJSON holds the nodes as columns: a tree of 50,000 nodes is then a
// few hundred kilobytes, not megabytes of repeated keys.
type nodesJSON struct {
	ID        []string `json:"id"`
	Parent    []int32  `json:"parent"`
	Name      []int    `json:"name"`
	Kind      []int    `json:"kind"`
	File      []int    `json:"file"`
	Line      []uint32 `json:"line"`
	Total     []uint64 `json:"total"`
	Self      []uint64 `json:"self"`
	Match     []bool   `json:"match"`
	BaseTotal []uint64 `json:"baseTotal,omitempty"`
	BaseSelf  []uint64 `json:"baseSelf,omitempty"`
}

type flameJSON struct {
	Total     uint64     `json:"total"`
	BaseTotal *uint64    `json:"baseTotal,omitempty"`
	Path      []pathJSON `json:"path"`
	Strings   []string   `json:"strings"`
	Kinds     []string   `json:"kinds"`
	Nodes     nodesJSON  `json:"nodes"`
	Matched   uint64     `json:"matched"`
	Pruned    int        `json:"pruned"`
}

// interner numbers strings in order of first use.
type interner struct {
	list []string
	idx  map[string]int
}

func (in *interner) id(s string) int {
	if i, ok := in.idx[s]; ok {
		return i
	}
	i := len(in.list)
	in.list = append(in.list, s)
	in.idx[s] = i
	return i
}

func nodeID(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 16)
}

func (s *Server) flame(w http.ResponseWriter, r *http.Request) {
	p, sel, base, ok := readRequest(w, r, true, "focus", "minShare", "search", "group")
	if !ok {
		return
	}
	q := reporter.FlameQuery{Selection: sel, Baseline: base, MaxNodes: maxFlameNodes}
	group, _, err := p.one("group")
	if err == nil && !reporter.ValidGroupBy(group) {
		err = &badParam{"group", "want container, pod, namespace, service, thread or label:KEY"}
	}
	if err != nil {
		fail(w, err)
		return
	}
	q.GroupBy = group
	if q.Focus, err = p.focus(); err != nil {
		fail(w, err)
		return
	}
	if q.MinShare, err = p.float("minShare", defaultMinShare, 0, 1); err != nil {
		fail(w, err)
		return
	}
	search, _, err := p.one("search")
	if err != nil {
		fail(w, err)
		return
	}
	if len(search) > maxSearchBytes {
		fail(w, &badParam{"search", "longer than 200 bytes"})
		return
	}
	q.Search = search
	g := s.cfg.History.Flame(q)
	s.writeJSON(w, r, flameResponse(&g, q.Baseline != nil))
}

func flameResponse(g *reporter.FlameGraph, diff bool) *flameJSON {
	strs := &interner{idx: make(map[string]int)}
	kinds := &interner{idx: make(map[string]int)}
	out := &flameJSON{Total: g.Total, Matched: g.Matched, Pruned: g.Pruned}
	if diff {
		out.BaseTotal = &g.BaseTotal
	}
	for _, n := range g.Path {
		out.Path = append(out.Path, pathJSON{nodeID(n.ID), n.Name, n.Kind})
	}
	nn := len(g.Nodes)
	ns := &out.Nodes
	ns.ID, ns.Parent = make([]string, nn), make([]int32, nn)
	ns.Name, ns.Kind, ns.File = make([]int, nn), make([]int, nn), make([]int, nn)
	ns.Line, ns.Total, ns.Self, ns.Match = make([]uint32, nn), make([]uint64, nn), make([]uint64, nn), make([]bool, nn)
	if diff {
		ns.BaseTotal, ns.BaseSelf = make([]uint64, nn), make([]uint64, nn)
	}
	for i, n := range g.Nodes {
		ns.ID[i], ns.Parent[i] = nodeID(n.ID), n.Parent
		ns.Name[i], ns.Kind[i], ns.File[i] = strs.id(n.Name), kinds.id(n.Kind), -1
		if n.File != "" {
			ns.File[i] = strs.id(n.File)
		}
		ns.Line[i], ns.Total[i], ns.Self[i], ns.Match[i] = n.Line, n.Total, n.Self, n.Match
		if diff {
			ns.BaseTotal[i], ns.BaseSelf[i] = n.BaseTotal, n.BaseSelf
		}
	}
	out.Strings, out.Kinds = nonNil(strs.list), nonNil(kinds.list)
	return out
}

type topRowJSON struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Kind      string  `json:"kind"`
	File      string  `json:"file"`
	Self      uint64  `json:"self"`
	Total     uint64  `json:"total"`
	BaseSelf  *uint64 `json:"baseSelf,omitempty"`
	BaseTotal *uint64 `json:"baseTotal,omitempty"`
}

type topJSON struct {
	Total     uint64       `json:"total"`
	BaseTotal *uint64      `json:"baseTotal,omitempty"`
	Rows      []topRowJSON `json:"rows"`
}

func (s *Server) top(w http.ResponseWriter, r *http.Request) {
	p, sel, base, ok := readRequest(w, r, true, "sort", "limit")
	if !ok {
		return
	}
	limit, err := p.int("limit", defaultTopRows, 1, maxTopRows)
	if err != nil {
		fail(w, err)
		return
	}
	sortBy, _, err := p.one("sort")
	if err == nil && sortBy != "" && sortBy != "self" && sortBy != "total" {
		err = &badParam{"sort", "want self or total"}
	}
	if err != nil {
		fail(w, err)
		return
	}
	rows, total, baseTotal := s.cfg.History.TopFunctions(sel, base, sortBy == "total", limit)
	out := topJSON{Total: total, Rows: []topRowJSON{}}
	if base != nil {
		out.BaseTotal = &baseTotal
	}
	for i := range rows {
		row := &rows[i]
		j := topRowJSON{ID: nodeID(row.ID), Name: row.Name, Kind: row.Kind, File: row.File, Self: row.Self, Total: row.Total}
		if base != nil {
			j.BaseSelf, j.BaseTotal = &row.BaseSelf, &row.BaseTotal
		}
		out.Rows = append(out.Rows, j)
	}
	s.writeJSON(w, r, out)
}

package reporter

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/libpf"
)

func newTestHistory(t testing.TB, cfg HistoryConfig) *History {
	t.Helper()
	h, err := NewHistory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

const testPeriod = int64(time.Second / 20)

// flameShape renders a tree as indented "name total/self" lines, for
// comparing whole trees.
func flameShape(g FlameGraph) string {
	var sb strings.Builder
	depth := make([]int, len(g.Nodes))
	for i, n := range g.Nodes {
		if n.Parent >= 0 {
			depth[i] = depth[n.Parent] + 1
		}
		fmt.Fprintf(&sb, "%s%s %d/%d", strings.Repeat("  ", depth[i]), n.Name, n.Total, n.Self)
		if n.BaseTotal > 0 || n.BaseSelf > 0 {
			fmt.Fprintf(&sb, " base %d/%d", n.BaseTotal, n.BaseSelf)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

func TestHistoryFlameOfFixture(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	h.add(f.interval(), testPeriod)
	g := h.Flame(FlameQuery{})
	want := `all 13/0
  app-a 7/0
    main.main 7/0
      app-a+0x600 3/3
      write 4/0
        do_syscall_64 4/0
          copy_user 4/4
  app-b 6/0
    main 6/0
      [unwinding aborted: error 3] 2/2
      write 4/0
        do_syscall_64 4/0
          copy_user 4/4
`
	if got := flameShape(g); got != want {
		t.Errorf("flame graph:\n%s\nwant:\n%s", got, want)
	}
	if g.Total != 13 || g.Pruned != 0 {
		t.Errorf("total %d pruned %d, want 13 and 0", g.Total, g.Pruned)
	}
	kinds := map[string]string{}
	for _, n := range g.Nodes {
		kinds[n.Name] = n.Kind
		if n.Name == "main.main" && (n.Line != 5 || n.File != "main.go") {
			t.Errorf("main.main at %s:%d, want main.go:5", n.File, n.Line)
		}
		if n.Name == "write" && n.File != "write.c" {
			t.Errorf("write in %q, want write.c", n.File)
		}
	}
	for name, kind := range map[string]string{"all": KindRoot, "app-a": KindProcess, "copy_user": "kernel",
		"write": "native", "[unwinding aborted: error 3]": "abort-marker", "main.main": KindGo, "main": "native"} {
		if kinds[name] != kind {
			t.Errorf("%s has kind %q, want %q", name, kinds[name], kind)
		}
	}
}

func TestHistorySelections(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	h.add(f.interval(), testPeriod)
	for _, tc := range []struct {
		name string
		sel  Selection
		want uint64
	}{
		{"all", Selection{}, 13},
		{"pid", Selection{PIDs: []libpf.PID{200}}, 6},
		{"two pids", Selection{PIDs: []libpf.PID{100, 200}}, 13},
		{"process", Selection{Processes: []string{"app-a"}}, 7},
		{"thread", Selection{Threads: []string{"worker"}}, 1},
		{"container", Selection{Containers: []string{"c0ffee"}}, 6},
		{"kernel frames", Selection{Kinds: []string{"kernel"}}, 8},
		{"abort frames", Selection{Kinds: []string{"abort-marker"}}, 2},
		{"pid and thread", Selection{PIDs: []libpf.PID{100}, Threads: []string{"app-b"}}, 0},
		{"range after", Selection{From: f.end.Add(time.Second)}, 0},
		// One sample arrived late, stamped 100ms before the interval.
		{"range before", Selection{To: f.start}, 1},
		{"range", Selection{From: f.start, To: f.start.Add(time.Second)}, 12},
		{"range with the late sample", Selection{From: f.start.Add(-time.Second), To: f.end}, 13},
	} {
		if got := h.Flame(FlameQuery{Selection: tc.sel}).Total; got != tc.want {
			t.Errorf("%s: %d samples, want %d", tc.name, got, tc.want)
		}
		var buf bytes.Buffer
		if err := h.WritePprof(&buf, tc.sel); err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(&buf)
		if err != nil {
			t.Fatalf("%s: pprof: %v", tc.name, err)
		}
		var n int64
		for _, s := range p.Sample {
			n += s.Value[0]
		}
		if uint64(n) != tc.want {
			t.Errorf("%s: pprof has %d samples, want %d", tc.name, n, tc.want)
		}
	}
}

// The pprof of the whole history counts what the reporter's own file of
// the interval counts, function by function.
func TestHistoryPprofAgreesWithReporter(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	iv := f.interval()
	h.add(iv, testPeriod)
	var buf bytes.Buffer
	if err := h.WritePprof(&buf, Selection{}); err != nil {
		t.Fatal(err)
	}
	got, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.CheckValid(); err != nil {
		t.Fatal(err)
	}
	want := buildPprof(iv, testPeriod)
	if a, b := pprofByStack(got), pprofByStack(want); a != b {
		t.Errorf("history pprof:\n%s\nreporter pprof:\n%s", a, b)
	}
	if got.Period != testPeriod {
		t.Errorf("period %d, want %d", got.Period, testPeriod)
	}
	// The history keeps no thread ids or CPUs: none rather than zeros.
	for _, smp := range got.Sample {
		if _, ok := smp.NumLabel["tid"]; ok || len(smp.NumLabel["pid"]) != 1 {
			t.Fatalf("labels %v", smp.NumLabel)
		}
	}
}

// pprofByStack sums a profile's samples per (process label, function
// stack), sorted.
func pprofByStack(p *profile.Profile) string {
	counts := map[string]int64{}
	for _, s := range p.Sample {
		var names []string
		for _, l := range s.Location {
			for _, ln := range l.Line {
				names = append(names, fmt.Sprintf("%s:%d", ln.Function.Name, ln.Line))
			}
			if len(l.Line) == 0 {
				names = append(names, fmt.Sprintf("%#x", l.Address))
			}
		}
		counts[fmt.Sprint(s.Label["process"], s.NumLabel["pid"], names)] += s.Value[0]
	}
	var lines []string
	for k, v := range counts {
		lines = append(lines, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestHistoryFocusSearchAndDiff(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	h.add(f.interval(), testPeriod)
	all := h.Flame(FlameQuery{})
	id := map[string]uint64{}
	for _, n := range all.Nodes {
		if n.Parent >= 0 && all.Nodes[n.Parent].Name == "app-a" || n.Name == "app-a" {
			id[n.Name] = n.ID
		}
	}
	g := h.Flame(FlameQuery{Focus: []uint64{id["app-a"], id["main.main"]}})
	want := `main.main 7/0
  app-a+0x600 3/3
  write 4/0
    do_syscall_64 4/0
      copy_user 4/4
`
	if got := flameShape(g); got != want {
		t.Errorf("focused:\n%s\nwant:\n%s", got, want)
	}
	if len(g.Path) != 3 || g.Path[0].Name != "all" || g.Path[1].Name != "app-a" || g.Path[2].Name != "main.main" {
		t.Errorf("path %+v, want all > app-a > main.main", g.Path)
	}
	if g := h.Flame(FlameQuery{Focus: []uint64{id["app-a"], 12345}}); g.Total != 0 {
		t.Errorf("a missing focus gives %d samples, want 0", g.Total)
	}

	g = h.Flame(FlameQuery{Search: "WRITE"})
	if g.Matched != 8 {
		t.Errorf("search matched %d samples, want 8", g.Matched)
	}
	for _, n := range g.Nodes {
		if n.Match != (n.Name == "write") {
			t.Errorf("%s: match %v", n.Name, n.Match)
		}
	}
	if g := h.Flame(FlameQuery{Search: "main.go"}); g.Matched != 7 {
		t.Errorf("search by file matched %d samples, want 7", g.Matched)
	}

	// Two processes compared: app-b against app-a.
	g = h.Flame(FlameQuery{Selection: Selection{PIDs: []libpf.PID{200}}, Baseline: &Selection{PIDs: []libpf.PID{100}}})
	if g.Total != 6 || g.BaseTotal != 7 {
		t.Errorf("diff totals %d/%d, want 6/7", g.Total, g.BaseTotal)
	}
	if !strings.Contains(flameShape(g), "  app-a 0/0 base 7/0\n") {
		t.Errorf("the baseline's own nodes are missing:\n%s", flameShape(g))
	}
}

// intervalOf builds an interval from start with n samples of each trace,
// one per 10ms.
func intervalOf(start time.Time, length time.Duration, proc *libpf.ProcessInfo, traces map[*libpf.Trace]int) *interval {
	a := newAggregator(start, defaultMaxSamplesPerInterval)
	for tr, n := range traces {
		for i := range n {
			ts := start.Add(time.Duration(i) * 10 * time.Millisecond)
			a.add(tr, &libpf.SampleMeta{Time: ts, TID: libpf.TID(proc.PID), ThreadName: "t", Process: proc},
				uint64(ts.UnixNano()))
		}
	}
	return a.swap(start.Add(length))
}

// chain is a native trace main -> f1 -> ... -> fn, leaf last in names.
func chain(hash uint64, names ...string) *libpf.Trace {
	t := &libpf.Trace{Hash: libpf.TraceHash{Lo: hash}}
	for i := len(names) - 1; i >= 0; i-- {
		t.Frames = append(t.Frames, libpf.Frame{Kind: libpf.FrameNative, FunctionName: names[i], Address: uint64(i)})
	}
	return t
}

func TestHistoryTimeRangesAndDiff(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	proc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	a, b := chain(1, "main", "serve", "parse"), chain(2, "main", "serve", "render")
	h.add(intervalOf(start, 5*time.Second, proc, map[*libpf.Trace]int{a: 30, b: 10}), testPeriod)
	h.add(intervalOf(start.Add(5*time.Second), 5*time.Second, proc, map[*libpf.Trace]int{a: 10, b: 30}), testPeriod)

	first := Selection{From: start, To: start.Add(5 * time.Second)}
	second := Selection{From: start.Add(5 * time.Second)}
	g := h.Flame(FlameQuery{Selection: second, Baseline: &first})
	want := `all 40/0 base 40/0
  svc 40/0 base 40/0
    main 40/0 base 40/0
      serve 40/0 base 40/0
        parse 10/10 base 30/30
        render 30/30 base 10/10
`
	if got := flameShape(g); got != want {
		t.Errorf("diff of two ranges:\n%s\nwant:\n%s", got, want)
	}

	startT, step, counts := h.Timeline(Selection{}, 100)
	if !startT.Equal(start) || step != time.Second || len(counts) != 10 {
		t.Fatalf("timeline from %v step %v, %d buckets; want %v, 1s, 10", startT, step, len(counts), start)
	}
	// 10ms apart: the 30-sample runs fill the first second, the 10s
	// their first 0.1s.
	if counts[0] != 40 || counts[5] != 40 || counts[1] != 0 {
		t.Errorf("timeline %v", counts)
	}
	_, step, counts = h.Timeline(Selection{}, 3)
	if step != 4*time.Second || len(counts) != 3 || counts[0]+counts[1]+counts[2] != 80 {
		t.Errorf("3 buckets: step %v counts %v", step, counts)
	}

	rows, total, base := h.TopFunctions(second, &first, false, 10)
	if total != 40 || base != 40 || len(rows) != 4 || rows[0].Name != "parse" || rows[0].BaseSelf != 30 {
		t.Errorf("top: total %d base %d rows %+v", total, base, rows)
	}
	rows, _, _ = h.TopFunctions(Selection{}, nil, true, 2)
	if len(rows) != 2 || rows[0].Name != "main" || rows[0].Total != 80 || rows[0].Self != 0 || rows[1].Name != "serve" {
		t.Errorf("top by total: %+v", rows)
	}
}

func TestHistoryTopCountsRecursionOnce(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	proc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	h.add(intervalOf(start, time.Second, proc, map[*libpf.Trace]int{
		chain(1, "main", "walk", "walk", "walk"): 5,
	}), testPeriod)
	rows, total, _ := h.TopFunctions(Selection{}, nil, true, 10)
	// main and walk tie at 5; names break the tie.
	if total != 5 || len(rows) != 2 || rows[1].Name != "walk" || rows[1].Total != 5 || rows[1].Self != 5 {
		t.Errorf("recursion: total %d, %+v", total, rows)
	}
}

func TestHistoryFilters(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	h.add(f.interval(), testPeriod)
	fv := h.Filters(Selection{PIDs: []libpf.PID{1}}, 10)
	if len(fv.Processes) != 2 || fv.Processes[0].Name != "app-a" || fv.Processes[0].Samples != 7 ||
		fv.Processes[1].Container != "c0ffee" {
		t.Errorf("processes %+v (the pid filter must not apply)", fv.Processes)
	}
	if len(fv.Containers) != 1 || fv.Containers[0].Samples != 6 {
		t.Errorf("containers %+v", fv.Containers)
	}
	kinds := map[string]uint64{}
	for _, k := range fv.Kinds {
		kinds[k.Name] = k.Samples
	}
	if kinds["native"] != 13 || kinds["kernel"] != 8 || kinds["abort-marker"] != 2 {
		t.Errorf("kinds %v", kinds)
	}
	if fv := h.Filters(Selection{}, 1); len(fv.Threads) != 1 || fv.Threads[0].Name != "app-a" || fv.Threads[0].Samples != 6 {
		t.Errorf("threads limited to 1: %+v", fv.Threads)
	}
}

func TestHistoryCollapsed(t *testing.T) {
	f := newFixture()
	h := newTestHistory(t, HistoryConfig{})
	h.add(f.interval(), testPeriod)
	var buf bytes.Buffer
	if err := h.WriteCollapsed(&buf, Selection{}); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	slices.Sort(got)
	want := []string{
		"app-a;main.main;app-a+0x600 3",
		"app-a;main.main;write;do_syscall_64;copy_user 4",
		"app-b;main;[unwinding aborted: error 3] 2",
		"app-b;main;write;do_syscall_64;copy_user 4",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("collapsed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// randomIntervals adds n intervals of 1s, each with stacks distinct from
// every other interval's.
func randomIntervals(h *History, start time.Time, n, stacksPer int, rng *rand.Rand) {
	proc := &libpf.ProcessInfo{PID: 9, ExecutableName: "busy"}
	for i := range n {
		traces := map[*libpf.Trace]int{}
		for j := range stacksPer {
			names := []string{"main"}
			for d := range 20 {
				names = append(names, fmt.Sprintf("f%d_%d", d, rng.IntN(50)))
			}
			names = append(names, fmt.Sprintf("leaf_%d_%d", i, j))
			traces[chain(uint64(i*stacksPer+j+1), names...)] = 1 + rng.IntN(3)
		}
		h.add(intervalOf(start.Add(time.Duration(i)*time.Second), time.Second, proc, traces), testPeriod)
	}
}

func TestHistoryBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Unix(1_800_000_000, 0)

	t.Run("age", func(t *testing.T) {
		h := newTestHistory(t, HistoryConfig{MaxAge: 10 * time.Second})
		randomIntervals(h, start, 30, 5, rng)
		s := h.Stats()
		if s.Intervals != 10 || s.DroppedIntervals != 20 || !s.Start.Equal(start.Add(20*time.Second)) {
			t.Errorf("held %d intervals from %v, dropped %d; want 10 from +20s, 20", s.Intervals, s.Start, s.DroppedIntervals)
		}
		if g := h.Flame(FlameQuery{}); g.Total != s.Samples {
			t.Errorf("flame total %d, stats %d", g.Total, s.Samples)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		const limit = 2 << 20
		h := newTestHistory(t, HistoryConfig{MaxBytes: limit})
		randomIntervals(h, start, 200, 50, rng)
		s := h.Stats()
		if s.Bytes > limit || s.DroppedIntervals == 0 || s.Compactions == 0 {
			t.Errorf("%d bytes of %d, dropped %d intervals, %d compactions", s.Bytes, limit, s.DroppedIntervals, s.Compactions)
		}
		if s.Stacks > 50*s.Intervals {
			t.Errorf("%d stacks held for %d intervals of 50: the tables were not rebuilt", s.Stacks, s.Intervals)
		}
		g := h.Flame(FlameQuery{})
		if g.Total != s.Samples || s.Samples+s.DroppedSamples == 0 {
			t.Errorf("flame total %d, stats %d held %d dropped", g.Total, s.Samples, s.DroppedSamples)
		}
		// The newest interval's leaves survived the rebuilds under their
		// names.
		rows, _, _ := h.TopFunctions(Selection{From: start.Add(199 * time.Second)}, nil, false, 1000)
		leaves := 0
		for _, r := range rows {
			if r.Self > 0 && strings.HasPrefix(r.Name, "leaf_199_") {
				leaves++
			}
		}
		if leaves != 50 {
			t.Errorf("newest interval's top has %d of its 50 leaves", leaves)
		}
		t.Logf("%d intervals, %d stacks, %d bytes, %d compactions", s.Intervals, s.Stacks, s.Bytes, s.Compactions)
	})
}

// When every interval has the same stacks, dropping intervals does not
// shrink the tables: the bound still holds, in a few rebuilds per interval.
func TestHistoryBoundWithSameStacks(t *testing.T) {
	const limit = 3 << 20
	h := newTestHistory(t, HistoryConfig{MaxBytes: limit})
	proc := &libpf.ProcessInfo{PID: 3, ExecutableName: "same"}
	traces := map[*libpf.Trace]int{}
	for i := range 3000 {
		traces[chain(uint64(i+1), "main", fmt.Sprintf("f%d", i), fmt.Sprintf("g%d", i))] = 1
	}
	start := time.Unix(1_800_000_000, 0)
	for i := range 150 {
		h.add(intervalOf(start.Add(time.Duration(i)*time.Second), time.Second, proc, traces), testPeriod)
		if s := h.Stats(); s.Bytes > limit {
			t.Fatalf("interval %d: %d bytes of %d", i, s.Bytes, limit)
		}
	}
	s := h.Stats()
	t.Logf("%d intervals held, %d dropped, %d rebuilds, %d bytes", s.Intervals, s.DroppedIntervals, s.Compactions, s.Bytes)
	if s.Intervals == 0 || s.DroppedIntervals == 0 || s.Compactions > 4*s.DroppedIntervals {
		t.Errorf("%d intervals held, %d dropped in %d rebuilds", s.Intervals, s.DroppedIntervals, s.Compactions)
	}
}

func TestHistoryPruning(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	randomIntervals(h, time.Unix(1_800_000_000, 0), 20, 100, rand.New(rand.NewPCG(3, 4)))
	full := h.Flame(FlameQuery{})
	for _, tc := range []struct {
		minShare float64
		maxNodes int
	}{{0, 0}, {0.01, 0}, {0, 500}, {0.001, 100}, {0, 1}} {
		g := h.Flame(FlameQuery{MinShare: tc.minShare, MaxNodes: tc.maxNodes})
		if tc.maxNodes > 0 && len(g.Nodes) > tc.maxNodes {
			t.Errorf("%+v: %d nodes", tc, len(g.Nodes))
		}
		if (len(g.Nodes) < len(full.Nodes)) != (g.Pruned > 0) {
			t.Errorf("%+v: %d nodes of %d, %d subtrees pruned", tc, len(g.Nodes), len(full.Nodes), g.Pruned)
		}
		for i, n := range g.Nodes {
			if i > 0 && (n.Parent < 0 || int(n.Parent) >= i) {
				t.Fatalf("%+v: node %d has parent %d", tc, i, n.Parent)
			}
			if i > 0 && float64(n.Total) < tc.minShare*float64(g.Total) {
				t.Errorf("%+v: node %s has %d of %d", tc, n.Name, n.Total, g.Total)
			}
		}
	}
}

// heapMiB is the live heap after a collection.
func heapMiB() float64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

func BenchmarkHistory(b *testing.B) {
	before := heapMiB()
	h := newTestHistory(b, HistoryConfig{MaxBytes: 1 << 30})
	FillSynthetic(h, BusyHour, time.Unix(1_800_000_000, 0))
	held := heapMiB() - before
	s := h.Stats()
	b.Logf("%d intervals, %d samples, %d stacks, %d frames, %d functions, %d call-tree nodes: %.1f MiB estimated, "+
		"%.1f MiB of heap", s.Intervals, s.Samples, s.Stacks, s.Frames, s.Functions, len(h.tab.tree),
		float64(s.Bytes)/(1<<20), held)
	b.Run("flame", func(b *testing.B) {
		for b.Loop() {
			g := h.Flame(FlameQuery{MinShare: 0.0005, MaxNodes: 50_000})
			b.ReportMetric(float64(len(g.Nodes)), "nodes")
		}
	})
	b.Run("top", func(b *testing.B) {
		for b.Loop() {
			h.TopFunctions(Selection{}, nil, false, 100)
		}
	})
	b.Run("timeline", func(b *testing.B) {
		for b.Loop() {
			h.Timeline(Selection{}, 300)
		}
	})
}

// TestHistoryLabels: samples with a goroutine's labels are listed by
// label, selected by label (values of one key are alternatives, keys must
// all match) and grouped by a label's value at the flame graph's first
// level, in a differential view too.
func TestHistoryLabels(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	proc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	a, b := chain(1, "main", "serve", "parse"), chain(2, "main", "serve", "render")
	labels := func(kv ...string) libpf.Labels {
		var ls []libpf.Label
		for i := 0; i < len(kv); i += 2 {
			ls = append(ls, libpf.Label{Key: kv[i], Value: kv[i+1]})
		}
		return libpf.MakeLabels(ls)
	}
	agg := newAggregator(start, defaultMaxSamplesPerInterval)
	for i, s := range []struct {
		tr     *libpf.Trace
		labels libpf.Labels
		n      int
	}{
		{a, labels("tenant", "alpha", "endpoint", "/a"), 30},
		{b, labels("tenant", "beta", "endpoint", "/b"), 20},
		{b, labels("tenant", "alpha", "endpoint", "/b"), 5},
		{a, libpf.Labels{}, 10},
	} {
		for j := range s.n {
			ts := start.Add(time.Duration(100*i+j) * time.Millisecond)
			agg.add(s.tr, &libpf.SampleMeta{Time: ts, TID: 7, ThreadName: "t", Process: proc, Labels: s.labels},
				uint64(ts.UnixNano()))
		}
	}
	h.add(agg.swap(start.Add(5*time.Second)), testPeriod)

	fv := h.Filters(Selection{}, 10)
	got := map[string]uint64{}
	for _, v := range fv.Labels {
		got[v.Name] = v.Samples
	}
	if want := map[string]uint64{"tenant=alpha": 35, "tenant=beta": 20, "endpoint=/a": 30, "endpoint=/b": 25}; !maps.Equal(got, want) {
		t.Errorf("label filter values %v, want %v", got, want)
	}
	for _, c := range []struct {
		labels []libpf.Label
		want   uint64
	}{
		{[]libpf.Label{{Key: "tenant", Value: "alpha"}}, 35},
		{[]libpf.Label{{Key: "tenant", Value: "alpha"}, {Key: "tenant", Value: "beta"}}, 55},
		{[]libpf.Label{{Key: "tenant", Value: "alpha"}, {Key: "endpoint", Value: "/b"}}, 5},
		{[]libpf.Label{{Key: "nope", Value: "x"}}, 0},
	} {
		if g := h.Flame(FlameQuery{Selection: Selection{Labels: c.labels}}); g.Total != c.want {
			t.Errorf("selection %v: %d samples, want %d", c.labels, g.Total, c.want)
		}
	}

	g := h.Flame(FlameQuery{GroupBy: GroupByLabelPrefix + "tenant"})
	want := `all 65/0
  tenant unset 10/0
    svc 10/0
      main 10/0
        serve 10/0
          parse 10/10
  tenant=alpha 35/0
    svc 35/0
      main 35/0
        serve 35/0
          parse 30/30
          render 5/5
  tenant=beta 20/0
    svc 20/0
      main 20/0
        serve 20/0
          render 20/20
`
	if got := flameShape(g); got != want {
		t.Errorf("grouped by tenant:\n%s\nwant:\n%s", got, want)
	}
	// Focus on one group, then a node under it, by id.
	var alpha, alphaSvc FlameNode
	for _, n := range g.Nodes {
		switch {
		case n.Name == "tenant=alpha":
			alpha = n
		case n.Name == "svc" && g.Nodes[n.Parent].Name == "tenant=alpha":
			alphaSvc = n
		}
	}
	if alpha.Kind != KindGroup {
		t.Fatalf("group node %+v", alpha)
	}
	fg := h.Flame(FlameQuery{GroupBy: GroupByLabelPrefix + "tenant", Focus: []uint64{alpha.ID, alphaSvc.ID}, Search: "render"})
	if fg.Total != 35 || fg.Matched != 5 || len(fg.Path) != 3 || fg.Path[1].Name != "tenant=alpha" {
		t.Errorf("focus on tenant=alpha/svc: total %d matched %d path %+v", fg.Total, fg.Matched, fg.Path)
	}
	// Differential: endpoint /b against /a, grouped by tenant.
	dg := h.Flame(FlameQuery{GroupBy: GroupByLabelPrefix + "tenant",
		Selection: Selection{Labels: []libpf.Label{{Key: "endpoint", Value: "/b"}}},
		Baseline:  &Selection{Labels: []libpf.Label{{Key: "endpoint", Value: "/a"}}}})
	if dg.Total != 25 || dg.BaseTotal != 30 || dg.Nodes[1].Name != "tenant=alpha" || dg.Nodes[1].Total != 5 ||
		dg.Nodes[1].BaseTotal != 30 {
		t.Errorf("differential grouped by tenant:\n%s", flameShape(dg))
	}
	for _, by := range []string{"", GroupByThread, GroupByContainer, GroupByPod, GroupByNamespace, GroupByService, "label:k"} {
		if !ValidGroupBy(by) {
			t.Errorf("ValidGroupBy(%q) = false", by)
		}
	}
	for _, by := range []string{"label:", "node", "Label:x"} {
		if ValidGroupBy(by) {
			t.Errorf("ValidGroupBy(%q) = true", by)
		}
	}
}

// TestHistoryKubernetes: processes of pods are listed, selected and grouped
// by pod ("namespace/name") and namespace, containers by name.
func TestHistoryKubernetes(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	shop := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc", ContainerID: id, ContainerName: "worker",
		PodName: "checkout-0", Namespace: "shop", ServiceName: "checkout"}
	host := &libpf.ProcessInfo{PID: 8, ExecutableName: "sshd"}
	h.add(intervalOf(start, time.Second, shop, map[*libpf.Trace]int{chain(1, "main", "serve"): 30}), testPeriod)
	h.add(intervalOf(start.Add(time.Second), time.Second, host, map[*libpf.Trace]int{chain(2, "main", "poll"): 10}), testPeriod)

	fv := h.Filters(Selection{}, 10)
	if len(fv.Pods) != 1 || fv.Pods[0].Name != "shop/checkout-0" || fv.Pods[0].Samples != 30 ||
		len(fv.Namespaces) != 1 || fv.Namespaces[0].Name != "shop" {
		t.Errorf("pods %+v, namespaces %+v", fv.Pods, fv.Namespaces)
	}
	if g := h.Flame(FlameQuery{Selection: Selection{Pods: []string{"shop/checkout-0"}}}); g.Total != 30 {
		t.Errorf("pod selection: %d samples, want 30", g.Total)
	}
	if g := h.Flame(FlameQuery{Selection: Selection{Services: []string{"checkout"}}}); g.Total != 30 ||
		len(fv.Services) != 1 || fv.Services[0].Name != "checkout" {
		t.Errorf("service selection: %d samples, want 30; services %+v", g.Total, fv.Services)
	}
	if g := h.Flame(FlameQuery{Selection: Selection{Namespaces: []string{"kube-system"}}}); g.Total != 0 {
		t.Errorf("another namespace: %d samples, want 0", g.Total)
	}
	for by, want := range map[string][]string{
		GroupByPod:       {"no pod", "pod shop/checkout-0"},
		GroupByNamespace: {"namespace shop", "no namespace"},
		GroupByContainer: {"container worker (0123456789ab)", "no container"},
		GroupByService:   {"service checkout", "no service"},
	} {
		g := h.Flame(FlameQuery{GroupBy: by})
		var groups []string
		for _, n := range g.Nodes {
			if n.Kind == KindGroup {
				groups = append(groups, n.Name)
			}
		}
		slices.Sort(groups)
		slices.Sort(want)
		if !slices.Equal(groups, want) {
			t.Errorf("grouped by %s: %v, want %v", by, groups, want)
		}
	}
}

// TestHistoryTraces: the samples taken in a distributed trace (an APM
// agent's or an OpenTelemetry span's) are selected by its id, after the
// tables were rebuilt too.
func TestHistoryTraces(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	proc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	a, b := chain(1, "main", "serve", "parse"), chain(2, "main", "serve", "render")
	t1, t2 := [16]byte{1}, [16]byte{2}
	agg := newAggregator(start, defaultMaxSamplesPerInterval)
	for i, s := range []struct {
		tr   *libpf.Trace
		meta libpf.SampleMeta
		n    int
	}{
		{a, libpf.SampleMeta{Span: libpf.SpanContext{Valid: true, TraceID: t1, SpanID: [8]byte{1}}}, 12},
		{b, libpf.SampleMeta{Span: libpf.SpanContext{Valid: true, TraceID: t1, SpanID: [8]byte{2}}}, 3},
		{b, libpf.SampleMeta{APM: libpf.APMContext{Valid: true, TraceID: t2, SpanID: [8]byte{3}}}, 5},
		{a, libpf.SampleMeta{}, 20},
	} {
		for j := range s.n {
			m := s.meta
			m.Time, m.TID, m.ThreadName, m.Process = start.Add(time.Duration(100*i+j)*time.Millisecond), 7, "t", proc
			agg.add(s.tr, &m, uint64(m.Time.UnixNano()))
		}
	}
	h.add(agg.swap(start.Add(5*time.Second)), testPeriod)
	check := func(when string) {
		t.Helper()
		for _, c := range []struct {
			traces [][16]byte
			want   uint64
		}{{[][16]byte{t1}, 15}, {[][16]byte{t2}, 5}, {[][16]byte{t1, t2}, 20}, {[][16]byte{{9}}, 0}, {nil, 40}} {
			if g := h.Flame(FlameQuery{Selection: Selection{Traces: c.traces}}); g.Total != c.want {
				t.Errorf("%s: traces %x: %d samples, want %d", when, c.traces, g.Total, c.want)
			}
		}
		rows, total, _ := h.TopFunctions(Selection{Traces: [][16]byte{t1}}, nil, false, 10)
		if total != 15 || len(rows) == 0 || rows[0].Name != "parse" || rows[0].Self != 12 {
			t.Errorf("%s: top of trace 1: %d, %+v", when, total, rows)
		}
	}
	check("before a rebuild")
	h.mu.Lock()
	h.compact()
	h.mu.Unlock()
	check("after a rebuild")
}

// TestHistoryOffCPU: off-CPU waits are kept apart from CPU samples, in
// OffCPUUnit, and the wall measure adds CPU samples as their period.
func TestHistoryOffCPU(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1700000000, 0)
	proc := &libpf.ProcessInfo{PID: 7, ExecutableName: "app"}
	a := newAggregator(start, defaultMaxSamplesPerInterval)
	busy, sleep := chain(1, "main", "spin"), chain(2, "main", "nanosleep")
	for i := range 3 {
		ts := start.Add(time.Duration(i) * 10 * time.Millisecond)
		a.add(busy, &libpf.SampleMeta{Time: ts, TID: 7, ThreadName: "t", Process: proc}, uint64(ts.UnixNano()))
	}
	for _, wait := range []time.Duration{25 * time.Millisecond, 15*time.Millisecond + 40*time.Microsecond} {
		a.add(sleep, &libpf.SampleMeta{Time: start, TID: 8, ThreadName: "t", Process: proc, OffCPU: wait},
			uint64(start.UnixNano()))
	}
	h.add(a.swap(start.Add(time.Second)), int64(50*time.Millisecond))

	for _, c := range []struct {
		measure Measure
		want    string
	}{
		{"", "all 3/0\n  app 3/0\n    main 3/0\n      spin 3/3\n"},
		{MeasureOffCPU, "all 400/0\n  app 400/0\n    main 400/0\n      nanosleep 400/400\n"},
		// 3 samples of 50 ms: 1500 units of 100 us.
		{MeasureWall, "all 1900/0\n  app 1900/0\n    main 1900/0\n      nanosleep 400/400\n      spin 1500/1500\n"},
	} {
		g := h.Flame(FlameQuery{Selection: Selection{Measure: c.measure}})
		if got := flameShape(g); got != c.want {
			t.Errorf("measure %q: flame graph:\n%s\nwant:\n%s", c.measure, got, c.want)
		}
	}
	var buf bytes.Buffer
	if err := h.WritePprof(&buf, Selection{Measure: MeasureWall}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type)
	}
	total := make([]int64, len(p.SampleType))
	for _, s := range p.Sample {
		for i, v := range s.Value {
			total[i] += v
		}
	}
	if want := []int64{3, 3 * int64(50*time.Millisecond), int64(40 * time.Millisecond)}; !slices.Equal(total, want) {
		t.Errorf("pprof of the wall measure: %v totals %v, want %v", types, total, want)
	}
}

package reporter

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// heapOf is a heap profile of proc at at: per trace, its bytes in use and
// allocated.
func heapOf(proc *libpf.ProcessInfo, at time.Time, sites map[*libpf.Trace][2]int64) *interval {
	hp := &libpf.HeapProfile{Symbolize: symbolizeTest, Process: proc, Time: at, Period: 512 << 10}
	for tr, v := range sites {
		hp.Samples = append(hp.Samples, libpf.HeapSample{Stack: traced(tr), InUseBytes: v[0], AllocBytes: v[1]})
	}
	iv := newInterval(at)
	iv.end = at.Add(time.Second)
	iv.heaps = []*libpf.HeapProfile{hp}
	iv.heapSites = len(hp.Samples)
	return iv
}

// The memory measures count each process's last heap profile in the range:
// growth shows as the difference of two ranges, the timeline carries each
// process's last reading forward, and a table rebuild keeps the profiles.
func TestHistoryHeapMeasures(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	svc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	other := &libpf.ProcessInfo{PID: 8, ExecutableName: "other"}
	retain, churn := chain(1, "main.main", "main.retainLeaf"), chain(2, "main.main", "main.churnLeaf")
	cache := chain(3, "main.main", "main.cache")
	// svc's retained memory grows from 100 to 150 between its readings;
	// its churn allocates 1,000 more and keeps none.
	h.add(heapOf(svc, start, map[*libpf.Trace][2]int64{retain: {100, 100}, churn: {0, 1000}}), testPeriod)
	h.add(heapOf(other, start.Add(time.Second), map[*libpf.Trace][2]int64{cache: {50, 60}}), testPeriod)
	h.add(heapOf(svc, start.Add(10*time.Second), map[*libpf.Trace][2]int64{retain: {150, 150}, churn: {0, 2000}}), testPeriod)
	// A CPU interval beside: the memory measures do not count it.
	h.add(intervalOf(start, 5*time.Second, svc, map[*libpf.Trace]int{retain: 30}), testPeriod)

	check := func(t *testing.T) {
		t.Helper()
		if st := h.Stats(); st.HeapProfiles != 3 {
			t.Errorf("stats: %d heap profiles, want 3", st.HeapProfiles)
		}
		all := h.Flame(FlameQuery{Selection: Selection{Measure: MeasureInUse}})
		if all.Total != 200 {
			t.Errorf("in use now: %d, want 150 + 50:\n%s", all.Total, flameShape(all))
		}
		early := Selection{To: start.Add(5 * time.Second), Measure: MeasureInUse}
		late := Selection{From: start.Add(5 * time.Second), Measure: MeasureInUse}
		diff := h.Flame(FlameQuery{Selection: late, Baseline: &early})
		want := `all 150/0 base 150/0
  svc 150/0 base 100/0
    main.main 150/0 base 100/0
      main.retainLeaf 150/150 base 100/100
  other 0/0 base 50/0
    main.main 0/0 base 50/0
      main.cache 0/0 base 50/50
`
		// Siblings in any order: a rebuild renumbers them.
		if got := sortedLines(flameShape(diff)); got != sortedLines(want) {
			t.Errorf("growth between two ranges:\n%s\nwant:\n%s", got, want)
		}
		alloc := h.Flame(FlameQuery{Selection: Selection{Measure: MeasureAlloc, PIDs: []libpf.PID{7}}})
		if alloc.Total != 2150 {
			t.Errorf("allocated by svc: %d, want 2000 + 150:\n%s", alloc.Total, flameShape(alloc))
		}
		rows, total, _ := h.TopFunctions(Selection{Measure: MeasureAlloc}, nil, false, 1)
		if total != 2210 || len(rows) != 1 || rows[0].Name != "main.churnLeaf" || rows[0].Self != 2000 {
			t.Errorf("top allocating function: %+v of %d", rows, total)
		}
		from, step, counts := h.Timeline(Selection{Measure: MeasureInUse}, 100)
		if !from.Equal(start) || step != time.Second || len(counts) < 11 ||
			counts[0] != 100 || counts[1] != 150 || counts[9] != 150 || counts[10] != 200 {
			t.Errorf("timeline from %v step %v: %v; want 100, then 150 from 1 s, 200 from 10 s", from, step, counts)
		}
		var buf bytes.Buffer
		if err := h.WritePprof(&buf, Selection{Measure: MeasureInUse}); err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(&buf)
		if err != nil {
			t.Fatal(err)
		}
		var inuse int64
		for _, s := range p.Sample {
			inuse += s.Value[3]
		}
		if p.SampleType[3].Type != "inuse_space" || inuse != 200 {
			t.Errorf("pprof download: %v, in use %d; want inuse_space 200", p.SampleType, inuse)
		}
		if cpu := h.Flame(FlameQuery{Selection: Selection{}}); cpu.Total != 30 {
			t.Errorf("CPU samples: %d, want 30", cpu.Total)
		}
	}
	check(t)
	h.mu.Lock()
	h.compact()
	h.mu.Unlock()
	t.Run("after a table rebuild", check)
}

// Heap profiles older than the history's age go, as intervals do.
func TestHistoryHeapBounds(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{MaxAge: time.Minute})
	start := time.Unix(1_800_000_000, 0)
	svc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	retain := chain(1, "main.main", "main.retainLeaf")
	for i := range 5 {
		h.add(heapOf(svc, start.Add(time.Duration(i)*30*time.Second), map[*libpf.Trace][2]int64{retain: {int64(i), 1}}), testPeriod)
	}
	if st := h.Stats(); st.HeapProfiles != 2 || !st.Start.Equal(start.Add(90*time.Second)) {
		t.Errorf("%d heap profiles from %v held, want 2 from %v", st.HeapProfiles, st.Start, start.Add(90*time.Second))
	}
}

func sortedLines(s string) string {
	lines := strings.Split(s, "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// Heap profiles over the byte bound go before CPU samples do: they take at
// most a quarter of it.
func TestHistoryHeapsDoNotCrowdOutSamples(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{MaxBytes: 4 << 20})
	start := time.Unix(1_800_000_000, 0)
	svc := &libpf.ProcessInfo{PID: 7, ExecutableName: "svc"}
	a, b := chain(1, "main", "serve", "parse"), chain(2, "main", "serve", "render")
	for i := range 20 {
		h.add(intervalOf(start.Add(time.Duration(i)*5*time.Second), 5*time.Second, svc, map[*libpf.Trace]int{a: 30, b: 10}), testPeriod)
	}
	for round := range 6 {
		at := start.Add(100*time.Second + time.Duration(round)*time.Second)
		for p := range 10 {
			sites := map[*libpf.Trace][2]int64{}
			for i := range 2000 {
				sites[chain(uint64(100000*round+1000*p+i), "main.main", fmt.Sprintf("main.site%d_%d", p, i))] = [2]int64{1, 1}
			}
			h.add(heapOf(&libpf.ProcessInfo{PID: libpf.PID(100 + p), ExecutableName: "go"}, at, sites), testPeriod)
		}
	}
	st := h.Stats()
	if st.Intervals < 15 || h.heapBytes > h.maxBytes/4 || st.HeapProfiles == 0 || st.Bytes > h.maxBytes {
		t.Errorf("%d intervals, %d heap profiles (%d bytes), %d bytes held of %d: want the intervals kept, heap profiles within a quarter",
			st.Intervals, st.HeapProfiles, h.heapBytes, st.Bytes, h.maxBytes)
	}
}

// The memory timeline starts from the readings before its range and stops
// counting a process whose readings stopped (it exited or restarted).
func TestHistoryHeapTimeline(t *testing.T) {
	h := newTestHistory(t, HistoryConfig{})
	start := time.Unix(1_800_000_000, 0)
	retain := chain(1, "main.main", "main.retainLeaf")
	// svc runs as pid 7 (read at 0 and 60 s), then restarts as pid 9
	// (read from 200 s).
	for _, r := range []struct {
		pid libpf.PID
		at  time.Duration
	}{{7, 0}, {7, time.Minute}, {9, 200 * time.Second}, {9, 260 * time.Second}} {
		h.add(heapOf(&libpf.ProcessInfo{PID: r.pid, ExecutableName: "svc"}, start.Add(r.at),
			map[*libpf.Trace][2]int64{retain: {100, 100}}), testPeriod)
	}
	from, step, counts := h.Timeline(Selection{Measure: MeasureInUse}, 1000)
	if !from.Equal(start) || step != time.Second || len(counts) < 261 {
		t.Fatalf("timeline from %v step %v, %d buckets", from, step, len(counts))
	}
	// pid 7's reading at 60 s stands for twice the minute before it.
	for _, c := range []struct {
		sec  int
		want uint64
	}{{0, 100}, {100, 100}, {180, 100}, {190, 0}, {200, 100}, {260, 100}} {
		if counts[c.sec] != c.want {
			t.Errorf("at %d s: %d bytes, want %d", c.sec, counts[c.sec], c.want)
		}
	}
	_, _, zoomed := h.Timeline(Selection{From: start.Add(30 * time.Second), To: start.Add(40 * time.Second), Measure: MeasureInUse}, 100)
	if len(zoomed) == 0 || zoomed[0] != 100 {
		t.Errorf("a range after a reading: %v, want 100 from its start", zoomed)
	}
}

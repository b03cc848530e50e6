package reporter

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// heapStack is a native trace in m, leaf first as in Trace.Frames.
func heapStack(hash uint64, m *libpf.Mapping, leafFirst ...string) *libpf.Trace {
	t := &libpf.Trace{Hash: libpf.TraceHash{Hi: 0x4ea9, Lo: hash}}
	for i, name := range leafFirst {
		t.Frames = append(t.Frames, libpf.Frame{Kind: libpf.FrameNative, Mapping: m,
			Address: 0x1000*hash + uint64(i)*0x10, FunctionName: name, SourceFile: "main.go", SourceLine: uint32(i + 1)})
	}
	return t
}

// testTraces are the traces of the tests' heap samples, by their Stack's
// only element (traced, symbolizeTest).
var testTraces sync.Map

var nextTestTrace atomic.Uint64

// traced is the Stack of a heap sample whose trace is tr.
func traced(tr *libpf.Trace) []uint64 {
	id := nextTestTrace.Add(1)
	testTraces.Store(id, tr)
	return []uint64{id}
}

// symbolizeTest is the Symbolize of the tests' heap profiles.
func symbolizeTest(stack []uint64) *libpf.Trace {
	tr, _ := testTraces.Load(stack[0])
	return tr.(*libpf.Trace)
}

// sitesOf is a heap profile of proc with n allocation sites.
func sitesOf(proc *libpf.ProcessInfo, n int) *libpf.HeapProfile {
	hp := &libpf.HeapProfile{Symbolize: symbolizeTest, Process: proc, Period: 512 << 10}
	for i := range n {
		hp.Samples = append(hp.Samples, libpf.HeapSample{Stack: traced(heapStack(uint64(i+1), nil, fmt.Sprintf("f%d", i))),
			AllocObjects: 1, AllocBytes: 8})
	}
	return hp
}

// heapFixture is two heap profiles at known times: one of the fixture's
// procA (which has CPU samples), with two stacks under one leaf and
// sites whose in-use values are 0, and one of procC, a process with no
// CPU samples.
type heapFixture struct {
	procC  *libpf.ProcessInfo
	hpA    *libpf.HeapProfile
	hpC    *libpf.HeapProfile
	period int64
}

func newHeapFixture(f *fixture) *heapFixture {
	h := &heapFixture{
		procC:  &libpf.ProcessInfo{PID: 300, ExecutableName: "app-c", ExecutablePath: "/usr/bin/app-c"},
		period: 512 << 10,
	}
	appC := &libpf.Mapping{FileID: libpf.FileID{0xc}, Path: "/usr/bin/app-c", GoBuildID: "go-c",
		Start: 0x400000, End: 0x800000}
	h.hpA = &libpf.HeapProfile{Symbolize: symbolizeTest, Process: f.procA, Time: f.start.Add(1500 * time.Millisecond), Period: h.period,
		Samples: []libpf.HeapSample{
			{Stack: traced(heapStack(1, f.appA, "main.retainLeaf", "main.main")),
				AllocObjects: 200, AllocBytes: 200 << 16, InUseObjects: 200, InUseBytes: 200 << 16},
			{Stack: traced(heapStack(2, f.appA, "main.retainLeaf", "main.other", "main.main")),
				AllocObjects: 10, AllocBytes: 10 << 16, InUseObjects: 4, InUseBytes: 4 << 16},
			// Everything freed: only the alloc profiles have it.
			{Stack: traced(heapStack(3, f.appA, "main.churnLeaf", "main.main")),
				AllocObjects: 2048, AllocBytes: 64 << 20},
		}}
	h.hpC = &libpf.HeapProfile{Symbolize: symbolizeTest, Process: h.procC, Time: f.start.Add(2 * time.Second), Period: 1,
		Samples: []libpf.HeapSample{
			{Stack: traced(heapStack(4, appC, "main.retainSmall", "main.main")),
				AllocObjects: 100_000, AllocBytes: 4_800_000, InUseObjects: 99_000, InUseBytes: 4_752_000},
		}}
	return h
}

// byLeaf sums heap profiles' values per process and leaf function
// ("pid leaf"): allocated objects and bytes, in-use objects and bytes.
func byLeaf(hps ...*libpf.HeapProfile) map[string][4]int64 {
	out := map[string][4]int64{}
	for _, hp := range hps {
		for i := range hp.Samples {
			s := &hp.Samples[i]
			k := fmt.Sprintf("%d %s", hp.Process.PID, hp.Trace(i).Frames[0].FunctionName)
			sum, v := out[k], [4]int64{s.AllocObjects, s.AllocBytes, s.InUseObjects, s.InUseBytes}
			for j := range sum {
				sum[j] += v[j]
			}
			out[k] = sum
		}
	}
	return out
}

func TestAddHeap(t *testing.T) {
	f := newFixture()
	procC := &libpf.ProcessInfo{PID: 300}
	// The same pid running another image: another process to the reporter.
	procA2 := &libpf.ProcessInfo{PID: f.procA.PID, ExecutableName: "app-a2"}
	a2, a3, a5, b4, c3, x2 := sitesOf(f.procA, 2), sitesOf(f.procA, 3), sitesOf(f.procA, 5),
		sitesOf(f.procB, 4), sitesOf(procC, 3), sitesOf(procA2, 2)
	tests := []struct {
		name      string
		limit     int
		adds      []*libpf.HeapProfile
		wantKept  []bool
		wantHeaps []*libpf.HeapProfile
		wantSites int
	}{
		{
			name: "a later read replaces the process's earlier one in place", limit: 10,
			adds: []*libpf.HeapProfile{a3, b4, a2}, wantKept: []bool{true, true, true},
			wantHeaps: []*libpf.HeapProfile{a2, b4}, wantSites: 6,
		},
		{
			// The manager replaces a process's info as it learns more of
			// it: a later read of the pid replaces the earlier one.
			name: "a read of the same pid with other process info replaces it", limit: 10,
			adds: []*libpf.HeapProfile{a3, x2}, wantKept: []bool{true, true},
			wantHeaps: []*libpf.HeapProfile{x2}, wantSites: 2,
		},
		{
			name: "over the limit refused", limit: 5,
			adds: []*libpf.HeapProfile{a3, b4}, wantKept: []bool{true, false},
			wantHeaps: []*libpf.HeapProfile{a3}, wantSites: 3,
		},
		{
			// 3 + 5 is over the limit, but the 3 it replaces no longer count.
			name: "a replacement fits once the old sites are gone", limit: 5,
			adds: []*libpf.HeapProfile{a3, a5}, wantKept: []bool{true, true},
			wantHeaps: []*libpf.HeapProfile{a5}, wantSites: 5,
		},
		{
			name: "a replacement over the limit leaves the earlier read", limit: 5,
			adds: []*libpf.HeapProfile{a2, c3, a3}, wantKept: []bool{true, true, false},
			wantHeaps: []*libpf.HeapProfile{a2, c3}, wantSites: 5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAggregator(f.start, tt.limit)
			var kept []bool
			for _, hp := range tt.adds {
				kept = append(kept, a.addHeap(hp))
			}
			iv := a.swap(f.end)
			if !slices.Equal(kept, tt.wantKept) {
				t.Errorf("kept %v, want %v", kept, tt.wantKept)
			}
			if !slices.Equal(iv.heaps, tt.wantHeaps) || iv.heapSites != tt.wantSites {
				t.Errorf("interval has %d heap profiles (%d sites), want %d (%d sites)",
					len(iv.heaps), iv.heapSites, len(tt.wantHeaps), tt.wantSites)
			}
			if iv.empty() {
				t.Error("an interval with heap profiles says it is empty")
			}
			if iv.samples != 0 || iv.waits != 0 || iv.dropped != 0 {
				t.Errorf("heap profiles counted as samples: %d samples, %d waits, %d dropped", iv.samples, iv.waits, iv.dropped)
			}
		})
	}
}

func TestReportHeapCounts(t *testing.T) {
	f := newFixture()
	r, _ := newTestReporter(t, Config{TopN: 1, MaxSamplesPerInterval: 5})
	a3, a2 := sitesOf(f.procA, 3), sitesOf(f.procA, 2)
	r.ReportHeap(nil)
	r.ReportHeap(a3)
	r.ReportHeap(sitesOf(f.procB, 4)) // 7 sites: over the limit
	r.ReportHeap(a2)                  // replaces a3
	st := r.Stats()
	if st.HeapProfilesReceived != 4 || st.HeapProfilesDropped != 2 {
		t.Errorf("heap profiles received %d, dropped %d; want 4 and 2", st.HeapProfilesReceived, st.HeapProfilesDropped)
	}
	if st.SamplesReceived != 0 || st.SamplesDropped != 0 {
		t.Errorf("heap profiles counted as samples: %d received, %d dropped", st.SamplesReceived, st.SamplesDropped)
	}
	// Peek at the open interval; the test is its only user.
	if iv := r.agg.cur; !slices.Equal(iv.heaps, []*libpf.HeapProfile{a2}) || iv.heapSites != 2 {
		t.Errorf("interval keeps %d heap profiles (%d sites), want the last of procA (2 sites)", len(iv.heaps), iv.heapSites)
	}
}

// TestHeapOnlyInterval: an interval with heap profiles and no samples is
// reported: written as a -heap pprof file (and no CPU file) that pprof
// reads back with the values put in, and exported.
func TestHeapOnlyInterval(t *testing.T) {
	f := newFixture()
	h := newHeapFixture(f)
	dir := t.TempDir()
	c := &fakeCollector{}
	r, _ := newTestReporter(t, Config{OutputDir: dir, CollectionAgent: serve(t, "127.0.0.1:0", c)})
	r.ReportHeap(h.hpA)
	r.ReportHeap(h.hpC)
	if err := r.reportInterval(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Intervals != 1 || st.PprofFilesWritten != 1 || st.PprofErrors != 0 {
		t.Errorf("%d intervals, %d files written, %d errors; want 1, 1, 0", st.Intervals, st.PprofFilesWritten, st.PprofErrors)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	heapFiles, _ := filepath.Glob(filepath.Join(dir, "profile-*-heap.pb.gz"))
	if len(files) != 1 || len(heapFiles) != 1 {
		t.Fatalf("files written: %v; want one profile-*-heap.pb.gz and nothing else", files)
	}

	fh, err := os.Open(heapFiles[0])
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	p, err := profile.Parse(fh)
	if err != nil {
		t.Fatalf("parsing %s: %v", heapFiles[0], err)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatalf("CheckValid: %v", err)
	}
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	wantTypes := []string{"alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes"}
	if !slices.Equal(types, wantTypes) || p.DefaultSampleType != "inuse_space" {
		t.Errorf("sample types %v, default %q; want %v, inuse_space", types, p.DefaultSampleType, wantTypes)
	}
	if p.PeriodType == nil || p.PeriodType.Type != "space" || p.PeriodType.Unit != "bytes" || p.Period != h.period {
		t.Errorf("period %d %v, want %d space/bytes", p.Period, p.PeriodType, h.period)
	}
	got := map[string][4]int64{}
	for _, s := range p.Sample {
		if len(s.NumLabel["pid"]) != 1 || len(s.Label["process"]) != 1 || len(s.Location) == 0 || len(s.Value) != 4 {
			t.Fatalf("sample without one pid and process label, a stack or four values: %v", s)
		}
		k := fmt.Sprintf("%d %s", s.NumLabel["pid"][0], s.Location[0].Line[0].Function.Name)
		sum := got[k]
		for j := range sum {
			sum[j] += s.Value[j]
		}
		got[k] = sum
		if want := map[int64]string{100: "app-a", 300: "app-c"}[s.NumLabel["pid"][0]]; s.Label["process"][0] != want {
			t.Errorf("pid %d labelled process %q, want %q", s.NumLabel["pid"][0], s.Label["process"][0], want)
		}
	}
	if want := byLeaf(h.hpA, h.hpC); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("values per pid and leaf:\n got %v\nwant %v", got, want)
	}

	reqs := c.requests()
	if len(reqs) != 1 {
		t.Fatalf("collector got %d requests, want 1", len(reqs))
	}
	if err := Validate(reqs[0]); err != nil {
		t.Errorf("exported request invalid: %v", err)
	}
	var profs int
	for _, rp := range reqs[0].ResourceProfiles {
		profs += len(rp.ScopeProfiles[0].Profiles)
	}
	if len(reqs[0].ResourceProfiles) != 2 || profs != 8 {
		t.Errorf("exported %d resources with %d profiles, want 2 with 4 heap profiles each",
			len(reqs[0].ResourceProfiles), profs)
	}
}

// TestBuildRequestHeap: a process's heap profile is four profiles in the
// resource of its CPU samples, or in one of its own; each has one sample
// per site with a value, without timestamps; heap sites are not counted
// as samples.
func TestBuildRequestHeap(t *testing.T) {
	f := newFixture()
	h := newHeapFixture(f)
	a := newAggregator(f.start, defaultMaxSamplesPerInterval)
	f.report(func(t *libpf.Trace, m *libpf.SampleMeta) { a.add(t, m, uint64(m.Time.UnixNano())) })
	a.add(f.t1, &libpf.SampleMeta{Process: f.procA, TID: 100, OffCPU: time.Millisecond}, uint64(f.start.UnixNano()))
	for _, hp := range []*libpf.HeapProfile{h.hpA, h.hpC} {
		if !a.addHeap(hp) {
			t.Fatal("heap profile refused")
		}
	}
	r := mustBuild(t, a.swap(f.end))
	if r.samples != fixtureSamples+1 {
		t.Errorf("request counts %d samples, want the %d CPU samples and the wait", r.samples, fixtureSamples+1)
	}
	d := r.req.Dictionary
	typ := func(vt *profilespb.ValueType) string {
		return d.StringTable[vt.GetTypeStrindex()] + "/" + d.StringTable[vt.GetUnitStrindex()]
	}
	heapTypes := []string{"alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes"}
	tests := []struct {
		pid       int64
		name      string
		hp        *libpf.HeapProfile
		wantTypes []string
	}{
		{100, "app-a", h.hpA, append([]string{"samples/count", "off_cpu/nanoseconds"}, heapTypes...)},
		{200, "app-b", nil, []string{"samples/count"}},
		{300, "app-c", h.hpC, heapTypes},
	}
	if len(r.req.ResourceProfiles) != len(tests) {
		t.Fatalf("%d resources, want one per process (%d)", len(r.req.ResourceProfiles), len(tests))
	}
	for _, tt := range tests {
		var rps []*profilespb.ResourceProfiles
		for _, rp := range r.req.ResourceProfiles {
			if resourceAttrs(rp.Resource.Attributes)["process.pid"] == tt.pid {
				rps = append(rps, rp)
			}
		}
		if len(rps) != 1 {
			t.Errorf("pid %d has %d resources, want 1", tt.pid, len(rps))
			continue
		}
		if name := resourceAttrs(rps[0].Resource.Attributes)["process.executable.name"]; name != tt.name {
			t.Errorf("pid %d: process.executable.name %v, want %s", tt.pid, name, tt.name)
		}
		profs := rps[0].ScopeProfiles[0].Profiles
		var types []string
		for _, p := range profs {
			types = append(types, typ(p.SampleType))
		}
		if !slices.Equal(types, tt.wantTypes) {
			t.Errorf("pid %d: profiles %v, want %v", tt.pid, types, tt.wantTypes)
			continue
		}
		if tt.hp == nil {
			continue
		}
		want := byLeaf(tt.hp)
		heapProfs := profs[len(profs)-len(heapTypes):]
		for i, p := range heapProfs {
			if typ(p.PeriodType) != "space/bytes" || p.Period != tt.hp.Period ||
				p.TimeUnixNano != uint64(tt.hp.Time.UnixNano()) {
				t.Errorf("pid %d %s: period %d %s at %d; want %d space/bytes at %d", tt.pid, types[i],
					p.Period, typ(p.PeriodType), p.TimeUnixNano, tt.hp.Period, tt.hp.Time.UnixNano())
			}
			got := map[string]int64{}
			for _, s := range p.Samples {
				if len(s.Values) != 1 || len(s.TimestampsUnixNano) != 0 || s.Values[0] == 0 {
					t.Errorf("pid %d %s: sample %v, want one non-zero value and no timestamps", tt.pid, heapTypes[i], s)
					continue
				}
				leaf := d.LocationTable[d.StackTable[s.StackIndex].LocationIndices[0]]
				got[fmt.Sprintf("%d %s", tt.pid, d.StringTable[d.FunctionTable[leaf.Lines[0].FunctionIndex].NameStrindex])] += s.Values[0]
			}
			wantI := map[string]int64{}
			for k, v := range want {
				if v[i] != 0 {
					wantI[k] = v[i]
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(wantI) {
				t.Errorf("pid %d %s per leaf: %v, want %v", tt.pid, heapTypes[i], got, wantI)
			}
		}
		// procA's churnLeaf site has nothing in use: no sample for it.
		if tt.pid == 100 {
			if n := len(heapProfs[0].Samples); n != 3 {
				t.Errorf("alloc_objects has %d samples, want 3", n)
			}
			if n := len(heapProfs[3].Samples); n != 2 {
				t.Errorf("inuse_space has %d samples, want 2 (the freed site left out)", n)
			}
		}
	}
}

func TestMergeIntervalsHeaps(t *testing.T) {
	f := newFixture()
	h := newHeapFixture(f)
	later := *h.hpA
	later.Time = later.Time.Add(time.Minute)
	a1 := newAggregator(f.start, 10)
	a1.addHeap(h.hpA)
	iv1 := a1.swap(f.end)
	a2 := newAggregator(f.end, 10)
	a2.addHeap(&later)
	a2.addHeap(h.hpC)
	iv2 := a2.swap(f.end.Add(time.Minute))

	m := mergeIntervals(iv1, iv2)
	if want := []*libpf.HeapProfile{h.hpA, &later, h.hpC}; !slices.Equal(m.heaps, want) || m.heapSites != 7 {
		t.Errorf("merged interval has %d heap profiles (%d sites), want both reads of procA and procC's (7 sites)",
			len(m.heaps), m.heapSites)
	}
	if len(iv1.heaps) != 1 || len(iv2.heaps) != 2 || iv1.heapSites != 3 {
		t.Error("merging changed its inputs")
	}
	if m.empty() {
		t.Error("merged heap-only interval says it is empty")
	}
	// Both reads of procA go out, in one resource.
	r := mustBuild(t, m)
	if n := len(r.req.ResourceProfiles); n != 2 {
		t.Fatalf("%d resources, want 2", n)
	}
	if n := len(r.req.ResourceProfiles[0].ScopeProfiles[0].Profiles); n != 8 {
		t.Errorf("procA's resource has %d profiles, want 8 (two reads)", n)
	}
}

func TestMergeableHeapSites(t *testing.T) {
	tests := []struct {
		name   string
		a, b   int
		limit  int
		wanted bool
	}{
		{"within a request", 3, 4, 7, true},
		{"heap sites do not count against the sample limit", 3, 5, 7, true},
		{"at a request's bound", maxHeapSitesPerRequest - 1, 1, 7, true},
		{"over a request's bound", maxHeapSitesPerRequest, 1, 2 * maxMergedSamples, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newInterval(time.Unix(0, 0)), newInterval(time.Unix(1, 0))
			a.heapSites, b.heapSites = tt.a, tt.b
			if got := mergeable(a, b, tt.limit); got != tt.wanted {
				t.Errorf("mergeable with %d + %d sites, limit %d = %v, want %v", tt.a, tt.b, tt.limit, got, tt.wanted)
			}
		})
	}
}

// An interval's heap profiles go out in requests of at most
// maxHeapSitesPerRequest sites: the first with the interval's samples, a
// profile too big for one request in parts of the same process and time,
// every site once.
func TestSplitForExport(t *testing.T) {
	f := newFixture()
	iv := f.interval()
	big := sitesOf(f.procA, maxHeapSitesPerRequest+10)
	small := sitesOf(f.procB, 5)
	iv.heaps, iv.heapSites = []*libpf.HeapProfile{small, big}, len(small.Samples)+len(big.Samples)
	parts := splitForExport(iv)
	if len(parts) != 2 || parts[0].samples != iv.samples || parts[1].samples != 0 {
		t.Fatalf("%d parts, samples %d", len(parts), parts[0].samples)
	}
	seen := 0
	for i, p := range parts {
		n := 0
		for _, hp := range p.heaps {
			n += len(hp.Samples)
			if hp.Process != small.Process && hp.Process != big.Process || hp.Symbolize == nil {
				t.Errorf("part %d: a heap profile lost its process or symbolizer", i)
			}
		}
		if n != p.heapSites || n > maxHeapSitesPerRequest {
			t.Errorf("part %d: %d sites, counted %d", i, n, p.heapSites)
		}
		seen += n
	}
	if seen != iv.heapSites {
		t.Errorf("%d sites in the parts, %d in the interval", seen, iv.heapSites)
	}
	if one := splitForExport(f.interval()); len(one) != 1 {
		t.Errorf("an interval without heap profiles split in %d", len(one))
	}
}

// Heap-only intervals wait beside the intervals of samples: the queue's
// bound counts the latter, the former by their sites.
func TestQueueBoundsHeapSites(t *testing.T) {
	sampled := func() *interval { iv := newInterval(time.Unix(0, 0)); iv.samples = 1; return iv }
	heapOnly := func(sites int) *interval { iv := newInterval(time.Unix(0, 0)); iv.heapSites = sites; return iv }
	e := &exporter{limit: 2}
	e.queue = []*interval{sampled(), heapOnly(maxHeapSitesPerRequest), heapOnly(maxHeapSitesPerRequest), sampled()}
	if n := e.excessLocked(1); n != 0 {
		t.Errorf("2 intervals of samples and 2 of heap sites, bound 2: %d over, want 0", n)
	}
	e.queue = append(e.queue, sampled())
	if n := e.excessLocked(1); n != 1 {
		t.Errorf("3 intervals of samples, bound 2: %d over, want the oldest", n)
	}
	if n := e.excessLocked(2); n != 0 {
		t.Errorf("twice the bound: %d over, want 0", n)
	}
	e.queue = []*interval{heapOnly(maxQueuedHeapSites), heapOnly(1), sampled()}
	if n := e.excessLocked(1); n != 1 {
		t.Errorf("heap sites one over their bound: %d over, want the oldest", n)
	}
}

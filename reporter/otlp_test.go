package reporter

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/interpreter/python"
	"github.com/hostprof/ebpf-profiler/libpf"
)

func testOptions() buildOptions {
	return buildOptions{hostID: "machine-1", hostName: "host-1", version: "1.2.3", period: 50_000_000}
}

func mustBuild(t testing.TB, iv *interval) otlpRequest {
	t.Helper()
	r := buildRequest(iv, testOptions())
	if err := Validate(r.req); err != nil {
		t.Fatalf("built request is invalid: %v", err)
	}
	return r
}

// attrsOf decodes an attribute_indices list into key -> Go value.
func attrsOf(d *profilespb.ProfilesDictionary, indices []int32) map[string]any {
	out := make(map[string]any, len(indices))
	for _, i := range indices {
		a := d.AttributeTable[i]
		out[d.StringTable[a.KeyStrindex]] = anyValue(a.Value)
	}
	return out
}

func resourceAttrs(kvs []*commonpb.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		out[kv.Key] = anyValue(kv.Value)
	}
	return out
}

func anyValue(v *commonpb.AnyValue) any {
	switch v := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return v.StringValue
	case *commonpb.AnyValue_IntValue:
		return v.IntValue
	default:
		return v
	}
}

func sumSamples(req *collectorpb.ExportProfilesServiceRequest) int64 {
	var n int64
	for _, rp := range req.ResourceProfiles {
		for _, sp := range rp.ScopeProfiles {
			for _, p := range sp.Profiles {
				for _, s := range p.Samples {
					for _, v := range s.Values {
						n += v
					}
				}
			}
		}
	}
	return n
}

func TestBuildRequestShape(t *testing.T) {
	f := newFixture()
	r := mustBuild(t, f.interval())
	req, d := r.req, r.req.Dictionary

	if r.samples != fixtureSamples || r.profiles != fixtureProfiles {
		t.Errorf("request counts = %d samples, %d profiles; want %d, %d",
			r.samples, r.profiles, fixtureSamples, fixtureProfiles)
	}
	if got := sumSamples(req); got != fixtureSamples {
		t.Errorf("sum of sample values = %d, want %d", got, fixtureSamples)
	}
	tables := []struct {
		name      string
		got, want int
	}{
		{"mapping", len(d.MappingTable), fixtureMappings},
		{"function", len(d.FunctionTable), fixtureFunctions},
		{"location", len(d.LocationTable), fixtureLocations},
		{"stack", len(d.StackTable), fixtureStacks},
		{"link", len(d.LinkTable), 1},
	}
	for _, tt := range tables {
		if tt.got != tt.want {
			t.Errorf("%s table has %d entries, want %d", tt.name, tt.got, tt.want)
		}
	}
	if l := d.LinkTable[0]; !bytes.Equal(l.TraceId, make([]byte, 16)) || !bytes.Equal(l.SpanId, make([]byte, 8)) {
		t.Errorf("link_table[0] = %v, want full-length zero ids", l)
	}
	if d.StringTable[0] != "" {
		t.Errorf("string_table[0] = %q", d.StringTable[0])
	}
}

func TestBuildRequestResources(t *testing.T) {
	f := newFixture()
	req := mustBuild(t, f.interval()).req
	want := []map[string]any{
		{"process.pid": int64(100), "process.executable.name": "app-a",
			"process.executable.path": "/usr/bin/app-a", "host.id": "machine-1", "host.name": "host-1"},
		{"process.pid": int64(200), "process.executable.name": "app-b",
			"process.executable.path": "/opt/b/app-b", "container.id": "c0ffee", "k8s.pod.uid": "1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b",
			"k8s.pod.name": "b-0", "k8s.namespace.name": "ns", "container.name": "app",
			"process.runtime.name": "CPython", "process.runtime.version": "3.12.1",
			"host.id": "machine-1", "host.name": "host-1"},
	}
	if len(req.ResourceProfiles) != len(want) {
		t.Fatalf("got %d resource profiles, want %d", len(req.ResourceProfiles), len(want))
	}
	for i, rp := range req.ResourceProfiles {
		got := resourceAttrs(rp.Resource.Attributes)
		if !mapsEqual(got, want[i]) {
			t.Errorf("resource %d attributes = %v, want %v", i, got, want[i])
		}
		if len(rp.ScopeProfiles) != 1 || len(rp.ScopeProfiles[0].Profiles) != 1 {
			t.Fatalf("resource %d: want one scope with one profile", i)
		}
		sp := rp.ScopeProfiles[0]
		if sp.Scope.Name != scopeName || sp.Scope.Version != "1.2.3" {
			t.Errorf("scope = %v", sp.Scope)
		}
		p := sp.Profiles[0]
		d := req.Dictionary
		if st := p.SampleType; d.StringTable[st.TypeStrindex] != "samples" || d.StringTable[st.UnitStrindex] != "count" {
			t.Errorf("sample type = %v", st)
		}
		if pt := p.PeriodType; d.StringTable[pt.TypeStrindex] != "cpu" || d.StringTable[pt.UnitStrindex] != "nanoseconds" {
			t.Errorf("period type = %v", pt)
		}
		if p.Period != 50_000_000 || len(p.ProfileId) != 16 || bytes.Equal(p.ProfileId, make([]byte, 16)) {
			t.Errorf("period %d, profile id %x", p.Period, p.ProfileId)
		}
		// The late sample widens the window to before the interval start.
		if p.TimeUnixNano >= uint64(f.start.UnixNano()) || p.TimeUnixNano+p.DurationNano < uint64(f.end.UnixNano()) {
			t.Errorf("window [%d,+%d) does not cover the interval and the late sample", p.TimeUnixNano, p.DurationNano)
		}
	}
}

func mapsEqual(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func TestBuildRequestSamples(t *testing.T) {
	f := newFixture()
	req := mustBuild(t, f.interval()).req
	d := req.Dictionary
	type sampleSummary struct {
		leafFunc string
		count    int
		attrs    map[string]any
	}
	// Leaf function names per sample, in the builder's deterministic order
	// (per process: by tid, cpu, thread name, hash).
	want := [][]sampleSummary{
		{
			{"copy_user", 3, map[string]any{"thread.id": int64(100), "thread.name": "app-a", "cpu.logical_number": int64(0)}},
			// t2 and t5 have different hashes but the same frames: merged.
			{"", 3, map[string]any{"thread.id": int64(100), "thread.name": "app-a", "cpu.logical_number": int64(0)}},
			{"copy_user", 1, map[string]any{"thread.id": int64(101), "thread.name": "worker", "cpu.logical_number": int64(1)}},
		},
		{
			{"copy_user", 4, map[string]any{"thread.id": int64(200), "thread.name": "app-b", "cpu.logical_number": int64(2)}},
			{"", 1, map[string]any{"thread.id": int64(200), "thread.name": "app-b", "cpu.logical_number": int64(2)}},
			// No thread name: the attribute is left out rather than empty.
			{"", 1, map[string]any{"thread.id": int64(201), "cpu.logical_number": int64(3)}},
		},
	}
	for i, rp := range req.ResourceProfiles {
		p := rp.ScopeProfiles[0].Profiles[0]
		if len(p.Samples) != len(want[i]) {
			t.Fatalf("profile %d has %d samples, want %d", i, len(p.Samples), len(want[i]))
		}
		for j, s := range p.Samples {
			w := want[i][j]
			leaf := d.LocationTable[d.StackTable[s.StackIndex].LocationIndices[0]]
			leafFunc := ""
			if len(leaf.Lines) > 0 {
				leafFunc = d.StringTable[d.FunctionTable[leaf.Lines[0].FunctionIndex].NameStrindex]
			}
			if leafFunc != w.leafFunc || len(s.Values) != w.count || len(s.TimestampsUnixNano) != w.count {
				t.Errorf("profile %d sample %d: leaf %q, %d values, %d timestamps; want %q, %d",
					i, j, leafFunc, len(s.Values), len(s.TimestampsUnixNano), w.leafFunc, w.count)
			}
			if got := attrsOf(d, s.AttributeIndices); !mapsEqual(got, w.attrs) {
				t.Errorf("profile %d sample %d attributes = %v, want %v", i, j, got, w.attrs)
			}
			if !slices.IsSorted(s.TimestampsUnixNano) {
				t.Errorf("profile %d sample %d timestamps not sorted", i, j)
			}
		}
	}
}

func TestBuildRequestDictionary(t *testing.T) {
	f := newFixture()
	d := mustBuild(t, f.interval()).req.Dictionary
	str := func(i int32) string { return d.StringTable[i] }

	// Mappings: build id attributes only where the file has them.
	mappings := map[string][]map[string]any{}
	for _, m := range d.MappingTable[1:] {
		mappings[str(m.FilenameStrindex)] = append(mappings[str(m.FilenameStrindex)], attrsOf(d, m.AttributeIndices))
	}
	wantMappings := map[string][]map[string]any{
		"vmlinux": {{"process.executable.build_id.htlhash": f.vmlinux.FileID.String(),
			"process.executable.build_id.gnu": "0badc0de"}},
		"/usr/lib/libc.so.6": {
			{"process.executable.build_id.htlhash": f.libcA.FileID.String(), "process.executable.build_id.gnu": "11aa"},
			{"process.executable.build_id.htlhash": f.libcA.FileID.String(), "process.executable.build_id.gnu": "11aa"},
		},
		"/usr/bin/app-a": {{"process.executable.build_id.htlhash": f.appA.FileID.String(),
			"process.executable.build_id.go": "go-a/b/c"}},
		"/opt/b/app-b": {{"process.executable.build_id.htlhash": f.appB.FileID.String(),
			"process.executable.build_id.gnu": "22bb"}},
	}
	for name, want := range wantMappings {
		got := mappings[name]
		if len(got) != len(want) {
			t.Errorf("mapping %s appears %d times, want %d", name, len(got), len(want))
			continue
		}
		for i := range got {
			if !mapsEqual(got[i], want[i]) {
				t.Errorf("mapping %s attributes = %v, want %v", name, got[i], want[i])
			}
		}
	}

	// Locations: file-relative addresses, frame kinds, line info.
	type loc struct {
		file, kind, fn string
		addr           uint64
		line           int64
	}
	var locs []loc
	for _, l := range d.LocationTable[1:] {
		x := loc{file: str(d.MappingTable[l.MappingIndex].FilenameStrindex), addr: l.Address,
			kind: attrsOf(d, l.AttributeIndices)["profile.frame.type"].(string)}
		if len(l.Lines) == 1 {
			x.fn = str(d.FunctionTable[l.Lines[0].FunctionIndex].NameStrindex)
			x.line = l.Lines[0].Line
		}
		locs = append(locs, x)
	}
	wantLocs := []loc{
		{"vmlinux", "kernel", "copy_user", 0x1000, 0},
		{"vmlinux", "kernel", "do_syscall_64", 0x2000, 0},
		{"/usr/lib/libc.so.6", "native", "write", 0x100, 10},
		{"/usr/bin/app-a", "native", "main.main", 0x500, 5},
		{"/usr/bin/app-a", "native", "", 0x600, 0},
		{"/usr/lib/libc.so.6", "native", "write", 0x100, 10},
		{"/opt/b/app-b", "native", "main", 0x700, 0},
		{"", "abort-marker", "", 3, 0},
	}
	if !slices.Equal(locs, wantLocs) {
		t.Errorf("locations =\n%v\nwant\n%v", locs, wantLocs)
	}

	// Functions are shared across processes: one "write" for both libcs.
	var fns []string
	for _, fn := range d.FunctionTable[1:] {
		fns = append(fns, str(fn.NameStrindex)+"@"+str(fn.FilenameStrindex))
	}
	wantFns := []string{"copy_user@", "do_syscall_64@", "write@write.c", "main.main@main.go", "main@"}
	if !slices.Equal(fns, wantFns) {
		t.Errorf("functions = %v, want %v", fns, wantFns)
	}
}

func TestBuildRequestEmptyTrace(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	a.add(&libpf.Trace{}, &libpf.SampleMeta{Process: f.procA}, uint64(f.start.UnixNano()))
	r := mustBuild(t, a.swap(f.end))
	s := r.req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples[0]
	if s.StackIndex != 0 {
		t.Errorf("empty trace got stack %d, want the zero stack", s.StackIndex)
	}
}

func TestProfileWindow(t *testing.T) {
	start := time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC)
	end := start.Add(5 * time.Second)
	ns := func(t time.Time) uint64 { return uint64(t.UnixNano()) }
	tests := []struct {
		name           string
		stamps         []time.Time
		wantStart      time.Time
		wantEnd        time.Time
		wantTimestamps []uint64
	}{
		{
			name:      "inside",
			stamps:    []time.Time{start, end.Add(-1)},
			wantStart: start, wantEnd: end,
			wantTimestamps: []uint64{ns(start), ns(end) - 1},
		},
		{
			name:      "late and early samples widen the window",
			stamps:    []time.Time{start.Add(-time.Second), end.Add(2 * time.Second)},
			wantStart: start.Add(-time.Second), wantEnd: end.Add(2*time.Second + 1),
			wantTimestamps: []uint64{ns(start.Add(-time.Second)), ns(end.Add(2 * time.Second))},
		},
		{
			// A new process's first samples wait for its set-up.
			name:      "samples seconds late keep their time",
			stamps:    []time.Time{start.Add(-20 * time.Second), start.Add(time.Second)},
			wantStart: start.Add(-20 * time.Second), wantEnd: end,
			wantTimestamps: []uint64{ns(start.Add(-20 * time.Second)), ns(start.Add(time.Second))},
		},
		{
			name:      "bogus clocks are clamped",
			stamps:    []time.Time{time.Unix(0, 1), end.Add(time.Hour)},
			wantStart: start, wantEnd: end,
			wantTimestamps: []uint64{ns(start), ns(end) - 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture()
			a := newAggregator(start, 100)
			for _, ts := range tt.stamps {
				a.add(f.t1, &libpf.SampleMeta{Process: f.procA}, ns(ts))
			}
			p := mustBuild(t, a.swap(end)).req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0]
			if p.TimeUnixNano != ns(tt.wantStart) || p.TimeUnixNano+p.DurationNano != ns(tt.wantEnd) {
				t.Errorf("window = [%d, %d), want [%d, %d)", p.TimeUnixNano, p.TimeUnixNano+p.DurationNano,
					ns(tt.wantStart), ns(tt.wantEnd))
			}
			if got := p.Samples[0].TimestampsUnixNano; !slices.Equal(got, tt.wantTimestamps) {
				t.Errorf("timestamps = %v, want %v", got, tt.wantTimestamps)
			}
		})
	}
}

// TestBuildRequestPIDReused: one pid runs two images in an interval (exec or
// pid reuse); each gets its own resource with its own executable.
func TestBuildRequestPIDReused(t *testing.T) {
	f := newFixture()
	before := &libpf.ProcessInfo{PID: 300, ExecutableName: "bash", ExecutablePath: "/bin/bash"}
	after := &libpf.ProcessInfo{PID: 300, ExecutableName: "ls", ExecutablePath: "/bin/ls"}
	a := newAggregator(f.start, 100)
	ts := uint64(f.start.UnixNano())
	a.add(f.t1, &libpf.SampleMeta{Process: before, TID: 300}, ts+1)
	a.add(f.t1, &libpf.SampleMeta{Process: after, TID: 300}, ts+2)
	a.add(f.t1, &libpf.SampleMeta{Process: after, TID: 300}, ts+3)
	r := mustBuild(t, a.swap(f.end))
	if len(r.req.ResourceProfiles) != 2 {
		t.Fatalf("%d resources, want one per image", len(r.req.ResourceProfiles))
	}
	for i, want := range []struct {
		name    string
		samples int
	}{{"bash", 1}, {"ls", 2}} {
		rp := r.req.ResourceProfiles[i]
		attrs := resourceAttrs(rp.Resource.Attributes)
		n := len(rp.ScopeProfiles[0].Profiles[0].Samples[0].TimestampsUnixNano)
		if attrs[attrExeName] != want.name || attrs[attrProcessPID] != int64(300) || n != want.samples {
			t.Errorf("resource %d: %v with %d samples, want %s with %d", i, attrs, n, want.name, want.samples)
		}
	}
}

// TestBuildRequestUnreadableFile: a mapping whose file could not be read has
// no file id, so it gets no htlhash rather than a shared zero id.
func TestBuildRequestUnreadableFile(t *testing.T) {
	f := newFixture()
	unread := &libpf.Mapping{Path: "/gone/lib.so", Start: 0x10000, End: 0x20000}
	tr := &libpf.Trace{Hash: libpf.TraceHash{Hi: 9}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x10, Mapping: unread}}}
	a := newAggregator(f.start, 10)
	a.add(tr, &libpf.SampleMeta{Process: f.procA}, uint64(f.start.UnixNano()))
	r := mustBuild(t, a.swap(f.end))
	d := r.req.Dictionary
	if len(d.MappingTable) != 2 {
		t.Fatalf("%d mappings, want the zero one and /gone/lib.so", len(d.MappingTable))
	}
	if attrs := attrsOf(d, d.MappingTable[1].AttributeIndices); len(attrs) != 0 {
		t.Errorf("mapping of an unreadable file has attributes %v", attrs)
	}
}

// TestBuildRequestPythonFrames: Python frames become locations of frame
// type "cpython" without a mapping, with their function, file and line;
// the native frames of the same stack keep their own type.
func TestBuildRequestPythonFrames(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	trace := &libpf.Trace{Hash: libpf.TraceHash{Lo: 1}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x100, Mapping: f.libcA, FunctionName: "write", SourceFile: "write.c", SourceLine: 10},
		{Kind: python.Kind, FunctionName: "cf_leaf", SourceFile: "/srv/app.py", SourceLine: 18},
		{Kind: python.Kind, FunctionName: "Worker.run", SourceFile: "/srv/app.py", SourceLine: 30},
		{Kind: python.Kind, FunctionName: "<module>", SourceFile: "/srv/app.py", SourceLine: 41},
	}}
	other := &libpf.Trace{Hash: libpf.TraceHash{Lo: 2}, Frames: []libpf.Frame{
		{Kind: python.Kind, FunctionName: "cf_leaf", SourceFile: "/srv/app.py", SourceLine: 19},
		{Kind: python.Kind, FunctionName: "<module>", SourceFile: "/srv/app.py", SourceLine: 41},
	}}
	a.add(trace, &libpf.SampleMeta{Process: f.procA}, uint64(f.start.UnixNano()))
	a.add(other, &libpf.SampleMeta{Process: f.procA}, uint64(f.start.UnixNano()))
	d := mustBuild(t, a.swap(f.end)).req.Dictionary
	str := func(i int32) string { return d.StringTable[i] }

	type loc struct {
		kind, fn, file string
		mapping        int32
		line           int64
	}
	var locs []loc
	for _, l := range d.LocationTable[1:] {
		fn := d.FunctionTable[l.Lines[0].FunctionIndex]
		locs = append(locs, loc{attrsOf(d, l.AttributeIndices)["profile.frame.type"].(string),
			str(fn.NameStrindex), str(fn.FilenameStrindex), l.MappingIndex, l.Lines[0].Line})
	}
	libc := locs[0].mapping
	want := []loc{
		{"native", "write", "write.c", libc, 10},
		{"cpython", "cf_leaf", "/srv/app.py", 0, 18},
		{"cpython", "Worker.run", "/srv/app.py", 0, 30},
		{"cpython", "<module>", "/srv/app.py", 0, 41},
		{"cpython", "cf_leaf", "/srv/app.py", 0, 19},
	}
	if libc == 0 || !slices.Equal(locs, want) {
		t.Errorf("locations =\n%v\nwant\n%v", locs, want)
	}
}

// TestBuildRequestFrameTier: a frame's tier, and whether it was inlined,
// is an attribute of its location; frames without either have none, and
// the same function at another tier is another location. A column goes
// into the location's line.
func TestBuildRequestFrameTier(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	k := libpf.FrameKind(python.ID) // any runtime's kind
	trace := &libpf.Trace{Hash: libpf.TraceHash{Lo: 3}, Frames: []libpf.Frame{
		{Kind: k, FunctionName: "leaf", Tier: "C2", Inlined: true},
		{Kind: k, FunctionName: "top", SystemName: "top(J)V", Tier: "C2"},
		{Kind: k, FunctionName: "leaf", Tier: "interpreted"},
		{Kind: k, FunctionName: "inl", Inlined: true},
		{Kind: k, FunctionName: "main", SourceLine: 12, SourceColumn: 7},
	}}
	a.add(trace, &libpf.SampleMeta{Process: f.procA}, uint64(f.start.UnixNano()))
	d := mustBuild(t, a.swap(f.end)).req.Dictionary
	if l := d.LocationTable[5].Lines[0]; l.Line != 12 || l.Column != 7 {
		t.Errorf("main at line %d, column %d; want 12, 7", l.Line, l.Column)
	}
	var got []string
	for _, l := range d.LocationTable[1:] {
		tier, _ := attrsOf(d, l.AttributeIndices)["profile.frame.tier"].(string)
		got = append(got, tier)
	}
	if want := []string{"C2 inlined", "C2", "interpreted", "inlined", ""}; !slices.Equal(got, want) {
		t.Errorf("tiers %q, want %q", got, want)
	}
	top := d.FunctionTable[d.LocationTable[2].Lines[0].FunctionIndex]
	if name, sys := d.StringTable[top.NameStrindex], d.StringTable[top.SystemNameStrindex]; name != "top" || sys != "top(J)V" {
		t.Errorf("function %q, system name %q; want top, top(J)V", name, sys)
	}
}

// TestBuildRequestTraceLinks: a sample taken in an APM trace links to its
// trace and span; the same stack outside one is a separate sample without
// a link; the APM agent's service and environment go on the resource.
func TestBuildRequestTraceLinks(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	proc := *f.procA
	proc.ServiceName, proc.DeploymentEnvironment = "checkout", "prod"
	trace := &libpf.Trace{Hash: libpf.TraceHash{Lo: 7}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x100, Mapping: f.libcA, FunctionName: "write"}}}
	apm := libpf.APMContext{Valid: true, TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{9, 8}, TransactionID: [8]byte{5}}
	ts := uint64(f.start.UnixNano())
	a.add(trace, &libpf.SampleMeta{Process: &proc, TID: 5, APM: apm}, ts)
	a.add(trace, &libpf.SampleMeta{Process: &proc, TID: 5, APM: apm}, ts+1)
	a.add(trace, &libpf.SampleMeta{Process: &proc, TID: 5}, ts+2)
	req := mustBuild(t, a.swap(f.end)).req
	d := req.Dictionary
	rp := req.ResourceProfiles[0]
	if attrs := resourceAttrs(rp.Resource.Attributes); attrs["service.name"] != "checkout" ||
		attrs["deployment.environment.name"] != "prod" {
		t.Errorf("resource attributes %v", attrs)
	}
	samples := rp.ScopeProfiles[0].Profiles[0].Samples
	if len(samples) != 2 || len(d.LinkTable) != 2 {
		t.Fatalf("%d samples, %d links; want 2 and 2 (the zero link first)", len(samples), len(d.LinkTable))
	}
	for _, s := range samples {
		l := d.LinkTable[s.LinkIndex]
		switch len(s.Values) {
		case 2:
			if s.LinkIndex == 0 || !bytes.Equal(l.TraceId, apm.TraceID[:]) || !bytes.Equal(l.SpanId, apm.SpanID[:]) {
				t.Errorf("linked sample: link %d %x/%x", s.LinkIndex, l.TraceId, l.SpanId)
			}
			// The stack-trace id the agent gets: the trace hash, big-endian,
			// base64url without padding.
			if id := attrsOf(d, s.AttributeIndices)[attrStackTraceID]; id != "AAAAAAAAAAAAAAAAAAAABw" {
				t.Errorf("linked sample: stack-trace id %v", id)
			}
		case 1:
			if s.LinkIndex != 0 {
				t.Errorf("sample outside a trace links to %d", s.LinkIndex)
			}
			if id, ok := attrsOf(d, s.AttributeIndices)[attrStackTraceID]; ok {
				t.Errorf("sample outside a trace has stack-trace id %v", id)
			}
		default:
			t.Errorf("sample of %d values", len(s.Values))
		}
	}
}

// TestBuildRequestLabels: a sample's program labels are sample attributes
// under their own keys (one of the profiler's own, prefixed "label."), and
// samples with other labels are other samples; the pprof file carries
// them as labels.
func TestBuildRequestLabels(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	trace := &libpf.Trace{Hash: libpf.TraceHash{Lo: 7}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x100, Mapping: f.libcA, FunctionName: "write"}}}
	alpha := libpf.MakeLabels([]libpf.Label{{Key: "tenant", Value: "alpha"}, {Key: attrThreadID, Value: "x"}})
	beta := libpf.MakeLabels([]libpf.Label{{Key: "tenant", Value: "beta"}})
	ts := uint64(f.start.UnixNano())
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5, Labels: alpha}, ts)
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5, Labels: alpha}, ts+1)
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5, Labels: beta}, ts+2)
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5}, ts+3)
	iv := a.swap(f.end)
	req := mustBuild(t, iv).req
	d := req.Dictionary
	samples := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples
	got := map[string]int{}
	for _, s := range samples {
		attrs := attrsOf(d, s.AttributeIndices)
		got[fmt.Sprintf("%v/%v", attrs["tenant"], attrs["label."+attrThreadID])] += len(s.Values)
		if attrs[attrThreadID] != int64(5) {
			t.Errorf("thread.id %v: a label took the profiler's own key", attrs[attrThreadID])
		}
	}
	if want := map[string]int{"alpha/x": 2, "beta/<nil>": 1, "<nil>/<nil>": 1}; !maps.Equal(got, want) {
		t.Errorf("samples by labels %v, want %v", got, want)
	}

	p := buildPprof(iv, 1)
	tenants := map[string]int64{}
	for _, s := range p.Sample {
		tenants[strings.Join(s.Label["tenant"], ",")] += s.Value[0]
	}
	if want := map[string]int64{"alpha": 2, "beta": 1, "": 1}; !maps.Equal(tenants, want) {
		t.Errorf("pprof samples by tenant %v, want %v", tenants, want)
	}
}

// TestBuildRequestSpanLinks: a sample in an OpenTelemetry span (its
// thread context) links to the span, as one in an APM trace does.
func TestBuildRequestSpanLinks(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	trace := &libpf.Trace{Hash: libpf.TraceHash{Lo: 7}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x100, Mapping: f.libcA, FunctionName: "write"}}}
	span := libpf.SpanContext{Valid: true, TraceID: [16]byte{4, 5}, SpanID: [8]byte{6}}
	ts := uint64(f.start.UnixNano())
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5, Span: span}, ts)
	a.add(trace, &libpf.SampleMeta{Process: f.procA, TID: 5}, ts+1)
	req := mustBuild(t, a.swap(f.end)).req
	d := req.Dictionary
	samples := req.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].Samples
	linked := 0
	for _, s := range samples {
		if s.LinkIndex == 0 {
			continue
		}
		linked++
		if l := d.LinkTable[s.LinkIndex]; !bytes.Equal(l.TraceId, span.TraceID[:]) || !bytes.Equal(l.SpanId, span.SpanID[:]) {
			t.Errorf("link %x/%x, want %x/%x", l.TraceId, l.SpanId, span.TraceID, span.SpanID)
		}
	}
	if len(samples) != 2 || linked != 1 {
		t.Errorf("%d samples, %d linked; want 2 and 1", len(samples), linked)
	}
}

// TestBuildRequestOffCPU: a process's off-CPU samples are a second profile
// (off_cpu, nanoseconds) whose values are the waits, paired with their
// timestamps in time order; pprof adds an off_cpu sample type.
func TestBuildRequestOffCPU(t *testing.T) {
	f := newFixture()
	a := newAggregator(f.start, 10)
	spin := &libpf.Trace{Hash: libpf.TraceHash{Lo: 1}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x100, Mapping: f.libcA, FunctionName: "spin"}}}
	sleep := &libpf.Trace{Hash: libpf.TraceHash{Lo: 2}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x200, Mapping: f.libcA, FunctionName: "nanosleep"}}}
	ts := uint64(f.start.UnixNano())
	a.add(spin, &libpf.SampleMeta{Process: f.procA, TID: 5}, ts+10)
	a.add(sleep, &libpf.SampleMeta{Process: f.procA, TID: 6, OffCPU: 30 * time.Millisecond}, ts+20)
	a.add(sleep, &libpf.SampleMeta{Process: f.procA, TID: 6, OffCPU: 10 * time.Millisecond}, ts+5)
	iv := a.swap(f.end)
	req := mustBuild(t, iv).req
	profs := req.ResourceProfiles[0].ScopeProfiles[0].Profiles
	if len(profs) != 2 {
		t.Fatalf("%d profiles, want a CPU one and an off-CPU one", len(profs))
	}
	d := req.Dictionary
	typ := func(i int) string {
		st := profs[i].SampleType
		return d.StringTable[st.TypeStrindex] + "/" + d.StringTable[st.UnitStrindex]
	}
	if typ(0) != "samples/count" || typ(1) != "off_cpu/nanoseconds" {
		t.Errorf("sample types %s and %s, want samples/count and off_cpu/nanoseconds", typ(0), typ(1))
	}
	if n := len(profs[0].Samples); n != 1 || !slices.Equal(profs[0].Samples[0].Values, []int64{1}) {
		t.Errorf("CPU profile: %v", profs[0].Samples)
	}
	off := profs[1].Samples
	if len(off) != 1 || !slices.Equal(off[0].Values, []int64{int64(10 * time.Millisecond), int64(30 * time.Millisecond)}) ||
		!slices.Equal(off[0].TimestampsUnixNano, []uint64{ts + 5, ts + 20}) {
		t.Errorf("off-CPU profile: %v", off)
	}

	p := buildPprof(iv, 50_000_000)
	if n := len(p.SampleType); n != 3 || p.SampleType[2].Type != "off_cpu" || p.SampleType[2].Unit != "nanoseconds" {
		t.Fatalf("pprof sample types %v, want samples, cpu and off_cpu", p.SampleType)
	}
	var total [3]int64
	for _, s := range p.Sample {
		for i, v := range s.Value {
			total[i] += v
		}
	}
	if want := [3]int64{1, 50_000_000, int64(40 * time.Millisecond)}; total != want {
		t.Errorf("pprof totals %v, want %v", total, want)
	}
}

package reporter

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
)

func TestReportSampleAccounting(t *testing.T) {
	f := newFixture()
	tests := []struct {
		name         string
		limit        int
		report       func(r *Reporter)
		wantReceived uint64
		wantDropped  uint64
		wantKept     int
	}{
		{
			name:  "all kept",
			limit: 100,
			report: func(r *Reporter) {
				f.report(r.ReportSample)
			},
			wantReceived: fixtureSamples, wantKept: fixtureSamples,
		},
		{
			name:  "over the interval limit",
			limit: 5,
			report: func(r *Reporter) {
				f.report(r.ReportSample)
			},
			wantReceived: fixtureSamples, wantDropped: fixtureSamples - 5, wantKept: 5,
		},
		{
			name:  "nil inputs",
			limit: 100,
			report: func(r *Reporter) {
				r.ReportSample(nil, &libpf.SampleMeta{})
				r.ReportSample(f.t1, nil)
			},
			wantReceived: 2, wantDropped: 2,
		},
		{
			name:  "no process or time",
			limit: 100,
			report: func(r *Reporter) {
				r.ReportSample(f.t1, &libpf.SampleMeta{TID: 7})
			},
			wantReceived: 1, wantKept: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, hook := newTestReporter(t, Config{TopN: 1, MaxSamplesPerInterval: tt.limit})
			before := time.Now()
			tt.report(r)
			// Peek at the open interval; the test is its only user.
			iv := r.agg.cur
			st := r.Stats()
			if st.SamplesReceived != tt.wantReceived || st.SamplesDropped != tt.wantDropped || iv.samples != tt.wantKept {
				t.Errorf("received %d, dropped %d, kept %d; want %d, %d, %d",
					st.SamplesReceived, st.SamplesDropped, iv.samples, tt.wantReceived, tt.wantDropped, tt.wantKept)
			}
			for _, g := range iv.groups {
				for _, ts := range g.timestamps {
					if g.key.process == nil && ts < uint64(before.UnixNano()) {
						t.Errorf("sample without time not stamped on arrival: %d", ts)
					}
				}
			}
			// The limit warning comes from reporting the interval.
			if err := r.reportInterval(time.Now()); err != nil {
				t.Fatal(err)
			}
			warned := countLogs(hook, logrus.WarnLevel, "interval sample limit reached; samples dropped") == 1
			if want := tt.limit < fixtureSamples; warned != want {
				t.Errorf("limit warning logged = %v, want %v", warned, want)
			}
		})
	}
}

func TestEmptyIntervalReportsNothing(t *testing.T) {
	dir := t.TempDir()
	c := &fakeCollector{}
	r, hook := newTestReporter(t, Config{OutputDir: dir, TopN: 5, CollectionAgent: serve(t, "127.0.0.1:0", c)})
	if err := r.reportInterval(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 0 || len(c.requests()) != 0 || len(hook.AllEntries()) != 0 || r.Stats().Intervals != 0 {
		t.Errorf("empty interval produced files %v, %d requests, logs %v", files, len(c.requests()), hook.AllEntries())
	}
}

// TestFirstIntervalShort: until the first export, intervals end every
// FirstInterval (empty ones export nothing); after it, every Interval.
func TestFirstIntervalShort(t *testing.T) {
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{OutputDir: dir, Interval: time.Hour, FirstInterval: 20 * time.Millisecond})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a few empty first intervals
	newFixture().report(r.ReportSample)
	waitFor(t, "the first export", func() bool { return r.Stats().Intervals == 1 })
	newFixture().report(r.ReportSample)
	time.Sleep(100 * time.Millisecond)
	if n := r.Stats().Intervals; n != 1 {
		t.Errorf("%d intervals exported within 100 ms after the first, want the next after an hour", n)
	}
}

// TestFirstIntervalFromStart: the first interval begins when the reporter
// starts, not when it was made, unless samples came before.
func TestFirstIntervalFromStart(t *testing.T) {
	made := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	started := made.Add(2 * time.Second)
	a := newAggregator(made, defaultMaxSamplesPerInterval)
	a.restartIfEmpty(started)
	if a.cur.start != started {
		t.Errorf("empty first interval starts at %v, want %v", a.cur.start, started)
	}
	newFixture().report(func(tr *libpf.Trace, m *libpf.SampleMeta) { a.add(tr, m, uint64(m.Time.UnixNano())) })
	a.restartIfEmpty(started.Add(time.Second))
	if a.cur.start != started {
		t.Errorf("interval with samples moved to %v, want %v kept", a.cur.start, started)
	}
}

func TestSummaryLogged(t *testing.T) {
	r, hook := newTestReporter(t, Config{TopN: 2})
	newFixture().report(r.ReportSample)
	if err := r.reportInterval(time.Now()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range hook.AllEntries() {
		lines = append(lines, e.Message)
	}
	want := []string{
		fmt.Sprintf("top 2 functions by self samples (of %d samples):", fixtureSamples),
		"copy_user (app-a) 30.8%",
		"copy_user (app-b) 30.8%",
	}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Errorf("logged %q, want %q", lines, want)
	}
}

// benchTraces makes n traces of depth frames spread over procs processes.
// Functions come from a small pool and libc is shared, as on a real host.
func benchTraces(n, depth, procs int) ([]*libpf.Trace, []libpf.SampleMeta) {
	libc := &libpf.Mapping{FileID: libpf.FileID{0xc}, Path: "/usr/lib/libc.so.6", Start: 0x7f0000000000,
		End: 0x7f0000200000, Bias: 0x7f0000000000, GNUBuildID: "cc"}
	var infos []*libpf.ProcessInfo
	var exes []*libpf.Mapping
	for p := range procs {
		infos = append(infos, &libpf.ProcessInfo{PID: libpf.PID(1000 + p), ExecutableName: fmt.Sprintf("app%d", p),
			ExecutablePath: fmt.Sprintf("/usr/bin/app%d", p)})
		exes = append(exes, &libpf.Mapping{FileID: libpf.FileID{byte(p), 1}, Path: infos[p].ExecutablePath,
			Start: 0x400000, End: 0x900000})
	}
	traces := make([]*libpf.Trace, n)
	metas := make([]libpf.SampleMeta, n)
	for i := range traces {
		p := i % procs
		t := &libpf.Trace{Hash: libpf.TraceHash{Hi: uint64(i), Lo: uint64(i) * 31}}
		for j := range depth {
			m := exes[p]
			if j < 3 {
				m = libc
			}
			t.Frames = append(t.Frames, libpf.Frame{Kind: libpf.FrameNative, Mapping: m,
				Address:      uint64(0x1000 + (i*depth+j)%4096*16),
				FunctionName: fmt.Sprintf("func%d", (i+j)%200), SourceFile: "src.c", SourceLine: uint32(j)})
		}
		traces[i] = t
		metas[i] = libpf.SampleMeta{TID: libpf.TID(1000 + p*4 + i%4), ThreadName: "worker", CPU: i % 8,
			Process: infos[p]}
	}
	return traces, metas
}

func BenchmarkReportSample(b *testing.B) {
	traces, metas := benchTraces(1000, 20, 10)
	r, err := newReporter(Config{TopN: 1, Interval: time.Hour, SamplesPerSecond: 20},
		defaultRetryPolicy(), logrus.NewEntry(logrus.New()))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := range metas {
		metas[i].Time = now
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		r.ReportSample(traces[i%len(traces)], &metas[i%len(metas)])
		i++
		if i%(1<<16) == 0 {
			// Keep the interval well below its sample limit, as the ticker would.
			r.agg.swap(now)
		}
	}
}

func BenchmarkBuildRequest(b *testing.B) {
	traces, metas := benchTraces(1000, 20, 10)
	a := newAggregator(time.Now(), defaultMaxSamplesPerInterval)
	now := uint64(time.Now().UnixNano())
	for i := range traces {
		for k := range 5 {
			a.add(traces[i], &metas[i], now+uint64(k))
		}
	}
	iv := a.swap(time.Now().Add(time.Second))
	opts := testOptions()
	if err := Validate(buildRequest(iv, opts).req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		buildRequest(iv, opts)
	}
}

func BenchmarkBuildPprof(b *testing.B) {
	traces, metas := benchTraces(1000, 20, 10)
	a := newAggregator(time.Now(), defaultMaxSamplesPerInterval)
	for i := range traces {
		a.add(traces[i], &metas[i], uint64(time.Now().UnixNano()))
	}
	iv := a.swap(time.Now())
	b.ReportAllocs()
	for b.Loop() {
		buildPprof(iv, 50_000_000)
	}
}

package reporter

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// fakeCollector is an in-process OTLP profiles receiver. The slim proto
// module has no server stub either, so the Export method is registered by
// hand, which also checks that our method name matches what a server serves.
type fakeCollector struct {
	mu           sync.Mutex
	reqs         []*collectorpb.ExportProfilesServiceRequest
	compressions []string
	payloads     []*stats.InPayload
	calls        int
	// reply, if set, decides the outcome of call n (1-based).
	reply func(n int) (*collectorpb.ExportProfilesServiceResponse, error)
}

type exportServer interface {
	export(context.Context, *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error)
}

var _ exportServer = (*fakeCollector)(nil)

func (c *fakeCollector) export(_ context.Context, req *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.reply != nil {
		resp, err := c.reply(c.calls)
		if err != nil {
			return nil, err
		}
		c.reqs = append(c.reqs, req)
		return resp, nil
	}
	c.reqs = append(c.reqs, req)
	return &collectorpb.ExportProfilesServiceResponse{}, nil
}

func (c *fakeCollector) requests() []*collectorpb.ExportProfilesServiceRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*collectorpb.ExportProfilesServiceRequest(nil), c.reqs...)
}

// fakeCollector is also the server's stats handler, to see how requests
// arrived on the wire.
func (c *fakeCollector) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c *fakeCollector) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c *fakeCollector) HandleConn(context.Context, stats.ConnStats) {}
func (c *fakeCollector) HandleRPC(_ context.Context, s stats.RPCStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch s := s.(type) {
	case *stats.InHeader:
		c.compressions = append(c.compressions, s.Compression)
	case *stats.InPayload:
		c.payloads = append(c.payloads, s)
	}
}

func profilesServiceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "opentelemetry.proto.collector.profiles.v1development.ProfilesService",
		HandlerType: (*exportServer)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Export",
			Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				req := &collectorpb.ExportProfilesServiceRequest{}
				if err := dec(req); err != nil {
					return nil, err
				}
				return srv.(exportServer).export(ctx, req)
			},
		}},
	}
}

// serve runs c on addr ("127.0.0.1:0" for any port) until the test ends.
func serve(t *testing.T, addr string, c *fakeCollector) string {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	s := grpc.NewServer(grpc.StatsHandler(c))
	s.RegisterService(profilesServiceDesc(), c)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// freeAddr returns a loopback address nothing listens on (for now).
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}

// newTestReporter builds a plaintext reporter with fast retries and a
// captured log.
func newTestReporter(t *testing.T, cfg Config) (*Reporter, *logtest.Hook) {
	t.Helper()
	cfg.DisableTLS = true
	return newTestReporterTLS(t, cfg)
}

// newTestReporterTLS is newTestReporter keeping cfg's TLS settings.
func newTestReporterTLS(t *testing.T, cfg Config) (*Reporter, *logtest.Hook) {
	t.Helper()
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour // intervals are ended by hand unless a test wants the ticker
	}
	if cfg.FirstInterval == 0 {
		cfg.FirstInterval = cfg.Interval
	}
	if cfg.SamplesPerSecond == 0 {
		cfg.SamplesPerSecond = 20
	}
	policy := retryPolicy{initial: 10 * time.Millisecond, max: 50 * time.Millisecond, attemptTimeout: 2 * time.Second}
	r, err := newReporter(cfg, policy, logrus.NewEntry(logger))
	if err != nil {
		t.Fatalf("newReporter: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, hook
}

// waitFor polls cond until it holds or the test has waited too long.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func countLogs(hook *logtest.Hook, level logrus.Level, msg string) int {
	n := 0
	for _, e := range hook.AllEntries() {
		if e.Level == level && e.Message == msg {
			n++
		}
	}
	return n
}

func checkRequests(t *testing.T, reqs []*collectorpb.ExportProfilesServiceRequest, wantSamples ...int64) {
	t.Helper()
	if len(reqs) != len(wantSamples) {
		t.Fatalf("collector got %d requests, want %d", len(reqs), len(wantSamples))
	}
	for i, req := range reqs {
		if err := Validate(req); err != nil {
			t.Errorf("request %d invalid: %v", i, err)
		}
		if got := sumSamples(req); got != wantSamples[i] {
			t.Errorf("request %d has %d samples, want %d", i, got, wantSamples[i])
		}
	}
}

func TestExportOverTicker(t *testing.T) {
	c := &fakeCollector{}
	addr := serve(t, "127.0.0.1:0", c)
	r, hook := newTestReporter(t, Config{CollectionAgent: addr, Interval: 20 * time.Millisecond})
	newFixture().report(r.ReportSample)
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an export", func() bool { return r.Stats().SamplesExported == fixtureSamples })
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkRequests(t, c.requests(), fixtureSamples)

	c.mu.Lock()
	for i, comp := range c.compressions {
		if comp != "gzip" {
			t.Errorf("request %d compression = %q, want gzip", i, comp)
		}
	}
	for i, p := range c.payloads {
		if p.CompressedLength >= p.Length {
			t.Errorf("payload %d: %d bytes compressed from %d, want smaller", i, p.CompressedLength, p.Length)
		}
	}
	c.mu.Unlock()

	var logged int
	for _, e := range hook.AllEntries() {
		if e.Message == "exported profiles" {
			logged += e.Data["samples"].(int)
			if e.Data["profiles"] != fixtureProfiles {
				t.Errorf("logged profiles = %v, want %d", e.Data["profiles"], fixtureProfiles)
			}
		}
	}
	if logged != fixtureSamples {
		t.Errorf("sum of logged exported samples = %d, want %d", logged, fixtureSamples)
	}
	st := r.Stats()
	want := Stats{SamplesReceived: fixtureSamples, Intervals: 1, SamplesExported: fixtureSamples, RequestsExported: 1}
	if st != want {
		t.Errorf("Stats = %+v, want %+v", st, want)
	}
}

func TestExportRetriesUntilCollectorUp(t *testing.T) {
	addr := freeAddr(t)
	r, hook := newTestReporter(t, Config{CollectionAgent: addr})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	newFixture().report(r.ReportSample)
	if err := r.reportInterval(time.Now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "failed attempts", func() bool { return r.Stats().ExportErrors >= 3 })

	c := &fakeCollector{}
	serve(t, addr, c)
	waitFor(t, "delivery after retry", func() bool { return r.Stats().SamplesExported == fixtureSamples })
	checkRequests(t, c.requests(), fixtureSamples)

	if n := countLogs(hook, logrus.WarnLevel, "OTLP export failing; retrying with backoff (further failures logged at debug level until it recovers)"); n != 1 {
		t.Errorf("outage warned %d times, want once", n)
	}
	if n := countLogs(hook, logrus.InfoLevel, "OTLP export recovered"); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
	if st := r.Stats(); st.RequestsDropped != 0 || st.RequestsExported != 1 {
		t.Errorf("Stats = %+v, want 1 exported and none dropped", st)
	}
}

// reportN reports n samples of one trace and ends the interval.
func reportN(t *testing.T, r *Reporter, n int) {
	t.Helper()
	f := newFixture()
	for range n {
		r.ReportSample(f.t1, &libpf.SampleMeta{TID: 1, Process: f.procA, Time: time.Now()})
	}
	if err := r.reportInterval(time.Now()); err != nil {
		t.Fatal(err)
	}
}

// Intervals that wait are merged while the sample limit allows; beyond the
// queue's bound, without a spool, the oldest are dropped.
func TestQueueMergesThenDropsOldest(t *testing.T) {
	addr := freeAddr(t)
	r, _ := newTestReporter(t, Config{CollectionAgent: addr, MaxQueuedRequests: 2, MaxSamplesPerInterval: 5})
	// Not started: nothing sends, so the queue only fills: 1+2 merged,
	// then 3, 4 and 5 each alone, the two oldest dropped.
	for i := 1; i <= 5; i++ {
		reportN(t, r, i)
	}
	if st := r.Stats(); st.RequestsDropped != 2 || st.IntervalsMerged != 1 {
		t.Fatalf("Stats = %+v, want 2 requests dropped, 1 interval merged", st)
	}
	c := &fakeCollector{}
	serve(t, addr, c)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Close delivers what is left: the two newest intervals.
	checkRequests(t, c.requests(), 4, 5)
	if st := r.Stats(); st.SamplesExported != 9 || st.RequestsDropped != 2 {
		t.Errorf("Stats = %+v, want 9 samples exported and 2 requests dropped", st)
	}
}

func TestCloseFlushesLastInterval(t *testing.T) {
	c := &fakeCollector{}
	addr := serve(t, "127.0.0.1:0", c)
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{CollectionAgent: addr, OutputDir: dir, TopN: 3})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	newFixture().report(r.ReportSample)
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkRequests(t, c.requests(), fixtureSamples)
	files, _ := filepath.Glob(filepath.Join(dir, pprofPattern))
	if len(files) != 1 {
		t.Errorf("got pprof files %v, want one", files)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := r.Start(context.Background()); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestCloseGivesUpOnDeadCollector(t *testing.T) {
	r, _ := newTestReporter(t, Config{CollectionAgent: freeAddr(t), FlushTimeout: 200 * time.Millisecond})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	newFixture().report(r.ReportSample)
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with a dead collector", d)
	}
	if st := r.Stats(); st.RequestsDropped != 1 || st.SamplesExported != 0 {
		t.Errorf("Stats = %+v, want the one request dropped", st)
	}
}

func TestExportResponses(t *testing.T) {
	tests := []struct {
		name  string
		reply func(n int) (*collectorpb.ExportProfilesServiceResponse, error)
		// calls is how many attempts the collector should see in total.
		calls int
		want  Stats
	}{
		{
			name: "permanent error drops without retry",
			reply: func(int) (*collectorpb.ExportProfilesServiceResponse, error) {
				return nil, status.Error(codes.InvalidArgument, "bad profile")
			},
			calls: 1,
			want:  Stats{SamplesReceived: 3, Intervals: 1, ExportErrors: 1, RequestsDropped: 1},
		},
		{
			name: "partial success is counted",
			reply: func(int) (*collectorpb.ExportProfilesServiceResponse, error) {
				return &collectorpb.ExportProfilesServiceResponse{PartialSuccess: &collectorpb.ExportProfilesPartialSuccess{
					RejectedProfiles: 1, ErrorMessage: "one was odd"}}, nil
			},
			calls: 1,
			want: Stats{SamplesReceived: 3, Intervals: 1, SamplesExported: 3, RequestsExported: 1,
				ProfilesRejected: 1},
		},
		{
			name: "transient error is retried",
			reply: func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
				if n < 3 {
					return nil, status.Error(codes.Unavailable, "busy")
				}
				return &collectorpb.ExportProfilesServiceResponse{}, nil
			},
			calls: 3,
			want:  Stats{SamplesReceived: 3, Intervals: 1, SamplesExported: 3, RequestsExported: 1, ExportErrors: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &fakeCollector{reply: tt.reply}
			r, _ := newTestReporter(t, Config{CollectionAgent: serve(t, "127.0.0.1:0", c)})
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			reportN(t, r, 3)
			waitFor(t, "the collector's calls", func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.calls >= tt.calls
			})
			waitFor(t, "the outcome to be counted", func() bool {
				st := r.Stats()
				return st.RequestsExported+st.RequestsDropped == 1
			})
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			if c.calls != tt.calls {
				t.Errorf("collector saw %d calls, want %d", c.calls, tt.calls)
			}
			c.mu.Unlock()
			if st := r.Stats(); st != tt.want {
				t.Errorf("Stats = %+v, want %+v", st, tt.want)
			}
		})
	}
}

func TestTLSIsOnByDefault(t *testing.T) {
	c := &fakeCollector{}
	addr := serve(t, "127.0.0.1:0", c) // plaintext only
	logger, _ := logtest.NewNullLogger()
	policy := retryPolicy{initial: 10 * time.Millisecond, max: 50 * time.Millisecond, attemptTimeout: time.Second}
	r, err := newReporter(Config{CollectionAgent: addr, Interval: time.Hour, SamplesPerSecond: 20},
		policy, logrus.NewEntry(logger))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportN(t, r, 1)
	waitFor(t, "a failed TLS handshake", func() bool { return r.Stats().ExportErrors > 0 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(c.requests()); n != 0 {
		t.Errorf("plaintext collector received %d requests from a TLS client", n)
	}
}

// TestPushedOutWhileInFlight covers a request that the full queue pushes out
// while it is being sent: it is lost only if that attempt fails.
func TestPushedOutWhileInFlight(t *testing.T) {
	tests := []struct {
		name        string
		firstErr    error
		wantSamples []int64
		wantDropped uint64
	}{
		{"delivered anyway", nil, []int64{1, 2}, 0},
		{"attempt fails", status.Error(codes.Unavailable, "down"), []int64{2}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entered, release := make(chan struct{}), make(chan struct{})
			c := &fakeCollector{}
			c.reply = func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
				if n == 1 {
					close(entered)
					c.mu.Unlock() // let the test inspect c while this call waits
					<-release
					c.mu.Lock()
					return &collectorpb.ExportProfilesServiceResponse{}, tt.firstErr
				}
				return &collectorpb.ExportProfilesServiceResponse{}, nil
			}
			r, _ := newTestReporter(t, Config{CollectionAgent: serve(t, "127.0.0.1:0", c), MaxQueuedRequests: 1})
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			reportN(t, r, 1)
			<-entered
			reportN(t, r, 2) // pushes the in-flight request out of the queue
			close(release)
			waitFor(t, "the second request", func() bool { return r.Stats().RequestsExported == uint64(len(tt.wantSamples)) })
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkRequests(t, c.requests(), tt.wantSamples...)
			if got := r.Stats().RequestsDropped; got != tt.wantDropped {
				t.Errorf("RequestsDropped = %d, want %d", got, tt.wantDropped)
			}
		})
	}
}

// requestTimes returns each request's profiles' start times.
func requestTimes(reqs []*collectorpb.ExportProfilesServiceRequest) []uint64 {
	var ts []uint64
	for _, req := range reqs {
		for _, rp := range req.GetResourceProfiles() {
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					ts = append(ts, p.GetTimeUnixNano())
				}
			}
		}
	}
	return ts
}

// reportEach reports intervals of 1..n samples, each ended at once.
func reportEach(t *testing.T, r *Reporter, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		reportN(t, r, i)
		time.Sleep(2 * time.Millisecond) // distinct interval times
	}
}

// sumAll is the samples of all requests.
func sumAll(reqs []*collectorpb.ExportProfilesServiceRequest) int64 {
	var n int64
	for _, req := range reqs {
		n += sumSamples(req)
	}
	return n
}

// TestSpoolOutage: intervals reported while the collector is down go to
// the spool and all arrive, once each, when it is back; the spool ends
// empty.
func TestSpoolOutage(t *testing.T) {
	addr := freeAddr(t)
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{CollectionAgent: addr, SpoolDir: dir, MaxQueuedRequests: 2, MaxSamplesPerInterval: 15})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportEach(t, r, 1, 12) // 78 samples
	waitFor(t, "the spool to take every interval", func() bool {
		st := r.Stats()
		return st.Spool.Appended > 0 && int(st.Spool.Appended)+int(st.IntervalsMerged) == 12
	})
	if st := r.Stats(); st.RequestsDropped != 0 || st.Spool.Records == 0 {
		t.Fatalf("during the outage: %+v", st)
	}
	c := &fakeCollector{}
	serve(t, addr, c)
	waitFor(t, "the replay", func() bool { return r.Stats().SamplesExported == 78 })
	reqs := c.requests()
	if n := sumAll(reqs); n != 78 {
		t.Fatalf("collector got %d samples, want 78", n)
	}
	for i, req := range reqs {
		if err := Validate(req); err != nil {
			t.Errorf("request %d invalid: %v", i, err)
		}
	}
	// The spool is replayed in order; an interval that had not reached it
	// when the collector came back goes first, each making one step back
	// in time.
	st := r.Stats()
	ts := requestTimes(reqs)
	live := int(st.RequestsExported - st.RequestsReplayed)
	var back int
	for i := 1; i < len(ts); i++ {
		if ts[i] < ts[i-1] {
			back++
		}
	}
	if back > live {
		t.Errorf("%d steps back in time, %d requests not replayed: %v", back, live, ts)
	}
	if st.Spool.Records != 0 || st.RequestsReplayed != st.Spool.Appended || st.RequestsDropped != 0 {
		t.Errorf("after the replay: %+v", st)
	}
}

// TestSpoolAcrossRestart: what a reporter could not deliver by Close is
// delivered by the next one, with its original times.
func TestSpoolAcrossRestart(t *testing.T) {
	addr := freeAddr(t)
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{CollectionAgent: addr, SpoolDir: dir, FlushTimeout: 300 * time.Millisecond})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := uint64(time.Now().UnixNano())
	reportN(t, r, 7)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.RequestsDropped != 0 || st.Spool.Records != 1 {
		t.Fatalf("after Close with the collector down: %+v", st)
	}

	c := &fakeCollector{}
	serve(t, addr, c)
	r2, _ := newTestReporter(t, Config{CollectionAgent: addr, SpoolDir: dir})
	if err := r2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replay", func() bool { return r2.Stats().RequestsReplayed == 1 })
	checkRequests(t, c.requests(), 7)
	if ts := requestTimes(c.requests()); ts[0] < before-uint64(time.Second) || ts[0] > before+uint64(time.Second) {
		t.Errorf("replayed profile starts at %d, reported at %d", ts[0], before)
	}
}

// TestSpoolReplayRate: the replay keeps to its rate, and an interval
// reported meanwhile goes before what is left of it.
func TestSpoolReplayRate(t *testing.T) {
	addr := freeAddr(t)
	dir := t.TempDir()
	r, _ := newTestReporter(t, Config{CollectionAgent: addr, SpoolDir: dir, FlushTimeout: 100 * time.Millisecond})
	for range 6 {
		reportN(t, r, 1)
		r.exp.mu.Lock()
		waiting := r.exp.queue
		r.exp.queue = nil
		r.exp.mu.Unlock()
		r.exp.spill(waiting...)
	}
	r.Close()
	size := r.Stats().Spool.Bytes / 6

	c := &fakeCollector{}
	serve(t, addr, c)
	// Two records a second.
	r2, _ := newTestReporter(t, Config{CollectionAgent: addr, SpoolDir: dir, SpoolReplayBytesPerSecond: float64(2 * size)})
	start := time.Now()
	if err := r2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a first replay", func() bool { return r2.Stats().RequestsReplayed >= 1 })
	reportN(t, r2, 50)
	waitFor(t, "the replay", func() bool { return r2.Stats().RequestsReplayed == 6 })
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("6 records replayed at 2 a second in %v", d)
	}
	var pos int
	for i, req := range c.requests() {
		if sumSamples(req) == 50 {
			pos = i
		}
	}
	if pos == 0 || pos >= 5 {
		t.Errorf("the new interval was request %d of 7, want it before the replay's end", pos)
	}
}

// TestRecoveryWithinInterval: with a long backoff, delivery still resumes
// within about one reporter interval of the collector's return.
func TestRecoveryWithinInterval(t *testing.T) {
	addr := freeAddr(t)
	logger, _ := logtest.NewNullLogger()
	policy := retryPolicy{initial: 10 * time.Millisecond, max: time.Minute, attemptTimeout: 2 * time.Second}
	r, err := newReporter(Config{CollectionAgent: addr, DisableTLS: true, Interval: 500 * time.Millisecond,
		SamplesPerSecond: 20, SpoolDir: t.TempDir()}, policy, logrus.NewEntry(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportN(t, r, 3)
	// Long enough for the backoff to pass the interval many times.
	waitFor(t, "failed attempts", func() bool { return r.Stats().ExportErrors >= 8 })
	time.Sleep(2 * time.Second)
	c := &fakeCollector{}
	serve(t, addr, c)
	back := time.Now()
	waitFor(t, "delivery", func() bool { return r.Stats().SamplesExported == 3 })
	if d := time.Since(back); d > 3*time.Second {
		t.Errorf("delivery resumed %v after the collector came back (interval 500ms)", d)
	}
}

// TestSlowCollectorMerges: a collector that takes 200 ms per request,
// intervals every 20 ms: the intervals that wait are merged, so it gets
// fewer, larger requests, and every sample.
func TestSlowCollectorMerges(t *testing.T) {
	c := &fakeCollector{reply: func(int) (*collectorpb.ExportProfilesServiceResponse, error) {
		time.Sleep(200 * time.Millisecond)
		return &collectorpb.ExportProfilesServiceResponse{}, nil
	}}
	r, _ := newTestReporter(t, Config{CollectionAgent: serve(t, "127.0.0.1:0", c), MaxQueuedRequests: 2})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const intervals = 50
	for range intervals {
		reportN(t, r, 2)
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, "every sample", func() bool { return r.Stats().SamplesExported == 2*intervals })
	st := r.Stats()
	if st.RequestsExported >= intervals/2 || st.IntervalsMerged == 0 || st.RequestsDropped != 0 {
		t.Errorf("Stats = %+v: want fewer than %d requests for %d intervals, none dropped", st, intervals/2, intervals)
	}
	t.Logf("%d intervals in %d requests", intervals, st.RequestsExported)
}

// TestResourceExhaustedRetryInfo: a collector that answers
// RESOURCE_EXHAUSTED with a retry delay is not asked again before it.
func TestResourceExhaustedRetryInfo(t *testing.T) {
	var first time.Time
	var second time.Duration
	c := &fakeCollector{reply: func(n int) (*collectorpb.ExportProfilesServiceResponse, error) {
		if n == 1 {
			first = time.Now()
			st, _ := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(300 * time.Millisecond)})
			return nil, st.Err()
		}
		second = time.Since(first)
		return &collectorpb.ExportProfilesServiceResponse{}, nil
	}}
	r, _ := newTestReporter(t, Config{CollectionAgent: serve(t, "127.0.0.1:0", c), Interval: time.Second})
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportN(t, r, 3)
	waitFor(t, "delivery", func() bool { return r.Stats().SamplesExported == 3 })
	c.mu.Lock()
	defer c.mu.Unlock()
	if second < 300*time.Millisecond {
		t.Errorf("asked again %v after RESOURCE_EXHAUSTED with a 300ms retry delay", second)
	}
}

// TestSpoolUnusable: a spool directory the daemon cannot use leaves it
// exporting, without a spool, and says so.
func TestSpoolUnusable(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	c := &fakeCollector{}
	r, hook := newTestReporter(t, Config{CollectionAgent: serve(t, "127.0.0.1:0", c), SpoolDir: dir})
	if r.exp.spool != nil {
		t.Fatal("a directory others may write to was used")
	}
	var warned bool
	for _, e := range hook.AllEntries() {
		warned = warned || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "not keeping what the collector does not take"))
	}
	if !warned {
		t.Error("no warning")
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportN(t, r, 4)
	waitFor(t, "delivery", func() bool { return r.Stats().SamplesExported == 4 })
}

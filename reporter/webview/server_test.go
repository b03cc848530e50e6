package webview

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/utils/testcerts"
)

// testStart is before the reporter's interval begins: the samples come
// late, as a pipeline's delay makes them, and count at their own time.
var testStart = time.Now().Add(-10 * time.Second).Truncate(time.Second)

// chain is a native trace of the named functions, outermost first.
func chain(hash uint64, names ...string) *libpf.Trace {
	t := &libpf.Trace{Hash: libpf.TraceHash{Lo: hash}}
	for i := len(names) - 1; i >= 0; i-- {
		t.Frames = append(t.Frames, libpf.Frame{Kind: libpf.FrameNative, FunctionName: names[i],
			SourceFile: "app.c", SourceLine: uint32(10 + i)})
	}
	return t
}

// newTestHistory fills a history the way the daemon does, through a
// reporter: 30 samples of main>work>hash in pid 10 ("app") and 10 of
// main>idle in pid 20 ("db", thread "io"), one per 100ms from testStart.
func newTestHistory(t *testing.T) *reporter.History {
	t.Helper()
	return reportedHistory(t, func(r *reporter.Reporter) {
		app := &libpf.ProcessInfo{PID: 10, ExecutableName: "app"}
		db := &libpf.ProcessInfo{PID: 20, ExecutableName: "db", ContainerID: "c1"}
		work, idle := chain(1, "main", "work", "hash"), chain(2, "main", "idle")
		for i := range 40 {
			meta := &libpf.SampleMeta{Time: testStart.Add(time.Duration(i) * 100 * time.Millisecond), TID: 10,
				ThreadName: "app", Process: app}
			tr := work
			if i%4 == 3 {
				tr, meta.Process, meta.TID, meta.ThreadName = idle, db, 20, "io"
			}
			r.ReportSample(tr, meta)
		}
	})
}

// reportedHistory is the history of a reporter at 10 Hz that report fed.
func reportedHistory(t *testing.T, report func(*reporter.Reporter)) *reporter.History {
	t.Helper()
	h, err := reporter.NewHistory(reporter.HistoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reporter.New(reporter.Config{Interval: time.Hour, SamplesPerSecond: 10, History: h})
	if err != nil {
		t.Fatal(err)
	}
	report(r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return h
}

func newTestServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.History == nil {
		cfg.History = newTestHistory(t)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, err := New(cfg, logrus.NewEntry(logrus.StandardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// localRequest is a request as a browser on this machine sends it.
func localRequest(method, target string, body io.Reader) *http.Request {
	req := httptest.NewRequest(method, target, body)
	req.Host = "127.0.0.1:8230"
	return req
}

func get(t *testing.T, h http.Handler, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, localRequest(http.MethodGet, target, nil))
	return rec
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decoding %s: %v", rec.Body, err)
	}
	return v
}

func TestAPI(t *testing.T) {
	h := newTestServer(t, Config{Host: "web-1", Version: "v1", SamplesPerSecond: 10, Interval: 5 * time.Second}).Handler()

	sum := decode[summaryJSON](t, get(t, h, "/api/summary"))
	if sum.Host != "web-1" || sum.Samples != 40 || sum.Intervals != 1 || sum.Start > testStart.UnixMilli() ||
		sum.IntervalSeconds != 5 || len(sum.Kinds) == 0 {
		t.Errorf("summary %+v", sum)
	}

	fl := decode[flameJSON](t, get(t, h, "/api/flame"))
	if fl.Total != 40 || len(fl.Nodes.ID) != 8 || fl.Nodes.Parent[0] != -1 || fl.Strings[fl.Nodes.Name[0]] != "all" {
		t.Fatalf("flame %+v", fl)
	}
	n := len(fl.Nodes.ID)
	for _, col := range []int{len(fl.Nodes.Parent), len(fl.Nodes.Name), len(fl.Nodes.Kind), len(fl.Nodes.File),
		len(fl.Nodes.Line), len(fl.Nodes.Total), len(fl.Nodes.Self), len(fl.Nodes.Match)} {
		if col != n {
			t.Fatalf("columns of unequal length: %+v", fl.Nodes)
		}
	}
	names := map[string]int{}
	for i := range n {
		names[fl.Strings[fl.Nodes.Name[i]]] = i
		if i > 0 && fl.Nodes.Parent[i] >= int32(i) {
			t.Errorf("node %d comes before its parent", i)
		}
	}
	hash := names["hash"]
	if fl.Nodes.Total[hash] != 30 || fl.Nodes.Line[hash] != 12 || fl.Strings[fl.Nodes.File[hash]] != "app.c" ||
		fl.Kinds[fl.Nodes.Kind[hash]] != "native" || fl.Kinds[fl.Nodes.Kind[names["app"]]] != "process" {
		t.Errorf("hash node: %+v", fl)
	}

	// Zoom into app > main > work by the ids the response gave.
	focus := fl.Nodes.ID[names["app"]] + "," + fl.Nodes.ID[names["main"]] + "," + fl.Nodes.ID[names["work"]]
	zoom := decode[flameJSON](t, get(t, h, "/api/flame?focus="+focus))
	if zoom.Total != 30 || len(zoom.Nodes.ID) != 2 || len(zoom.Path) != 4 || zoom.Path[3].Name != "work" {
		t.Errorf("zoomed: %+v", zoom)
	}

	fl = decode[flameJSON](t, get(t, h, "/api/flame?search=HAS&pid=10"))
	if fl.Total != 30 || fl.Matched != 30 {
		t.Errorf("search: total %d matched %d", fl.Total, fl.Matched)
	}

	diff := decode[flameJSON](t, get(t, h, "/api/flame?pid=10&base_pid=20"))
	if diff.Total != 30 || diff.BaseTotal == nil || *diff.BaseTotal != 10 || len(diff.Nodes.BaseTotal) != len(diff.Nodes.ID) {
		t.Errorf("diff: %+v", diff)
	}

	top := decode[topJSON](t, get(t, h, "/api/top?sort=total&limit=2"))
	if top.Total != 40 || len(top.Rows) != 2 || top.Rows[0].Name != "main" || top.Rows[0].Total != 40 || top.Rows[1].Name != "hash" {
		t.Errorf("top: %+v", top)
	}
	top = decode[topJSON](t, get(t, h, "/api/top?thread=io"))
	if top.Total != 10 || top.Rows[0].Name != "idle" || top.Rows[0].Self != 10 {
		t.Errorf("top of thread io: %+v", top)
	}

	tl := decode[timelineJSON](t, get(t, h, "/api/timeline?buckets=100"))
	var sum2 uint64
	for _, c := range tl.Counts {
		sum2 += c
	}
	if tl.Step != 1000 || sum2 != 40 || tl.Start != testStart.UnixMilli() {
		t.Errorf("timeline %+v", tl)
	}

	fv := decode[filtersJSON](t, get(t, h, "/api/filters"))
	if len(fv.Processes) != 2 || fv.Processes[0].Name != "app" || fv.Processes[0].PID != 10 ||
		len(fv.Containers) != 1 || fv.Containers[0].ID != "c1" {
		t.Errorf("filters %+v", fv)
	}
}

func TestDownloads(t *testing.T) {
	h := newTestServer(t, Config{}).Handler()
	rec := get(t, h, "/api/pprof?pid=10")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Disposition"), "attachment;") {
		t.Fatalf("pprof: %d %v", rec.Code, rec.Header())
	}
	p, err := profile.Parse(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, s := range p.Sample {
		n += s.Value[0]
	}
	if n != 30 {
		t.Errorf("pprof of pid 10 has %d samples, want 30", n)
	}
	rec = get(t, h, "/api/collapsed")
	if got := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(got, "app;main;work;hash 30\n") ||
		!strings.Contains(got, "db;main;idle 10\n") {
		t.Errorf("collapsed: %d %q", rec.Code, got)
	}
}

func TestBadRequests(t *testing.T) {
	h := newTestServer(t, Config{}).Handler()
	for _, tc := range []struct {
		target string
		status int
		msg    string
	}{
		{"/api/flame?from=abc", 400, `bad parameter "from": want unix milliseconds`},
		{"/api/flame?from=2000&to=1000", 400, `bad parameter "to": not after from`},
		{"/api/flame?from=1&from=2", 400, `"from": given more than once`},
		{"/api/flame?pid=x", 400, `"pid": "x" is not a process id`},
		{"/api/flame?minShare=2", 400, `"minShare": 2 is not in [0, 1]`},
		{"/api/flame?minShare=NaN", 400, `"minShare": not a number`},
		{"/api/flame?focus=zz", 400, `"focus": "zz" is not a node id`},
		{"/api/flame?search=" + strings.Repeat("a", 201), 400, `"search"`},
		{"/api/flame?bogus=1", 400, `"bogus": unknown parameter`},
		{"/api/flame?base_from=x", 400, `"base_from"`},
		{"/api/top?sort=name", 400, `"sort": want self or total`},
		{"/api/top?limit=0", 400, `"limit": 0 is not in [1, 1000]`},
		{"/api/top?limit=1e3", 400, `"limit": not a whole number`},
		{"/api/timeline?buckets=9999", 400, `"buckets"`},
		{"/api/timeline?base_pid=1", 400, `"base_pid": unknown parameter`},
		{"/api/summary?x=1", 400, `unknown parameter`},
		{"/api/pprof?to=x", 400, `"to"`},
		{"/api/flame?thread=" + strings.Repeat("t", 300), 400, `value longer than 256 bytes`},
		{"/api/flame?" + strings.Repeat("pid=1&", 2000), 400, `"query": longer than`},
		{"/api/flame?%zz", 400, `"query"`},
		{"/api/nothing", 404, ""},
		// Only the embedded files by name: nothing from the disk.
		{"/../../etc/passwd", 404, ""},
		{"/assets/app.js", 404, ""},
		{"/app.js/../../server.go", 404, ""},
		{"/%2e%2e/%2e%2e/etc/passwd", 404, ""},
		{"/api/../go.mod", 404, ""},
		{"//etc/passwd", 404, ""},
	} {
		rec := get(t, h, tc.target)
		if rec.Code == http.StatusMovedPermanently || rec.Code == http.StatusTemporaryRedirect {
			// The mux cleans paths by redirecting; follow it once.
			rec = get(t, h, rec.Header().Get("Location"))
		}
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.msg) {
			t.Errorf("%.80s: %d %q, want %d with %q", tc.target, rec.Code, rec.Body, tc.status, tc.msg)
		}
		if strings.Contains(rec.Body.String(), "root:") || strings.Contains(rec.Body.String(), "package webview") {
			t.Errorf("%s served a file from the disk", tc.target)
		}
	}
	// An id path that is not in the tree is an empty tree, not an error.
	if fl := decode[flameJSON](t, get(t, h, "/api/flame?focus=1234,abcd")); fl.Total != 0 || len(fl.Nodes.ID) != 0 {
		t.Errorf("missing focus: %+v", fl)
	}
}

func TestReadOnlyAndHeaders(t *testing.T) {
	h := newTestServer(t, Config{}).Handler()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, localRequest(m, "/api/flame", strings.NewReader("x")))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d", m, rec.Code)
		}
	}
	rec := get(t, h, "/")
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "<canvas") ||
		!strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'self'") ||
		rec.Header().Get("X-Frame-Options") != "DENY" {
		t.Errorf("index: %d %v", rec.Code, rec.Header())
	}
	for name, ctype := range map[string]string{"/app.js": "javascript", "/app.css": "text/css", "/index.html": "text/html"} {
		if rec := get(t, h, name); rec.Code != 200 || !strings.Contains(rec.Header().Get("Content-Type"), ctype) {
			t.Errorf("%s: %d %q", name, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
	// Large responses are gzipped for clients that take it.
	req := localRequest(http.MethodGet, "/app.js", nil)
	req.Header.Set("Accept-Encoding", "gzip, deflate")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	zr, err := gzip.NewReader(rec.Body)
	if err != nil || rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip: %v %v", err, rec.Header())
	}
	plain, _ := io.ReadAll(zr)
	if want, _ := assets.ReadFile("assets/app.js"); !bytes.Equal(plain, want) {
		t.Error("gzipped app.js differs")
	}
}

func TestListenAddr(t *testing.T) {
	for in, want := range map[string]string{
		"8230": "127.0.0.1:8230", ":8230": "127.0.0.1:8230", "0.0.0.0:80": "0.0.0.0:80",
		"[::1]:9": "[::1]:9", "localhost:1": "localhost:1",
	} {
		if got, err := ListenAddr(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "host", "a:b:c"} {
		if _, err := ListenAddr(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true,
		"0.0.0.0:1": false, "10.0.0.1:1": false, "[::]:1": false} {
		if IsLoopback(addr) != want {
			t.Errorf("IsLoopback(%q) = %v", addr, !want)
		}
	}
}

func TestBasicAuth(t *testing.T) {
	s := newTestServer(t, Config{BasicAuth: "ops:s3cret"})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		user, pass string
		want       int
	}{{"", "", 401}, {"ops", "wrong", 401}, {"ops", "s3cret", 200}, {"ops:s3cret", "", 401}} {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"api/summary", nil)
		if tc.user != "" {
			req.SetBasicAuth(tc.user, tc.pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s:%s: %d, want %d", tc.user, tc.pass, resp.StatusCode, tc.want)
		}
	}
}

func TestClientCertificateRequired(t *testing.T) {
	ca := testcerts.NewCA(t, "web view CA")
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM := ca.Server(t)
	tc, err := TLSConfig(write("server.pem", certPEM), write("server.key", keyPEM), write("ca.pem", ca.PEM))
	if err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, Config{TLS: tc})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	if resp, err := client().Get(s.URL() + "api/summary"); err == nil {
		resp.Body.Close()
		t.Errorf("no client certificate: %d, want a failed handshake", resp.StatusCode)
	}
	other := testcerts.NewCA(t, "other CA")
	for _, tc := range []struct {
		ca   *testcerts.CA
		want bool
	}{{ca, true}, {other, false}} {
		cp, kp := tc.ca.Client(t, "viewer")
		cert, err := tls.X509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client(cert).Get(s.URL() + "api/summary")
		if (err == nil) != tc.want {
			t.Errorf("client certificate of %s: %v", tc.ca.Cert.Subject.CommonName, err)
		}
		if err == nil {
			resp.Body.Close()
		}
	}
	if !strings.HasPrefix(s.URL(), "https://127.0.0.1:") {
		t.Errorf("URL %s", s.URL())
	}
}

func TestHostHeader(t *testing.T) {
	name, _ := os.Hostname()
	open := newTestServer(t, Config{}).Handler()
	authed := newTestServer(t, Config{BasicAuth: "a:b"}).Handler()
	for _, tc := range []struct {
		host string
		want int
	}{
		{"127.0.0.1:8230", 200}, {"[::1]:8230", 200}, {"localhost:8230", 200}, {"10.1.2.3", 200},
		{"app.localhost", 200}, {name + ":8230", 200},
		// A name that may point anywhere: a rebinding page's.
		{"evil.example:8230", 421}, {name + ".evil.example", 421},
	} {
		req := httptest.NewRequest(http.MethodGet, "/api/summary", nil)
		req.Host = tc.host
		rec := httptest.NewRecorder()
		open.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("Host %s: %d %s, want %d", tc.host, rec.Code, rec.Body, tc.want)
		}
		// With authentication any name is fine: the browser sends no
		// credentials to another origin.
		req.SetBasicAuth("a", "b")
		rec = httptest.NewRecorder()
		authed.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Errorf("Host %s with basic auth: %d", tc.host, rec.Code)
		}
	}
	for _, bad := range []string{":", "user:", ":pass", "nocolon"} {
		if _, err := New(Config{Addr: "127.0.0.1:0", History: newTestHistory(t), BasicAuth: bad}, nil); err == nil {
			t.Errorf("basic auth %q accepted", bad)
		}
	}
}

// TestMeasures: measure=offcpu and wall count off-CPU time in the
// summary's unit; a measure that is not one is refused.
func TestMeasures(t *testing.T) {
	hist := reportedHistory(t, func(r *reporter.Reporter) {
		app := &libpf.ProcessInfo{PID: 10, ExecutableName: "app"}
		work, wait := chain(1, "main", "work"), chain(2, "main", "wait")
		for i := range 4 {
			at := testStart.Add(time.Duration(i) * 100 * time.Millisecond)
			r.ReportSample(work, &libpf.SampleMeta{Time: at, TID: 10, ThreadName: "app", Process: app})
			r.ReportSample(wait, &libpf.SampleMeta{Time: at, TID: 11, ThreadName: "io", Process: app,
				OffCPU: 30 * time.Millisecond})
		}
	})
	h := newTestServer(t, Config{History: hist}).Handler()
	sum := decode[summaryJSON](t, get(t, h, "/api/summary"))
	if !sum.OffCPU || sum.OffCPUUnitNs != int64(reporter.OffCPUUnit) {
		t.Errorf("summary: offCPU %v, unit %d ns; want true, %d", sum.OffCPU, sum.OffCPUUnitNs, reporter.OffCPUUnit)
	}
	// 4 waits of 30 ms are 1200 units of 100 us; 4 samples at 10 Hz, 4000.
	for measure, want := range map[string]uint64{"": 4, "cpu": 4, "offcpu": 1200, "wall": 5200} {
		f := decode[flameJSON](t, get(t, h, "/api/flame?measure="+measure))
		if f.Total != want {
			t.Errorf("measure=%s: total %d, want %d", measure, f.Total, want)
		}
	}
	if rec := get(t, h, "/api/flame?measure=gpu"); rec.Code != 400 || !strings.Contains(rec.Body.String(), `"gpu" is not cpu, offcpu, wall, inuse or alloc`) {
		t.Errorf("measure=gpu: %d %s", rec.Code, rec.Body)
	}
}

package webview

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/test/webdriver"
)

// This browser test lives here rather than in test/integration: it needs
// no root, and the reporter's dependencies would swell the integration
// test binary that the kernel matrix's VMs profile while they run it.
// make integration-test runs it (EBPF_PROFILER_TEST_INTEGRATION=1).

// TestWebViewBusyHour serves one hour of a made-up busy host (100,000
// distinct stacks, 4.6 million samples) and measures the page in Chromium:
// the time to its first flame graph, a zoom, and the bytes each view
// fetches. It prints the figures and asserts only that the page works.
func TestWebViewBusyHour(t *testing.T) {
	webdriver.RequireBrowserTests(t)
	h, err := reporter.NewHistory(reporter.HistoryConfig{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	fill := time.Now()
	reporter.FillSynthetic(h, reporter.BusyHour, time.Now())
	st := h.Stats()
	t.Logf("history: %d samples, %d stacks, %.1f MiB estimated, filled in %v",
		st.Samples, st.Stacks, float64(st.Bytes)/(1<<20), time.Since(fill).Round(time.Millisecond))
	srv, err := New(Config{Addr: "127.0.0.1:0", History: h, Host: "busy-hour", Version: "synthetic",
		SamplesPerSecond: 20, Interval: 5 * time.Second}, logrus.NewEntry(logrus.StandardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	base := srv.URL()
	logViewBytes(t, base)

	b := webdriver.StartTest(t, webdriver.Options{Width: 1400, Height: 1000})
	wait := func(expr string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.WaitUntil(ctx, expr); err != nil {
			t.Fatal(err)
		}
	}
	shot := func(name string) {
		t.Helper()
		path := filepath.Join(webdriver.ArtifactDir(t, "webview-busy-hour"), name+".png")
		if err := b.SaveScreenshot(path); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", path)
	}
	var firstDraw []float64
	for range 3 {
		if err := b.Navigate(base); err != nil {
			t.Fatal(err)
		}
		wait("window.__profiler && window.__profiler.ready")
		var ms float64
		if err := b.ExecInto(&ms, "return window.__profiler.firstDrawMs"); err != nil {
			t.Fatal(err)
		}
		firstDraw = append(firstDraw, ms)
	}
	shot("1-flame")
	var nodes int
	var fetched float64
	_ = b.ExecInto(&nodes, "return window.__profiler.nodesDrawn")
	_ = b.ExecInto(&fetched, "return window.__profiler.lastFetchBytes")
	sorted := slices.Sorted(slices.Values(firstDraw))
	t.Logf("first flame graph drawn %.0f ms after navigation (3 loads: %.0f ms), %d frames drawn from a %.0f KiB response",
		sorted[1], firstDraw, nodes, fetched/1024)

	// Zoom into the busiest executable and time the round trip.
	var fv filtersJSON
	resp, err := http.Get(base + "api/filters")
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&fv)
		resp.Body.Close()
	}
	if err != nil || len(fv.Processes) == 0 {
		t.Fatalf("filters: %v %+v", err, fv)
	}
	proc := fv.Processes[0].Name
	var r *struct{ X, Y float64 }
	if err := b.ExecInto(&r, "return window.__profiler.frameRect(arguments[0])", proc); err != nil || r == nil {
		t.Fatalf("no frame %s drawn: %v", proc, err)
	}
	start := time.Now()
	if err := b.ClickAt(r.X, r.Y); err != nil {
		t.Fatal(err)
	}
	wait("window.__profiler.rootName === " + strconv.Quote(proc))
	var drawMs float64
	_ = b.ExecInto(&drawMs, "return window.__profiler.lastDrawMs")
	t.Logf("zoom into %s: %v from click to redrawn (drawing %.1f ms)", proc, time.Since(start).Round(time.Millisecond), drawMs)
	shot("2-zoomed")
	if errs, err := b.ConsoleErrors(); err == nil {
		for _, e := range errs {
			t.Errorf("console error: %s", e.Message)
		}
	}
}

// logViewBytes logs what each view of the page fetches, plain and gzipped.
func logViewBytes(t *testing.T, base string) {
	t.Helper()
	for _, path := range []string{"", "app.js", "app.css", "api/summary", "api/filters", "api/timeline?buckets=300",
		"api/flame", "api/top?limit=100", "api/flame?base_pid=1000"} {
		var sizes [2]int
		var took time.Duration
		for i, enc := range []string{"identity", "gzip"} {
			req, _ := http.NewRequest(http.MethodGet, base+path, nil)
			req.Header.Set("Accept-Encoding", enc)
			start := time.Now()
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took = time.Since(start)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
			}
			sizes[i] = len(body)
		}
		t.Logf("/%-26s %8d bytes, %7d gzipped, served in %v", path, sizes[0], sizes[1], took.Round(time.Millisecond))
	}
}

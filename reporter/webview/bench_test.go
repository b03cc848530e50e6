package webview

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/reporter"
)

// BenchmarkBusyHour times each view's request over one hour of a made-up
// busy host (reporter.BusyHour) and reports the bytes it sends, gzipped
// as browsers take them.
func BenchmarkBusyHour(b *testing.B) {
	h, err := reporter.NewHistory(reporter.HistoryConfig{MaxBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	reporter.FillSynthetic(h, reporter.BusyHour, time.Now())
	s, err := New(Config{Addr: "127.0.0.1:0", History: h}, logrus.NewEntry(logrus.StandardLogger()))
	if err != nil {
		b.Fatal(err)
	}
	handler := s.Handler()
	for _, view := range []struct{ name, target string }{
		{"summary", "/api/summary"},
		{"filters", "/api/filters"},
		{"timeline", "/api/timeline?buckets=300"},
		{"flame", "/api/flame"},
		{"flame-search", "/api/flame?search=fn_1"},
		{"flame-diff", "/api/flame?base_pid=1000"},
		{"top", "/api/top?limit=100"},
	} {
		b.Run(view.name, func(b *testing.B) {
			var n int
			for b.Loop() {
				req := localRequest(http.MethodGet, view.target, nil)
				req.Header.Set("Accept-Encoding", "gzip")
				rec := httptest.NewRecorder()
				handler.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
				n = rec.Body.Len()
			}
			b.ReportMetric(float64(n), "bytes-gzipped")
		})
	}
}

// BenchmarkGzippedResponse: what gzipping one 135 KiB answer (the size of
// a busy hour's flame graph) allocates; the web view is polled every
// second by some dashboards.
func BenchmarkGzippedResponse(b *testing.B) {
	s := &Server{}
	body := []byte(strings.Repeat(`{"name":"fn_123","total":4567,"self":89},`, 135<<10/42))
	b.ReportAllocs()
	for b.Loop() {
		req := localRequest(http.MethodGet, "/api/flame", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		s.write(httptest.NewRecorder(), req, body)
	}
}

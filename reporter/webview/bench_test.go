package webview

import (
	"net/http"
	"net/http/httptest"
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

package debuginfo

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestDebuginfod: a debug file a server has is fetched into the cache and
// then found by build id; a server that has nothing, answers another
// build's file, or is down costs a counted miss and is not asked again
// before the retry time.
func TestDebuginfod(t *testing.T) {
	dir := t.TempDir()
	bin := build(t, dir, "bin", "-g")
	oracle := copyFile(t, bin)
	debug := filepath.Join(dir, "bin.debug")
	splitDebug(t, bin, debug)
	// buildIDPath gives .build-id/xx/yyyy.debug.
	p := buildIDPath(t, "", bin)
	id := filepath.Base(filepath.Dir(p)) + strings.TrimSuffix(filepath.Base(p), ".debug")
	other := build(t, dir, "other", "-g", "-DOTHER")

	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		switch r.URL.Path {
		case "/buildid/" + id + "/debuginfo":
			http.ServeFile(w, r, debug)
		case "/buildid/00ff00ff/debuginfo":
			http.ServeFile(w, r, other) // the wrong file
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cache := filepath.Join(t.TempDir(), "cache")
	d, err := NewDebuginfod(DebuginfodOptions{URLs: []string{srv.URL}, Dir: cache, MaxBytes: 1 << 26,
		Timeout: 5 * time.Second, RetryAfter: time.Hour, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, bin, Options{DebugDirs: []string{d.Dir()}}); err == nil {
		t.Fatal("debug information found before the fetch")
	}
	d.Request(id)
	d.Request("00ff00ff")
	d.Request("0123456789")
	d.Wait()
	if st := d.Stats(); st.Fetched != 1 || st.NotFound != 1 || st.Errors != 1 {
		t.Errorf("stats %+v, want 1 fetched, 1 not found, 1 error", st)
	}
	f, err := open(t, bin, Options{DebugDirs: []string{d.Dir()}})
	if err != nil {
		t.Fatal(err)
	}
	addrs := functionAddrs(t, oracle)
	want := symbolize(t, oracle, addrs[:50])
	for i, a := range addrs[:50] {
		frames, _ := f.Lookup(a)
		if got := positions(frames); len(got) != len(want[i]) || got[0] != want[i][0] {
			t.Fatalf("%#x: got %v, want %v", a, got, want[i])
		}
	}
	before := requests.Load()
	d.Request(id)         // in the cache
	d.Request("00ff00ff") // failed an hour ago
	d.Wait()
	if n := requests.Load(); n != before {
		t.Errorf("%d more requests, want none", n-before)
	}
	if entries, _ := os.ReadDir(filepath.Join(cache, ".build-id", "00")); len(entries) != 0 {
		t.Errorf("the wrong build's file was kept: %v", entries)
	}

	// A server that is down.
	srv.Close()
	down, err := NewDebuginfod(DebuginfodOptions{URLs: []string{srv.URL}, Dir: t.TempDir(), MaxBytes: 1 << 26,
		Timeout: time.Second, RetryAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	down.Request(id)
	down.Wait()
	if st := down.Stats(); st.Errors != 1 {
		t.Errorf("server down: stats %+v, want 1 error", st)
	}
}

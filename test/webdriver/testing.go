package webdriver

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// StartTest starts a browser for a test and closes it when the test ends.
// Browser tests run with the integration suites: the test is skipped
// unless EBPF_PROFILER_TEST_INTEGRATION=1 (make test sets it), and then it
// fails, never skips, when chromedriver or Chromium is missing.
func StartTest(t testing.TB, opts Options) *Browser {
	t.Helper()
	RequireBrowserTests(t)
	b, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing the browser: %v", err)
		}
	})
	return b
}

// RequireBrowserTests skips the test unless the integration suites run
// (EBPF_PROFILER_TEST_INTEGRATION=1, as make test sets).
func RequireBrowserTests(t testing.TB) {
	t.Helper()
	if os.Getenv("EBPF_PROFILER_TEST_INTEGRATION") != "1" {
		t.Skip("browser test: run with EBPF_PROFILER_TEST_INTEGRATION=1 and Debian's chromium and chromium-driver (make test does)")
	}
}

// ArtifactDir is where a browser test leaves its screenshots:
// $EBPF_PROFILER_TEST_ARTIFACTS/name, else out/artifacts/name in the
// repository.
func ArtifactDir(t testing.TB, name string) string {
	t.Helper()
	root := os.Getenv("EBPF_PROFILER_TEST_ARTIFACTS")
	if root == "" {
		_, here, _, _ := runtime.Caller(0)
		root = filepath.Join(filepath.Dir(here), "..", "..", "out", "artifacts")
	}
	dir, err := filepath.Abs(filepath.Join(root, name))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

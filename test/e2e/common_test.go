package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	envE2E     = "EBPF_PROFILER_TEST_E2E"
	modulePath = "github.com/hostprof/ebpf-profiler"
)

// requireE2E skips the test unless the end-to-end tests were enabled.
func requireE2E(t *testing.T) {
	t.Helper()
	if os.Getenv(envE2E) != "1" {
		t.Skipf("end-to-end test skipped: set %s=1 to run it (first run builds an "+
			"OpenTelemetry Collector, ~80s and ~1.3GB of Go caches; see utils/collector/build.sh)", envE2E)
	}
}

// requireRoot skips the test unless it runs as root (needed to load eBPF).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("end-to-end test skipped: needs root to load eBPF programs (euid=%d)", os.Geteuid())
	}
}

// repoRoot returns the directory holding this module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.Contains(string(b), "module "+modulePath+"\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("go.mod of %s not found above the test directory", modulePath)
		}
		dir = parent
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

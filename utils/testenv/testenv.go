// Package testenv gates tests on what they need from the machine, so that
// every package asks the same way.
package testenv

import (
	"os"
	"testing"
)

// RequireBPF skips a test that loads BPF programs unless the suite runs
// them (EBPF_PROFILER_TEST_INTEGRATION=1, as make test sets), and fails it when
// they are asked for without root.
func RequireBPF(t testing.TB) {
	t.Helper()
	if os.Getenv("EBPF_PROFILER_TEST_INTEGRATION") != "1" {
		t.Skip("BPF test: run as root with EBPF_PROFILER_TEST_INTEGRATION=1 (make test does)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("BPF tests need root")
	}
}

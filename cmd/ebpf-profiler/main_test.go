package main

import (
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/support"
)

func TestCheckKernel(t *testing.T) {
	if err := checkKernel("6.1.0-18-amd64", false); err != nil {
		t.Errorf("6.1 refused: %v", err)
	}
	err := checkKernel("5.4.0-150-generic", false)
	if err == nil || !strings.Contains(err.Error(), "kernel 5.4.0-150-generic is older than 5.10") ||
		!strings.Contains(err.Error(), "-no-kernel-version-check") {
		t.Errorf("5.4 without override: %v, want a refusal naming the kernel, the minimum and the override", err)
	}
	if err := checkKernel("5.4.0-150-generic", true); err != nil {
		t.Errorf("5.4 with override: %v", err)
	}
}

func TestVersionLine(t *testing.T) {
	v := versionLine()
	for _, want := range []string{"ebpf-profiler " + version, "commit ", "BPF object sha256:" + support.ObjectHash()} {
		if !strings.Contains(v, want) {
			t.Errorf("version line %q lacks %q", v, want)
		}
	}
	if len(support.ObjectHash()) != 64 {
		t.Errorf("object hash %q is not a hex SHA-256", support.ObjectHash())
	}
}

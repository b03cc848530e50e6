// Package repocheck tests the repository itself: what git tracks.
package repocheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// committedObjects are the build outputs the repository keeps on purpose:
// the BPF objects, so that go build needs no clang (make check-ebpf checks
// they are up to date).
var committedObjects = map[string]bool{
	"support/ebpf/tracer.ebpf.amd64.o": true,
	"support/ebpf/tracer.ebpf.arm64.o": true,
}

// TestNoTrackedExecutables fails if git tracks an ELF file (a program,
// library or object someone built) outside testdata/: build outputs belong
// in .gitignore and make clean.
func TestNoTrackedExecutables(t *testing.T) {
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("listing the tracked files (git ls-files in %s): %v", root, err)
	}
	for _, path := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if committedObjects[path] || strings.Contains("/"+path, "/testdata/") {
			continue
		}
		f, err := os.Open(filepath.Join(root, path))
		if err != nil {
			continue // deleted in the work tree
		}
		magic := make([]byte, 4)
		n, _ := f.Read(magic)
		f.Close()
		if bytes.Equal(magic[:n], []byte("\x7fELF")) {
			t.Errorf("%s is an ELF file tracked outside testdata/: remove it (git rm --cached) and ignore it", path)
		}
	}
}

package interpreter_test

import (
	"bytes"
	"go/build"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hostprof/ebpf-profiler/interpreter"
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/runtimeids"
	"github.com/hostprof/ebpf-profiler/support"
)

// TestRuntimeIDsFromObject: the registry's id bounds and every runtime's
// ID are what go generate writes from the BPF object, and the runtimes
// registered with an id are the ones both architectures' objects have.
func TestRuntimeIDsFromObject(t *testing.T) {
	root := moduleRoot(t)
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	checkGenerated(t, filepath.Join(root, "interpreter"), func(string) ([]byte, error) {
		return runtimeids.RangeSource(shared)
	})
	registered := map[string]uint8{}
	for _, rt := range interpreter.All() {
		if rt.ID == 0 {
			continue
		}
		registered[rt.Name] = uint8(rt.ID)
		for _, dir := range runtimePackages(t, root) {
			if dir := filepath.Join(root, "interpreter", dir); packageRegisters(t, dir, rt.Name) {
				checkGenerated(t, dir, func(pkg string) ([]byte, error) {
					return runtimeids.RuntimeSource(pkg, rt.Name, shared)
				})
			}
		}
	}
	for _, arch := range []string{"amd64", "arm64"} {
		spec, err := ebpf.LoadCollectionSpec(filepath.Join(root, "support", "ebpf", "tracer.ebpf."+arch+".o"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := support.ReadShared(spec)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if !maps.Equal(s.Runtimes, registered) {
			t.Errorf("%s: the BPF object's runtime ids are %v, the registry's %v", arch, s.Runtimes, registered)
		}
	}
}

// checkGenerated compares the generated file of the package in dir with
// what source writes for it.
func checkGenerated(t *testing.T, dir string, source func(pkg string) ([]byte, error)) {
	t.Helper()
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := source(pkg.Name)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	path := filepath.Join(dir, runtimeids.File)
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s is missing or stale (%v): run go generate -run runtimeids ./interpreter/...", path, err)
	}
}

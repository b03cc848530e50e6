package interpreter

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// firstID and maxID, in id_gen.go, are RUNTIME_FIRST and RUNTIME_MAX of
// support/ebpf/runtimes.h, as each runtime package's ID is its RUNTIME_<NAME>.
//go:generate go run ./internal/runtimeids/generate

// registry holds the runtimes registered by their packages' init
// functions; it does not change once main runs.
var registry struct {
	mu       sync.Mutex
	runtimes []*Runtime
}

// Register adds a runtime to the registry. It panics on a name or id that
// is taken or out of range: that is a programming error found at start.
func Register(r *Runtime) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if r.Name == "" || r.Name != strings.ToLower(r.Name) || r.Name == NativeName || r.Name == "all" {
		panic(fmt.Sprintf("interpreter: bad runtime name %q", r.Name))
	}
	if r.ID != 0 && (r.ID < firstID || r.ID >= maxID) {
		panic(fmt.Sprintf("interpreter: runtime %s has id %d, want %d to %d", r.Name, r.ID, firstID, maxID-1))
	}
	if (r.Recognise == nil) == (r.Detect == nil) {
		panic(fmt.Sprintf("interpreter: runtime %s needs exactly one of Recognise and Detect", r.Name))
	}
	for _, o := range registry.runtimes {
		if o.Name == r.Name || (r.ID != 0 && o.ID == r.ID) {
			panic(fmt.Sprintf("interpreter: runtime %s (id %d) clashes with %s (id %d)", r.Name, r.ID, o.Name, o.ID))
		}
	}
	if r.ID != 0 {
		libpf.RegisterFrameKind(r.ID.Kind(), r.Name)
	}
	registry.runtimes = append(registry.runtimes, r)
	slices.SortFunc(registry.runtimes, func(a, b *Runtime) int { return strings.Compare(a.Name, b.Name) })
}

// NativeName is the -tracers name of the native unwinder, which is always
// on: every other unwinder starts from it.
const NativeName = "native"

// All returns the registered runtimes, by name.
func All() []*Runtime {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return slices.Clone(registry.runtimes)
}

// Names lists the -tracers choices: native, then every runtime.
func Names() []string {
	names := []string{NativeName}
	for _, r := range All() {
		names = append(names, r.Name)
	}
	return names
}

// Select returns the registered runtimes the names choose ("all" chooses
// every one; "native" none more); an unknown name is an error.
func Select(names []string) ([]*Runtime, error) {
	all := All()
	var out []*Runtime
	for _, name := range names {
		switch i := slices.IndexFunc(all, func(r *Runtime) bool { return r.Name == name }); {
		case name == "all":
			return all, nil
		case name == NativeName:
		case i >= 0:
			if !slices.Contains(out, all[i]) {
				out = append(out, all[i])
			}
		default:
			return nil, fmt.Errorf("unknown tracer %q (known: all, %s)", name, strings.Join(Names(), ", "))
		}
	}
	return out, nil
}

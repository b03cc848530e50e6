package tracer

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestObjectsInEveryLoad: everything mapObjects and programObjects name is in both
// architectures' BPF objects and stays in the spec whatever the kernel
// lacks and whichever runtimes are chosen, so New can assign it on every
// host.
func TestObjectsInEveryLoad(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		spec, err := ebpf.LoadCollectionSpec(filepath.Join("..", "support", "ebpf", "tracer.ebpf."+arch+".o"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = prepareSpec(spec, Config{SamplesPerSecond: 20}, kernelFeatures{}, 1)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		for _, f := range append(reflect.VisibleFields(reflect.TypeFor[mapObjects]()),
			reflect.VisibleFields(reflect.TypeFor[programObjects]())...) {
			name := f.Tag.Get("ebpf")
			var kept bool
			switch f.Type {
			case reflect.TypeFor[*ebpf.Map]():
				_, kept = spec.Maps[name]
			case reflect.TypeFor[*ebpf.Program]():
				_, kept = spec.Programs[name]
			default:
				t.Fatalf("objects.%s has type %s", f.Name, f.Type)
			}
			if !kept {
				t.Errorf("%s: objects.%s names %q, which a minimal load leaves out", arch, f.Name, name)
			}
		}
	}
}

// A missing object fails the assignment with its name.
func TestAssignObjectsNamesMissing(t *testing.T) {
	var objs mapObjects
	err := assignObjects(&ebpf.Collection{}, &objs)
	if err == nil || !strings.Contains(err.Error(), `missing map "events"`) {
		t.Errorf("assigning from an empty collection: %v, want an error naming map events", err)
	}
}

package tracer

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

func TestProcessedInsns(t *testing.T) {
	tests := []struct {
		log  string
		want uint32
		ok   bool
	}{
		// 5.10's statistics line.
		{"processed 31 insns (limit 1000000) max_states_per_insn 0 total_states 2 peak_states 2 mark_read 1\n", 31, true},
		// A longer log whose statistics follow the instructions.
		{"func#0 @0\n0: R1=ctx(id=0,off=0,imm=0)\nverification time 1234 usec\nstack depth 88\n" +
			"processed 245321 insns (limit 1000000) max_states_per_insn 4 total_states 9000\n", 245321, true},
		{"", 0, false},
		// Only a whole line counts.
		{"0: (b7) r0 = 0 ; processed 12 insns\n", 0, false},
		{"processed 99999999999 insns\n", 0, false},
	}
	for _, tt := range tests {
		got, ok := processedInsns(tt.log)
		if got != tt.want || ok != tt.ok {
			t.Errorf("processedInsns(%q) = %d, %v; want %d, %v", tt.log, got, ok, tt.want, tt.ok)
		}
	}
}

// A runtime whose id is not the object's fails loading, and only the chosen
// runtimes' unwinders are loaded.
func TestSelectRuntimes(t *testing.T) {
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	if len(shared.Runtimes) < 2 {
		t.Fatalf("the BPF object has %d runtimes, the test needs two", len(shared.Runtimes))
	}
	prepare := func(rt *interpreter.Runtime) (*ebpf.CollectionSpec, error) {
		spec, err := support.LoadSpec()
		if err != nil {
			t.Fatal(err)
		}
		_, err = prepareSpec(spec, Config{SamplesPerSecond: 20, Runtimes: []*interpreter.Runtime{rt}}, kernelFeatures{}, 1)
		return spec, err
	}
	for name, id := range shared.Runtimes {
		if _, err := prepare(&interpreter.Runtime{Name: name, ID: interpreter.ID(id) + 1}); err == nil ||
			!strings.Contains(err.Error(), name) {
			t.Errorf("%s with id %d, the object's %d: %v, want an error naming it", name, id+1, id, err)
		}
		spec, err := prepare(&interpreter.Runtime{Name: name, ID: interpreter.ID(id)})
		if err != nil {
			t.Fatalf("choosing %s: %v", name, err)
		}
		for other := range shared.Runtimes {
			if _, kept := spec.Programs[support.RuntimeProgram(other)]; kept != (other == name) {
				t.Errorf("choosing %s: the unwinder of %s kept %v", name, other, kept)
			}
		}
	}
	if _, err := prepare(&interpreter.Runtime{Name: "none", ID: 31}); err == nil {
		t.Error("a runtime the object lacks was chosen")
	}
}

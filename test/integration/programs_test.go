package integration

import (
	"fmt"
	"sort"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// TestProgramsLoad checks that the verifier accepts every program of the
// BPF object and that they attach: off-CPU profiling on (at a threshold
// that traces next to nothing), so that its programs load too. Its "kernel matrix:" line is what
// utils/kernelmatrix reports per kernel: how many programs loaded, the
// largest by instructions the verifier processed, and how they attached.
func TestProgramsLoad(t *testing.T) {
	requireRoot(t)
	s := startTracing(t, tracer.Config{SamplesPerSecond: testHz, Runtimes: interpreter.All(),
		OffCPU: tracer.OffCPUConfig{Threshold: 1e-6}}, nil)
	spec, err := support.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	insns := s.tr.VerifiedInstructions()
	names := make([]string, 0, len(insns))
	for name := range insns {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return insns[names[i]] > insns[names[j]] })
	for _, name := range names {
		t.Logf("%-28s %7d instructions processed", name, insns[name])
	}
	// Two programs are optional: the fexit mapping watch needs BPF
	// trampolines, which some kernels lack (arm64 before 6.0; the tracer
	// falls back to a kprobe and says so when it attaches), and
	// resolve_vma needs bpf_find_vma (5.17).
	var missing []string
	for name := range spec.Programs {
		if _, ok := insns[name]; !ok && name != tracer.MapWatchFexit && name != tracer.ResolveVMA {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("no verifier statistics for %v: not loaded?", missing)
	}
	perfEvents, mapWatch := s.tr.Attachment()
	largest := "none"
	if len(names) > 0 {
		largest = fmt.Sprintf("%s=%d", names[0], insns[names[0]])
	}
	t.Logf("kernel matrix: kernel=%s programs=%d/%d largest=%s perf_attach=%q map_watch=%q",
		tracer.KernelRelease(), len(insns), len(spec.Programs), largest, perfEvents, mapWatch)
}

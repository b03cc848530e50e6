package perl

import (
	"testing"

	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirrors of the Perl unwinder's structs have
// their C layouts, the frame tags their C values, and every layout offered
// is one the unwinder reads.
func TestUnwinderStructs(t *testing.T) {
	spec, err := support.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	shared, err := support.ReadShared(spec)
	if err != nil {
		t.Fatal(err)
	}
	for name, mirror := range map[string]any{"perl_proc": UnwinderProc{}, "perl_si": unwinderSI{}, "perl_cx": unwinderCX{}} {
		if err := shared.CheckMirror(name, mirror); err != nil {
			t.Error(err)
		}
	}
	tags, err := shared.EnumValues("perl_frame_tag")
	if err != nil {
		t.Fatal(err)
	}
	if tags["PERL_FRAME_MAIN"] != frameMain || tags["PERL_FRAME_EVAL"] != frameEval {
		t.Errorf("frame tags %v, Go has main %#x, eval %#x", tags, frameMain, frameEval)
	}
	ids, err := shared.EnumValues("runtime_id")
	if err != nil {
		t.Fatal(err)
	}
	if ids["RUNTIME_PERL"] != uint64(ID) {
		t.Errorf("RUNTIME_PERL is %d, Go's ID %d", ids["RUNTIME_PERL"], ID)
	}
	for minor, l := range layouts {
		if !readsLayout(l) {
			t.Errorf("5.%d: run levels and contexts not laid out as the unwinder reads them: %+v", minor, l)
		}
	}
}

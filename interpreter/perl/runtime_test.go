package perl

import (
	"testing"

	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirrors of the Perl unwinder's structs have
// their C layouts, the frame tags their C values, and every layout offered
// is one the unwinder reads.
func TestUnwinderStructs(t *testing.T) {
	shared, err := support.LoadShared()
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
	for arch, byMinor := range layouts {
		for minor, l := range byMinor {
			if !readsLayout(l) {
				t.Errorf("5.%d on %s: run levels and contexts not laid out as the unwinder reads them: %+v", minor, arch, l)
			}
		}
	}
}

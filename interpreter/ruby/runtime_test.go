package ruby

import (
	"testing"

	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirrors of the Ruby unwinder's structs have
// their C layouts, and every layout offered is one the unwinder reads.
func TestUnwinderStructs(t *testing.T) {
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	for name, mirror := range map[string]any{"ruby_proc": UnwinderProc{}, "ruby_cfp": unwinderCFP{}} {
		if err := shared.CheckMirror(name, mirror); err != nil {
			t.Error(err)
		}
	}
	for v, l := range layouts {
		if !readsLayout(l) {
			t.Errorf("%d.%d: control frames at pc %d, iseq %d, ep %d, size %d: not as the unwinder reads them",
				v[0], v[1], l.CFPPC, l.CFPISeq, l.CFPEP, l.CFPSize)
		}
	}
}

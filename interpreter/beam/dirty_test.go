package beam

import (
	"debug/elf"
	"errors"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
)

// TestFindDirty: in the fetched amd64 beam.smp of OTP 27 and 29, the
// dirty CPU and I/O schedulers' thread functions and the scheduler data
// key are where the disassembly shows them (internals.md §7: in 27, whose
// exports name them, both thread functions call erts_dirty_process_main
// and erts_get_scheduler_data loads the key); arm64 code is not searched.
func TestFindDirty(t *testing.T) {
	want := map[string]Dirty{
		"27": {ThreadFuncs: []uint64{0x2095b0, 0x204ce0}, SchedDataKey: 0xa160a8},
		"29": {ThreadFuncs: []uint64{0x2070e0, 0x207260}, SchedDataKey: 0xc17748},
	}
	for _, v := range beamfetch.Versions {
		for _, arch := range beamfetch.Arches {
			t.Run(v+"/"+arch, func(t *testing.T) {
				path, err := beamfetch.BeamSMP(v, arch)
				if err != nil {
					t.Fatal(err)
				}
				f, err := elf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				d, err := FindDirty(f)
				if arch != "amd64" {
					if !errors.Is(err, ErrNoDirty) {
						t.Fatalf("%s: %+v, %v; want ErrNoDirty", arch, d, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("thread functions %#x, key %#x", d.ThreadFuncs, d.SchedDataKey)
				w := want[v]
				if len(d.ThreadFuncs) != 2 || d.SchedDataKey != w.SchedDataKey ||
					(w.ThreadFuncs != nil && (d.ThreadFuncs[0] != w.ThreadFuncs[0] || d.ThreadFuncs[1] != w.ThreadFuncs[1])) {
					t.Errorf("got %+v, want %+v", d, w)
				}
			})
		}
	}
}

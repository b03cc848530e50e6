package beam

import (
	"debug/elf"
	"errors"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// TestFindDirty: in the fetched amd64 beam.smp of OTP 27 and 29, the
// dirty CPU and I/O schedulers' thread functions and the scheduler data
// key are where the disassembly shows them (internals.md §7: in 27, whose
// exports name them, both thread functions call erts_dirty_process_main
// and erts_get_scheduler_data loads the key; on arm64, read in aarch64
// objdump, erts_start_schedulers forms each name's and thread function's
// address side by side, and 27's exported erts_get_scheduler_data loads
// the key). Another program (this test's) has none of it.
func TestFindDirty(t *testing.T) {
	want := map[string]Dirty{
		"27/amd64": {ThreadFuncs: []uint64{0x2095b0, 0x204ce0}, SchedDataKey: 0xa160a8},
		"29/amd64": {ThreadFuncs: []uint64{0x2070e0, 0x207260}, SchedDataKey: 0xc17748},
		"27/arm64": {ThreadFuncs: []uint64{0x77210, 0x77120}, SchedDataKey: 0x425aa8},
		"29/arm64": {ThreadFuncs: []uint64{0x32fe4, 0x332a0}, SchedDataKey: 0x527100},
	}
	forEachBeamSMP(t, func(t *testing.T, v, arch, path string, f *elf.File) {
		d, err := FindDirty(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("thread functions %#x, key %#x", d.ThreadFuncs, d.SchedDataKey)
		w := want[v+"/"+arch]
		if len(d.ThreadFuncs) != 2 || d.SchedDataKey != w.SchedDataKey ||
			d.ThreadFuncs[0] != w.ThreadFuncs[0] || d.ThreadFuncs[1] != w.ThreadFuncs[1] {
			t.Errorf("got %+v, want %+v", d, w)
		}
	})
	self, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if d, err := FindDirty(self); !errors.Is(err, ErrNoDirty) {
		t.Errorf("the test binary: %+v, %v; want ErrNoDirty", d, err)
	}
}

// TestDirtyCodeRanges: recognising each fetched beam.smp gives the two
// thread functions' FDE ranges as its code ranges (each thread function
// starts an FDE), and without function ranges none.
func TestDirtyCodeRanges(t *testing.T) {
	forEachBeamSMP(t, func(t *testing.T, v, arch, path string, f *elf.File) {
		bin, err := recognise(&interpreter.File{Path: path, ELF: f,
			FunctionRanges: func() ([][2]uint64, error) { return nativeunwind.FunctionRanges(f) }})
		if err != nil || bin == nil {
			t.Fatalf("recognise: %v, %v", bin, err)
		}
		b := bin.(*beamBinary)
		rs := b.CodeRanges()
		if len(rs) != 2 || b.dirty.SchedDataKey == 0 {
			t.Fatalf("code ranges %#x, key %#x", rs, b.dirty.SchedDataKey)
		}
		for i, r := range rs {
			if r[0] != b.dirty.ThreadFuncs[i] || r[1] <= r[0] || r[1]-r[0] > 4096 {
				t.Errorf("range %#x for the thread function at %#x", r, b.dirty.ThreadFuncs[i])
			}
		}
		t.Logf("%#x", rs)
		bare, _ := recognise(&interpreter.File{Path: path, ELF: f})
		if rs := bare.CodeRanges(); rs != nil {
			t.Errorf("without function ranges: %#x", rs)
		}
	})
}

package ruby

import (
	"slices"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// TestJITAreas: YJIT's areas as 3.1 (one executable mapping) and 3.4 (an
// executable start and its inaccessible reserve, then its pages made
// executable as code is written) map them are claimed whole; a libffi
// trampoline page, a thread stack's guard page and file mappings are not.
func TestJITAreas(t *testing.T) {
	rx := func(start, end uint64, path string) interpreter.Mapping {
		return interpreter.Mapping{Start: start, End: end, Path: path, Executable: true}
	}
	none := func(start, end uint64) interpreter.Mapping {
		return interpreter.Mapping{Start: start, End: end, Inaccessible: true}
	}
	rw := func(start, end uint64) interpreter.Mapping { return interpreter.Mapping{Start: start, End: end} }
	ms := []interpreter.Mapping{
		rx(0x55d0c0a00000, 0x55d0c0a01000, "/usr/bin/ruby3.1"),
		rx(0x7f0000000000, 0x7f0010000000, ""),
		rx(0x7f1000000000, 0x7f1000003000, ""), none(0x7f1000003000, 0x7f1008000000),
		rx(0x7f2000000000, 0x7f2000001000, ""), rw(0x7f2000001000, 0x7f2000002000),
		none(0x7f3000000000, 0x7f3000001000), rw(0x7f3000001000, 0x7f3000800000),
		rx(0x7f4000000000, 0x7f4000004000, ""), none(0x7f4000004000, 0x7f4000100000),
		rx(0x7f4000100000, 0x7f4000104000, ""), none(0x7f4000104000, 0x7f4008000000),
		rx(0x7f5000000000, 0x7f5000001000, "[anon:Ruby:rb_yjit_reserve_addr_space]"),
		rx(0x7f6000000000, 0x7f6000001000, "/usr/lib/x86_64-linux-gnu/libffi.so.8"),
	}
	want := []interpreter.Region{
		{Start: 0x7f0000000000, End: 0x7f0010000000, Unwind: true},
		{Start: 0x7f1000000000, End: 0x7f1008000000, Unwind: true},
		{Start: 0x7f4000000000, End: 0x7f4008000000, Unwind: true},
		{Start: 0x7f5000000000, End: 0x7f5000001000, Unwind: true},
	}
	if got := jitAreas(ms); !slices.Equal(got, want) {
		t.Errorf("areas %#v, want %#v", got, want)
	}
}

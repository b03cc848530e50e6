package ruby

import (
	"slices"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// TestJITAreas: YJIT's areas as 3.1 (one executable mapping) and 3.4 (an
// executable start and its inaccessible reserve, then its pages made
// executable as code is written) map them are claimed whole; a libffi
// trampoline page, a thread stack's guard page, file mappings and a
// malformed listing are not.
func TestJITAreas(t *testing.T) {
	maps := `55d0c0a00000-55d0c0a01000 r-xp 00001000 08:01 1234 /usr/bin/ruby3.1
7f0000000000-7f0010000000 r-xp 00000000 00:00 0 
7f1000000000-7f1000003000 r-xp 00000000 00:00 0 
7f1000003000-7f1008000000 ---p 00000000 00:00 0 
7f2000000000-7f2000001000 r-xp 00000000 00:00 0 
7f2000001000-7f2000002000 rw-p 00000000 00:00 0 
7f3000000000-7f3000001000 ---p 00000000 00:00 0 
7f3000001000-7f3000800000 rw-p 00000000 00:00 0 
7f4000000000-7f4000004000 r-xp 00000000 00:00 0 
7f4000004000-7f4000100000 ---p 00000000 00:00 0 
7f4000100000-7f4000104000 r-xp 00000000 00:00 0 
7f4000104000-7f4008000000 ---p 00000000 00:00 0 
7f5000000000-7f5000001000 r-xp 00000000 00:00 0                          [anon:Ruby:rb_yjit_reserve_addr_space]
7f6000000000-7f6000001000 r-xp 00000000 08:01 99 /usr/lib/x86_64-linux-gnu/libffi.so.8
`
	got, err := jitAreas(strings.NewReader(maps))
	if err != nil {
		t.Fatal(err)
	}
	want := []interpreter.Region{
		{Start: 0x7f0000000000, End: 0x7f0010000000, Unwind: true},
		{Start: 0x7f1000000000, End: 0x7f1008000000, Unwind: true},
		{Start: 0x7f4000000000, End: 0x7f4008000000, Unwind: true},
		{Start: 0x7f5000000000, End: 0x7f5000001000, Unwind: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("areas %#v, want %#v", got, want)
	}
	if _, err := jitAreas(strings.NewReader("7f00-zz r-xp 0 00:00 0\n")); err == nil {
		t.Error("a malformed line was accepted")
	}
}

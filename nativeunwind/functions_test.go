package nativeunwind

import (
	"debug/elf"
	"testing"
)

// TestFunctionRanges: every defined function symbol of libc starts an FDE
// range, the ranges are sorted, and none is empty.
func TestFunctionRanges(t *testing.T) {
	f, err := elf.Open("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	ranges, err := FunctionRanges(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ranges) < 1000 {
		t.Fatalf("%d FDE ranges in libc", len(ranges))
	}
	starts := map[uint64]bool{}
	for i, r := range ranges {
		if r[1] <= r[0] || (i > 0 && r[0] < ranges[i-1][0]) {
			t.Fatalf("range %d %#x: empty or out of order", i, r)
		}
		starts[r[0]] = true
	}
	syms, _ := f.DynamicSymbols()
	checked := 0
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && s.Size > 0 &&
			(s.Name == "qsort" || s.Name == "memcpy" || s.Name == "pthread_getspecific" || s.Name == "malloc") {
			if !starts[s.Value] {
				t.Errorf("%s at %#x starts no FDE range", s.Name, s.Value)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no function checked")
	}
}

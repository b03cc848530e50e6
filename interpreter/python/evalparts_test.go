package python

import (
	"debug/elf"
	"fmt"
	"slices"
	"testing"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// TestEvalParts: in Debian's python3.11, built with profile feedback, GCC
// moved part of _PyEval_EvalFrameDefault to _PyEval_EvalFrameDefault.cold;
// the stripped binary names neither part's extent, its debug file (from
// python3.11-dbg) names both, and NewBinary must find both from the
// stripped binary alone.
func TestEvalParts(t *testing.T) {
	const exe = "/usr/bin/python3.11"
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	debug, err := debugFile(f)
	if err != nil {
		t.Fatalf("%v (make test-deps installs python3.11-dbg)", err)
	}
	defer debug.Close()
	syms, err := debug.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	var want [][2]uint64
	for _, s := range syms {
		if s.Name == "_PyEval_EvalFrameDefault" || s.Name == "_PyEval_EvalFrameDefault.cold" {
			want = append(want, [2]uint64{s.Value, s.Value + s.Size})
		}
	}
	slices.SortFunc(want, func(a, b [2]uint64) int { return int(a[0]>>4) - int(b[0]>>4) })
	if len(want) != 2 {
		t.Fatalf("the debug file names %d parts of the eval loop, want 2", len(want))
	}
	b, err := NewBinary(f, func() ([][2]uint64, error) { return nativeunwind.FunctionRanges(f) })
	if err != nil {
		t.Fatal(err)
	}
	// The cold part's symbol has no size: its FDE gives the end.
	got := b.EvalRanges
	if len(got) != 2 || got[0][0] != want[0][0] || got[1] != want[1] {
		t.Errorf("eval loop parts %#x, want %#x (the cold part's end from its FDE)", got, want)
	}
}

// debugFile opens the separate debug file of f by its GNU build id.
func debugFile(f *elf.File) (*elf.File, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return nil, err
		}
		for len(data) >= 12 {
			nameSize := int(f.ByteOrder.Uint32(data))
			descSize := int(f.ByteOrder.Uint32(data[4:]))
			typ := f.ByteOrder.Uint32(data[8:])
			nameEnd := 12 + (nameSize+3)&^3
			descEnd := nameEnd + (descSize+3)&^3
			if descEnd > len(data) {
				break
			}
			if typ == 3 && string(data[12:12+nameSize]) == "GNU\x00" {
				id := fmt.Sprintf("%x", data[nameEnd:nameEnd+descSize])
				return elf.Open(fmt.Sprintf("/usr/lib/debug/.build-id/%s/%s.debug", id[:2], id[2:]))
			}
			data = data[descEnd:]
		}
	}
	return nil, fmt.Errorf("no GNU build id")
}

package v8

import (
	"debug/elf"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
)

// TestNodeLayouts reads every tested Node's metadata and checks values
// internals.md found by disassembly against what the layout resolves.
func TestNodeLayouts(t *testing.T) {
	want := map[string]struct {
		version                                     [2]int
		sfiScript, codeStart, codeSize, codeFlags   int64
		codeDeopt, codePositions, bytecodePositions int64
		istreamHeader                               int64
		inline                                      bool
	}{
		"18": {[2]int{10, 2}, 32, 128, 40, 48, 16, 24, 32, 0, true},
		"20": {[2]int{11, 3}, 32, 40, 56, 48, 16, 24, 32, 16, false},
		"22": {[2]int{12, 4}, 32, 40, 52, 48, 8, 16, 24, 32, false},
		"24": {[2]int{13, 6}, 40, 40, 56, 52, 8, 16, 24, 32, false},
	}
	for _, v := range nodefetch.Versions() {
		t.Run("Node "+v, func(t *testing.T) {
			path, err := nodefetch.Node(v)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			info, err := readBinary(f)
			if err != nil {
				t.Fatal(err)
			}
			l, err := NewLayout(info.md, info.Version)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkFrameSlots(l); err != nil {
				t.Fatal(err)
			}
			w := want[v]
			got := struct {
				version                                     [2]int
				sfiScript, codeStart, codeSize, codeFlags   int64
				codeDeopt, codePositions, bytecodePositions int64
				istreamHeader                               int64
				inline                                      bool
			}{[2]int{l.Version[0], l.Version[1]}, l.SFIScript, l.CodeInstructionStart, l.CodeInstructionSize,
				l.CodeFlags, l.CodeDeoptData, l.CodePositionTable, l.BytecodeArrayPositionTable, l.IStreamHeader,
				l.InlineCode}
			if got != w {
				t.Errorf("layout %+v, want %+v", got, w)
			}
			t.Logf("V8 %v: %d builtins, blob %#x (%d bytes), entry [%#x, %#x), handlers [%#x, %#x), frame types %d",
				info.Version, len(info.Builtins), info.BlobAddr, info.BlobSize, info.EntryLo, info.EntryHi,
				info.HandlersLo, info.HandlersHi, l.FrameTypes)
		})
	}
}

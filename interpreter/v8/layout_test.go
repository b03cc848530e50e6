package v8

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
)

// nodeLayout is what TestNodeLayouts checks of a version's layout.
type nodeLayout struct {
	version                                     [2]int
	sfiScript, codeStart, codeSize, codeFlags   int64
	codeDeopt, codePositions, bytecodePositions int64
	istreamHeader                               int64
	inline                                      bool
}

// TestNodeLayouts reads every tested Node's metadata, x86_64 and arm64
// builds, and checks values internals.md found by disassembly against
// what the layout resolves.
func TestNodeLayouts(t *testing.T) {
	want := map[string]nodeLayout{
		"18": {[2]int{10, 2}, 32, 128, 40, 48, 16, 24, 32, 0, true},
		"20": {[2]int{11, 3}, 32, 40, 56, 48, 16, 24, 32, 16, false},
		"22": {[2]int{12, 4}, 32, 40, 52, 48, 8, 16, 24, 32, false},
		"24": {[2]int{13, 6}, 40, 40, 56, 52, 8, 16, 24, 32, false},
		"25": {[2]int{14, 1}, 40, 40, 56, 52, 8, 16, 24, 32, false},
		"26": {[2]int{14, 6}, 40, 40, 56, 52, 8, 16, 24, 32, false},
	}
	for _, arch := range []string{"amd64", "arm64"} {
		for _, v := range nodefetch.VersionsFor(arch) {
			w := want[v]
			if arch == "arm64" && v == "18" {
				// V8 10.2's Code header is 96 bytes on arm64, 128 on
				// x86_64 (each build's metadata; its padding differs).
				w.codeStart = 96
			}
			t.Run("Node "+v+" "+arch, func(t *testing.T) { checkNodeLayout(t, v, arch, w) })
		}
	}
}

// readNodeBinary reads what a tested Node version's node executable for
// arch says of V8.
func readNodeBinary(t *testing.T, v, arch string) *binaryInfo {
	t.Helper()
	path, err := nodefetch.NodeFor(v, arch)
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
	return info
}

func checkNodeLayout(t *testing.T, v, arch string, want nodeLayout) {
	info := readNodeBinary(t, v, arch)
	l, err := NewLayout(info.md, info.Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkFrameSlots(l); err != nil {
		t.Fatal(err)
	}
	got := nodeLayout{[2]int{l.Version[0], l.Version[1]}, l.SFIScript, l.CodeInstructionStart, l.CodeInstructionSize,
		l.CodeFlags, l.CodeDeoptData, l.CodePositionTable, l.BytecodeArrayPositionTable, l.IStreamHeader,
		l.InlineCode}
	if got != want {
		t.Errorf("layout %+v, want %+v", got, want)
	}
	t.Logf("V8 %v: %d builtins, blob %#x (%d bytes), entry [%#x, %#x), handlers [%#x, %#x), frame types %d",
		info.Version, len(info.Builtins), info.BlobAddr, info.BlobSize, info.EntryLo, info.EntryHi,
		info.HandlersLo, info.HandlersHi, l.FrameTypes)
}

// TestNodeLayoutUnknownVersion: a V8 the version table does not hold is
// refused, the error naming it, even where its metadata reads like a
// known one's (Node 26's metadata as a V8 14.7's).
func TestNodeLayoutUnknownVersion(t *testing.T) {
	info := readNodeBinary(t, "26", "amd64")
	for _, v := range [][3]int{{14, 7, 1}, {13, 7, 0}, {15, 0, 0}} {
		_, err := NewLayout(info.md, v)
		name := fmt.Sprintf("V8 %d.%d.%d", v[0], v[1], v[2])
		if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), name) {
			t.Errorf("NewLayout(%v) = %v, want %v naming %s", v, err, ErrLayout, name)
		}
	}
}

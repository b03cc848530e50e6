package nativeunwind

import (
	"debug/elf"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestGoLinesAgainstRuntime: the test binary's own runtime expands inlined
// calls (runtime.CallersFrames) from the same tables; at every sampled pc
// of every function, GoLines must give the same frames, names, files and
// lines. The binary is not PIE, so its file addresses are its run-time
// addresses.
func TestGoLinesAgainstRuntime(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	g := openGoLines(t, exe, true)
	if !g.ExpandsInlined() {
		t.Fatal("the test binary's function data were not found")
	}
	checked, inlined := 0, 0
	syms := g.Symbols()
	for i := range syms.Len() {
		fn, err := syms.Func(i)
		if err != nil {
			t.Fatal(err)
		}
		for _, pc := range samplePCs(fn, 16) {
			if pc+1 == fn.End {
				continue // the runtime would look up the next function
			}
			got, err := g.Lookup(pc)
			if err != nil {
				t.Fatalf("%#x in %s: %v", pc, fn.Name, err)
			}
			want := runtimeFrames(pc)
			if len(want) == 0 || want[len(want)-1].Line == 0 {
				continue // padding, or no line tables
			}
			gotPos, wantPos := framePositions(got), framePositions(want)
			// The runtime also elides functions it marks as wrappers
			// (deferwrap, reflect.callMethod): then the physical frame
			// is missing from its answer.
			if len(gotPos) == len(wantPos)+1 {
				gotPos = gotPos[:len(wantPos)]
			}
			if !slices.Equal(gotPos, wantPos) {
				t.Fatalf("%#x in %s:\n got  %v\n want %v", pc, fn.Name, framePositions(got), framePositions(want))
			}
			checked++
			if len(got) > 1 {
				inlined++
			}
		}
	}
	t.Logf("%d pcs checked, %d of them in inlined code", checked, inlined)
	if checked < 10000 || inlined < 1000 {
		t.Errorf("only %d pcs checked, %d in inlined code", checked, inlined)
	}
}

// TestGoLinesStripped: a stripped build finds its function data through
// moduledata and expands the same frames as its twin with symbols.
func TestGoLinesStripped(t *testing.T) {
	set := newGoBuildSet(t)
	for _, name := range []string{"amd64-stripped", "amd64-cgo-pie-nosections"} {
		t.Run(name, func(t *testing.T) {
			b := findGoBuild(name)
			stripped := openGoLines(t, set.path(t, name), true)
			twin := openGoLines(t, set.path(t, b.twin), false)
			if !stripped.ExpandsInlined() {
				t.Fatal("function data not found")
			}
			// The twin's moduledata must agree with its symbol.
			twinELF, err := elf.Open(set.path(t, b.twin))
			if err != nil {
				t.Fatal(err)
			}
			defer twinELF.Close()
			if md, ok := (elfImage{f: twinELF}).moduledataWord(twin.syms.t, mdGofunc120); !ok || md != twin.gofunc {
				t.Errorf("moduledata.gofunc %#x (found: %v), the symbol go:func.* says %#x", md, ok, twin.gofunc)
			}
			inlined := 0
			for i := range twin.Symbols().Len() {
				fn, err := twin.Symbols().Func(i)
				if err != nil {
					t.Fatal(err)
				}
				for _, pc := range samplePCs(fn, 8) {
					want, _ := twin.Lookup(pc)
					got, _ := stripped.Lookup(pc)
					// The twins were built in directories of their own.
					if !slices.Equal(baseNames(got), baseNames(want)) {
						t.Fatalf("%#x: got %v, want %v", pc, baseNames(got), baseNames(want))
					}
					if len(got) > 1 {
						inlined++
					}
				}
			}
			if inlined == 0 {
				t.Error("no inlined frames")
			}
		})
	}
}

// openGoLines reads path's lines, from the file or (inMemory) from its
// bytes in memory, as debuginfo maps it.
func openGoLines(t *testing.T, path string, inMemory bool) *GoLines {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var mapped []byte
	if inMemory {
		if mapped, err = os.ReadFile(path); err != nil {
			t.Fatal(err)
		}
	}
	g, err := ReadGoLines(f, mapped)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

//go:noinline
func runtimeFramesSentinel() {}

// runtimeFrames returns the runtime's frames at pc, innermost first.
func runtimeFrames(pc uint64) []GoFrame {
	// CallersFrames takes return addresses and looks one byte before.
	// Given one, it may stop after the first inlined frame: a second,
	// the sentinel's, marks where pc's frames end.
	sentinel := reflect.ValueOf(runtimeFramesSentinel).Pointer()
	frames := runtime.CallersFrames([]uintptr{uintptr(pc) + 1, sentinel + 1})
	var out []GoFrame
	for {
		f, more := frames.Next()
		if f.Function == "" || f.Entry == sentinel {
			break
		}
		out = append(out, GoFrame{Func: GoFunc{Name: f.Function}, File: f.File, Line: f.Line})
		if !more {
			break
		}
	}
	return out
}

type framePosition struct {
	name, file string
	line       int
}

func baseNames(fs []GoFrame) []framePosition {
	out := framePositions(fs)
	for i := range out {
		out[i].file = filepath.Base(out[i].file)
	}
	return out
}

// nameForPrint is a function name as the runtime prints it: from the
// first [ to the last ] shown as [...] (runtime.funcNameForPrint).
func nameForPrint(name string) string {
	i, j := strings.IndexByte(name, '['), strings.LastIndexByte(name, ']')
	if i < 0 || j < i {
		return name
	}
	return name[:i+1] + "..." + name[j:]
}

// framePositions are the frames as the runtime prints them. Compiler
// generated methods of pointer receivers are left out: the runtime
// elides them (runtime.elideWrapperCalling), GoLines does not.
func framePositions(fs []GoFrame) []framePosition {
	var out []framePosition
	for _, f := range fs {
		if f.File != "<autogenerated>" {
			out = append(out, framePosition{nameForPrint(f.Func.Name), f.File, f.Line})
		}
	}
	return out
}

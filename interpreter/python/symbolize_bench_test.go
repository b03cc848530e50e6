package python

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

// BenchmarkSymbolize symbolizes the code objects of targets.py in a live
// CPython process through /proc/PID/mem, one frame per operation: "new"
// frames miss the cache (each reads the code object, its strings and its
// line table), "cached" ones hit it (one read of the code object's header
// to check it is the one cached, then the line table lookup). One CPython
// per line table format and frame layout: pyenv's 3.9 (co_lnotab), 3.10
// (co_linetable) and 3.12 (location table, as 3.11+), and Debian sid's
// 3.14 (the reworked frame) and 3.15 (read through its _Py_DebugOffsets),
// with the offsets NewBinary takes for each. The tail-calling 3.14 build
// (pyfetch.TailCallPython) is left out: only its eval loop differs, and
// NewBinary finds the very same Offsets in it as in sid's 3.14, so it
// reads the same objects.
func BenchmarkSymbolize(b *testing.B) {
	script := filepath.Join(b.TempDir(), "symbolize_targets.py")
	if err := os.WriteFile(script, symTargetsScript, 0o644); err != nil {
		b.Fatal(err)
	}
	versions := offPyenvVersions()
	for _, minor := range append([]string{"3.9", "3.10", "3.12"}, pyfetch.Fetched...) {
		python, isolate := "", "-I"
		if slices.Contains(pyfetch.Fetched, minor) {
			var err error
			if python, err = pyfetch.Python(minor); err != nil {
				b.Fatal(err)
			}
			isolate = "-s"
		} else {
			pythons, _ := filepath.Glob(filepath.Join(versions, minor+".*", "bin", "python3"))
			if len(pythons) == 0 {
				b.Fatalf("no pyenv CPython %s", minor)
			}
			python = pythons[0]
		}
		targets, pid := symStartWith(b, python, isolate, script)
		in, lib := symDetect(b, pid)
		if in.Version.MajorMinor() != minor {
			b.Fatalf("%s detected as %v in %s", python, in.Version.MajorMinor(), lib)
		}
		f, err := elf.Open(lib)
		if err != nil {
			b.Fatal(err)
		}
		off, err := binaryOffsets(f, in)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { mem.Close() })
		type frame struct {
			code   uint64
			offset uint32
		}
		var frames []frame
		for _, c := range targets.Codes {
			if len(c.Lines) > 0 {
				frames = append(frames, frame{c.ID, uint32(*c.Lines[len(c.Lines)/2][0])})
			}
		}
		run := func(b *testing.B, s *Symbolizer) {
			for i := 0; b.Loop(); i++ {
				f := frames[i%len(frames)]
				if _, err := s.Frame(f.code, f.offset); err != nil {
					b.Fatal(err)
				}
			}
		}
		symbench.Run(b, minor, 1, func(b *testing.B) {
			// A one-entry cache: with the frames taken in turn, each misses.
			s, err := newSymbolizer(mem, off, 1, symCacheBytes)
			if err != nil {
				b.Fatal(err)
			}
			run(b, s)
			if st := s.Stats(); st.Hits != 0 {
				b.Fatalf("%d cache hits", st.Hits)
			}
		}, func(b *testing.B) {
			s, err := NewSymbolizer(mem, off)
			if err != nil {
				b.Fatal(err)
			}
			for _, f := range frames {
				s.Frame(f.code, f.offset)
			}
			run(b, s)
			if st := s.Stats(); st.Misses != uint64(len(frames)) {
				b.Fatalf("%d cache misses, want %d", st.Misses, len(frames))
			}
		})
	}
}

package perl

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/interpreter/libc/libctest"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem/memtest"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
)

// chainScript spins in Leafy::leaf (a sub with a glob), called by
// Chain::mid, called in an eval {} of main::top (a named CV of package
// main), called from an anonymous sub compiled by a string eval, called
// from the file's code: the stack TestSymbolize expects.
const chainScript = `package Leafy; sub leaf { my $x = 0; while (1) { $x++ } }
package Chain; sub mid { Leafy::leaf() }
package main; sub top { eval { Chain::mid() } }
my $f = eval "sub {\n top();\n}"; $| = 1; print "1\n";
$f->();
`

// liveChain is a stopped chainScript interpreter and a Symbolizer of it.
type liveChain struct {
	s       *Symbolizer
	mem     *os.File
	script  string
	myPerl  uint64
	version string
}

// startChain starts chainScript under a tested perl, stops it and finds
// its interpreter as the unwinder does: through PL_thr_key and the
// thread-specific data of the process's C library; it must be the one
// PL_curinterp names.
func startChain(t testing.TB, pf perlFile) *liveChain {
	t.Helper()
	c := &liveChain{version: pf.version, script: filepath.Join(t.TempDir(), "chain.pl")}
	if err := os.WriteFile(c.script, []byte(chainScript), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := detectFile(t, pf.file)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := libctest.StartSpinning(t, exec.Command(pf.perl, c.script))
	fsBase := stopped(t, pid)
	bias, _ := mapped(t, pid, filepath.Base(pf.file))
	_, libcPath := mapped(t, pid, "libc.so.6")
	if c.mem, err = os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.mem.Close() })
	if c.s, err = NewSymbolizer(c.mem, b.Version); err != nil {
		t.Fatal(err)
	}
	lf, err := elf.Open(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	tsd, err := libc.TSDLayoutFromLibc(lf)
	if err != nil {
		t.Fatalf("%s: %v", libcPath, err)
	}
	var key [4]byte
	if _, err := c.mem.ReadAt(key[:], int64(bias+b.ThrKey)); err != nil {
		t.Fatal(err)
	}
	slot, err := tsd.SlotAddress(c.mem, fsBase, binary.LittleEndian.Uint32(key[:]))
	if err != nil {
		t.Fatal(err)
	}
	c.myPerl = c.word(t, slot)
	if curinterp := c.word(t, bias+dynamicSymbol(t, pf.file, "PL_curinterp")); c.myPerl != curinterp || curinterp == 0 {
		t.Fatalf("the main thread's interpreter is %#x through PL_thr_key %d, PL_curinterp %#x",
			c.myPerl, binary.LittleEndian.Uint32(key[:]), curinterp)
	}
	return c
}

func (c *liveChain) word(t testing.TB, addr uint64) uint64 {
	t.Helper()
	w, err := c.s.word(addr)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func (c *liveChain) u32(t testing.TB, addr uint64) uint32 {
	t.Helper()
	var b [4]byte
	if _, err := c.mem.ReadAt(b[:], int64(addr)); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(b[:])
}

// frames walks the context stack as the BPF unwinder does (one runops
// call here: every sub was called from Perl) and returns what it would
// report: per frame the CV or tag and the COP.
func (c *liveChain) frames(t testing.TB) [][2]uint64 {
	l := c.s.l
	cop := c.word(t, c.myPerl+l.InterpCurcop)
	si := c.word(t, c.myPerl+l.InterpCurstackinfo)
	var out [][2]uint64
	for levels := 0; si != 0 && levels < 8; levels++ {
		cxstack := c.word(t, si+l.SICxstack)
		for ix := int32(c.u32(t, si+l.SICxix)); ix >= 0; ix-- {
			cx := cxstack + uint64(ix)*l.CXSize
			typ := uint64(c.word(t, cx+l.CXType) & 0xff)
			switch {
			case typ&0x80 != 0:
				continue
			case typ&cxTypeMask == 9 || typ&cxTypeMask == 10:
				out = append(out, [2]uint64{c.word(t, cx+l.CXCV), cop})
			case typ&cxTypeMask == cxtEval:
				out = append(out, [2]uint64{frameEval | typ, cop})
			default:
				continue
			}
			cop = c.word(t, cx+l.CXOldcop)
		}
		if int32(c.u32(t, si+l.SIType)) == siMain {
			return append(out, [2]uint64{frameMain, cop})
		}
		si = c.word(t, si+l.SIPrev)
	}
	t.Fatal("no main run level")
	return nil
}

// TestSymbolize walks the contexts of a running interpreter of each
// tested perl (and of 5.36 through its libperl) from user space, as the
// BPF unwinder does, and names them: subs with and without a glob, an
// eval {}, an anonymous sub from a string eval, main; with files and
// lines. A second pass is answered from the cache.
func TestSymbolize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	for _, pf := range perlFiles(t) {
		t.Run(pf.name, func(t *testing.T) {
			c := startChain(t, pf)
			// As Carp's cluck in leaf tells it: each frame at the
			// statement it runs, the anonymous sub's in the string eval.
			want := []string{"Leafy::leaf S:1", "Chain::mid S:2", "(eval) S:3", "main::top S:3",
				"main::__ANON__ (eval 1):2", "main S:5"}
			frames := c.frames(t)
			for pass := range 2 {
				var got []string
				for _, fr := range frames {
					f, err := c.s.Frame(fr[0], fr[1])
					if err != nil {
						t.Fatalf("frame %#x at %#x: %v", fr[0], fr[1], err)
					}
					got = append(got, fmt.Sprintf("%s %s:%d", f.Function, strings.Replace(f.File, c.script, "S", 1), f.Line))
				}
				if !slices.Equal(got, want) {
					t.Errorf("pass %d: frames %q, want %q", pass, got, want)
				}
				t.Logf("pass %d: %q", pass, got)
			}
			subs := 4 // leaf, mid, top, __ANON__
			if st := c.s.Stats(); st.Misses != uint64(subs) || st.Hits != uint64(subs) || st.Stale != 0 {
				t.Errorf("stats %+v, want %d misses and hits, none stale", st, subs)
			}
		})
	}
}

// TestSymbolizeReusedAddress: a CV freed and its head reused by another
// sub's CV (here: leaf's head made to point at mid's body) is named after
// the new sub, not from the cache.
func TestSymbolizeReusedAddress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	c := startChain(t, perlFiles(t)[len(perlfetch.Versions)-1])
	frames := c.frames(t)
	leaf, mid := frames[0], frames[1]
	mem := memtest.Patched{ReaderAt: c.mem, Words: map[uint64]uint64{}}
	c.s.mem = mem
	f, err := c.s.Frame(leaf[0], leaf[1])
	if err != nil || f.Function != "Leafy::leaf" {
		t.Fatalf("leaf: %+v, %v", f, err)
	}
	mem.Words[leaf[0]+svAny] = c.word(t, mid[0]+svAny)
	if f, err = c.s.Frame(leaf[0], mid[1]); err != nil || f.Function != "Chain::mid" || f.Line != 2 {
		t.Errorf("reused CV: %+v, %v, want Chain::mid at 2", f, err)
	}
	if st := c.s.Stats(); st.Stale != 1 {
		t.Errorf("stats %+v, want 1 stale", st)
	}
}

// TestSymbolizeGarbage: random memory and random addresses give errors or
// frames, never a panic.
func TestSymbolizeGarbage(t *testing.T) {
	for _, v := range []interpreter.Version{{Major: 5, Minor: 32, Patch: 1}, {Major: 5, Minor: 36}, {Major: 5, Minor: 40, Patch: 1}, {Major: 5, Minor: 42, Patch: 3}} {
		for seed := uint64(1); seed <= 2000; seed++ {
			s, err := NewSymbolizer(memtest.Random{Seed: seed}, v)
			if err != nil {
				t.Fatal(err)
			}
			s.Frame(seed*8, seed*24)
			s.Frame(frameMain, seed*16)
			s.Frame(frameEval|0x4b, seed*32)
		}
	}
}

// dynamicSymbol is the value of an exported symbol of the file at path.
func dynamicSymbol(t testing.TB, path, name string) uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name && s.Section != elf.SHN_UNDEF {
			return s.Value
		}
	}
	t.Fatalf("%s exports no %s", path, name)
	return 0
}

// TestSymbolizeFreedStatement: a frame whose statement cannot be read any
// more (a string eval's, freed when it ended) keeps its sub's name,
// without a position.
func TestSymbolizeFreedStatement(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	c := startChain(t, perlFiles(t)[0])
	leaf := c.frames(t)[0]
	f, err := c.s.Frame(leaf[0], 8) // the first page is never mapped
	if err != nil || f != (Frame{Function: "Leafy::leaf"}) {
		t.Errorf("leaf at an unreadable statement: %+v, %v; want Leafy::leaf without a position", f, err)
	}
}

// BenchmarkSymbolize names the chain's six frames of a live interpreter of
// each tested perl (its perl executable), afresh ("new": empty caches, each
// sub's names and file read) and from the cache ("cached": each hit
// checked with a read of the CV).
func BenchmarkSymbolize(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to trace the interpreter")
	}
	for _, pf := range perlFiles(b) {
		if pf.name != pf.version { // the libperl builds run the same code
			continue
		}
		c := startChain(b, pf) // stopped until the benchmark ends
		frames := c.frames(b)
		run := func(b *testing.B, fresh bool) {
			b.ReportAllocs()
			for b.Loop() {
				if fresh {
					c.s.subs, c.s.files = newSubCache(), newFileCache()
				}
				for _, fr := range frames {
					if _, err := c.s.Frame(fr[0], fr[1]); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		symbench.Run(b, pf.version, len(frames),
			func(b *testing.B) { run(b, true) },
			func(b *testing.B) { run(b, false) })
	}
}

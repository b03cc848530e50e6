package ruby

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc/libctest"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem/memtest"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// chainScript runs Leafy#leaf (a module's method), called by Chain#mid,
// called from a block Chain.top (a singleton method) passes to
// Hash#each_pair (a C function), and spins in leaf's loop: the stack
// TestSymbolize expects. filler statements before leaf's loop put it past
// the first positions of the line table, which are kept apart (the
// succinct table's immediate part holds 54, its blocks 512 each). It
// returns the script and the lines of leaf's loop, mid's call, top's call
// and the main call.
func chainScript(filler int) (script string, leaf, mid, top, main int) {
	var b strings.Builder
	b.WriteString("module Leafy\n  def leaf\n    x = 0\n")
	for i := range filler {
		fmt.Fprintf(&b, "    x += %d\n", i)
	}
	b.WriteString("    while true do x += 1 end\n  end\nend\n")
	b.WriteString("class Chain\n  include Leafy\n  def mid\n    leaf\n  end\n")
	b.WriteString("  def self.top\n    {a: 1}.each_pair { new.mid }\n  end\nend\n")
	b.WriteString("STDOUT.puts 1\nSTDOUT.flush\nChain.top\n")
	leaf = 4 + filler
	return b.String(), leaf, leaf + 6, leaf + 9, leaf + 14
}

// liveChain is a spinning chainScript interpreter of a version and a
// Symbolizer of it.
type liveChain struct {
	s                    *Symbolizer
	mem                  *os.File
	script               string
	leaf, mid, top, main int
	ec                   uint64
}

func startChain(t testing.TB, v string, filler int) *liveChain {
	t.Helper()
	c := &liveChain{}
	var src string
	src, c.leaf, c.mid, c.top, c.main = chainScript(filler)
	c.script = filepath.Join(t.TempDir(), "chain.rb")
	if err := os.WriteFile(c.script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := rubyfetch.Libruby(v)
	if err != nil {
		t.Fatal(err)
	}
	ruby, _ := rubyfetch.Ruby(v)
	b := detectFile(t, lib)
	pid, _ := libctest.StartSpinning(t, exec.Command(ruby, c.script))
	fsBase := mainThreadFSBase(t, pid)
	bias := mappingBias(t, pid, lib)
	if c.mem, err = os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.mem.Close() })
	if c.s, err = NewSymbolizer(c.mem, b.Version, bias+b.GlobalSymbols); err != nil {
		t.Fatal(err)
	}
	c.ec = c.word(t, c.word(t, c.word(t, fsBase+8)+16*c.word(t, bias+b.TLSIndex))+b.TLSOffset)
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

// frames walks the control frames as the BPF unwinder does and returns
// what it would report: per frame the object (method entry or instruction
// sequence) and pc.
func (c *liveChain) frames(t testing.TB) [][2]uint64 {
	l := c.s.l
	end := c.word(t, c.ec+l.ECVMStack) + 8*c.word(t, c.ec+l.ECVMStackSize)
	var out [][2]uint64
	for cfp := c.word(t, c.ec+l.ECCFP); cfp < end; cfp += l.CFPSize {
		ep := c.word(t, cfp+l.CFPEP)
		flags := c.word(t, ep)
		me := c.word(t, ep-8*-epMECref)
		switch {
		case flags&frameMagicMask == frameMagicDummy:
		case flags&frameFlagCFrame != 0:
			out = append(out, [2]uint64{me, 1})
		default:
			obj := c.word(t, cfp+l.CFPISeq)
			if obj == 0 {
				continue
			}
			if flags&frameMagicMask == frameMagicMethod && me != 0 {
				obj = me
			}
			out = append(out, [2]uint64{obj, c.word(t, cfp+l.CFPPC)})
		}
	}
	return out
}

// TestSymbolize walks the control frames of a running interpreter of each
// version from user space, as the BPF unwinder does, and names them: the
// methods with their classes, the block, the C function between them,
// with files and lines. A second pass is answered from the cache.
func TestSymbolize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	for _, tc := range []struct {
		v      string
		filler int
	}{
		{"3.1", 0}, {"3.3", 0}, {"3.4", 0}, {"3.1", 40}, {"3.3", 300}, {"3.4", 1200},
	} {
		t.Run(fmt.Sprintf("%s/%d statements before", tc.v, tc.filler), func(t *testing.T) {
			c := startChain(t, tc.v, tc.filler)
			want := []string{fmt.Sprintf("Leafy#leaf:%d", c.leaf), fmt.Sprintf("Chain#mid:%d", c.mid),
				fmt.Sprintf("block in top:%d", c.top), "Hash#each_pair:0", fmt.Sprintf("Chain.top:%d", c.top),
				fmt.Sprintf("<main>:%d", c.main)}
			frames := c.frames(t)
			for pass := range 2 {
				var got []string
				for _, fr := range frames {
					f, err := c.s.Frame(fr[0], fr[1])
					if err != nil {
						t.Fatalf("frame %#x at %#x: %v", fr[0], fr[1], err)
					}
					if f.File != "" && f.File != c.script {
						t.Errorf("%s in %s, want %s", f.Function, f.File, c.script)
					}
					got = append(got, fmt.Sprintf("%s:%d", f.Function, f.Line))
				}
				if !slices.Equal(got, want) {
					t.Errorf("pass %d: frames %s, want %s", pass, strings.Join(got, " "), strings.Join(want, " "))
				}
				t.Logf("pass %d: %s", pass, strings.Join(got, " "))
			}
			if st := c.s.Stats(); st.Misses != uint64(len(frames)) || st.Hits != uint64(len(frames)) || st.Stale != 0 {
				t.Errorf("stats %+v, want %d misses and hits, none stale", st, len(frames))
			}
		})
	}
}

// TestSymbolizeReusedAddress: a method entry freed and its slot reused by
// another method's entry (here: leaf's entry made to look like mid's) is
// named after the new method, not from the cache.
func TestSymbolizeReusedAddress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	c := startChain(t, "3.4", 0)
	frames := c.frames(t)
	leaf, mid := frames[0], frames[1]
	mem := memtest.Patched{ReaderAt: c.mem, Words: map[uint64]uint64{}}
	c.s.mem = mem
	f, err := c.s.Frame(leaf[0], leaf[1])
	if err != nil || f.Function != "Leafy#leaf" {
		t.Fatalf("leaf: %+v, %v", f, err)
	}
	l := c.s.l
	mem.Words[leaf[0]+l.MEDef] = c.word(t, mid[0]+l.MEDef)
	mem.Words[leaf[0]+l.MEOwner] = c.word(t, mid[0]+l.MEOwner)
	if f, err = c.s.Frame(leaf[0], mid[1]); err != nil || f.Function != "Chain#mid" || f.Line != c.mid {
		t.Errorf("reused entry: %+v, %v, want Chain#mid at %d", f, err, c.mid)
	}
	if st := c.s.Stats(); st.Stale != 1 {
		t.Errorf("stats %+v, want 1 stale", st)
	}
}

// TestSymbolizeGarbage: random memory and random addresses give errors.
func TestSymbolizeGarbage(t *testing.T) {
	for _, v := range []interpreter.Version{{Major: 3, Minor: 1, Patch: 2}, {Major: 3, Minor: 3, Patch: 8}, {Major: 3, Minor: 4, Patch: 1}} {
		for seed := uint64(1); seed <= 2000; seed++ {
			s, err := NewSymbolizer(memtest.Random{Seed: seed}, v, seed*4096)
			if err != nil {
				t.Fatal(err)
			}
			s.Frame(seed*8, seed*24)
			s.Frame(seed*16, 1)
		}
	}
}

// BenchmarkSymbolize names the frames of a live 3.4 chain: "cached" from
// the cache (one read of each object to check it), "uncached" with every
// object read afresh (a new Symbolizer per pass).
func BenchmarkSymbolize(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to trace the interpreter")
	}
	c := startChain(b, "3.4", 0)
	frames := c.frames(b)
	run := func(b *testing.B, fresh bool) {
		b.ReportAllocs()
		for b.Loop() {
			if fresh {
				c.s.cache = newCache()
			}
			for _, fr := range frames {
				if _, err := c.s.Frame(fr[0], fr[1]); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/frame")
	}
	b.Run("cached", func(b *testing.B) { run(b, false) })
	b.Run("uncached", func(b *testing.B) { run(b, true) })
}

package ruby

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// chainScript runs leaf, called by mid, called from a block top passes to
// Hash#each_pair (a C function), and spins in leaf's loop: the stack
// TestSymbolize expects. filler statements before leaf's loop put it past
// the first positions of the line table, which are kept apart (the
// succinct table's immediate part holds 54, its blocks 512 each). It
// returns the script and the lines of leaf's loop, mid's call, top's call
// and the main call.
func chainScript(filler int) (script string, leaf, mid, top, main int) {
	var b strings.Builder
	b.WriteString("def leaf\n  x = 0\n")
	for i := range filler {
		fmt.Fprintf(&b, "  x += %d\n", i)
	}
	b.WriteString("  while true do x += 1 end\nend\ndef mid\n  leaf\nend\ndef top\n  {a: 1}.each_pair { mid }\nend\n")
	b.WriteString("STDOUT.puts 1\nSTDOUT.flush\ntop\n")
	leaf = 3 + filler
	return b.String(), leaf, leaf + 3, leaf + 6, leaf + 10
}

// TestSymbolize walks the control frames of a running interpreter of each
// version from user space, as the BPF unwinder will, and names them: the
// Ruby methods and the block with their files and lines, the C function
// between them with its class (3.3+, where classes keep their path).
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
		v := tc.v
		t.Run(fmt.Sprintf("%s/%d statements before", v, tc.filler), func(t *testing.T) {
			src, leafLine, midLine, topLine, mainLine := chainScript(tc.filler)
			script := filepath.Join(t.TempDir(), "chain.rb")
			if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			lib, err := rubyfetch.Libruby(v)
			if err != nil {
				t.Fatal(err)
			}
			ruby, _ := rubyfetch.Ruby(v)
			b := detectFile(t, lib)
			pid := startSpinning(t, ruby, script)
			fsBase := mainThreadFSBase(t, pid)
			bias := mappingBias(t, pid, lib)
			mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			s, err := NewSymbolizer(mem, b.Version, bias+b.GlobalSymbols)
			if err != nil {
				t.Fatal(err)
			}
			word := func(addr uint64) uint64 {
				w, err := s.word(addr)
				if err != nil {
					t.Fatal(err)
				}
				return w
			}
			l := s.l
			ec := word(word(word(fsBase+8)+16*word(bias+b.TLSIndex)) + b.TLSOffset)
			end := word(ec+l.ECVMStack) + 8*word(ec+l.ECVMStackSize)
			var got []string
			for cfp := word(ec + l.ECCFP); cfp < end; cfp += l.CFPSize {
				ep := word(cfp + l.CFPEP)
				flags := word(ep)
				var f Frame
				switch {
				case flags&frameMagicMask == frameMagicDummy:
					continue
				case flags&frameFlagCFrame != 0:
					if f, err = s.CFuncFrame(word(ep - 16)); err != nil {
						t.Fatalf("C frame at %#x: %v", cfp, err)
					}
				default:
					iseq := word(cfp + l.CFPISeq)
					if iseq == 0 {
						continue
					}
					if f, err = s.ISeqFrame(iseq, word(cfp+l.CFPPC)); err != nil {
						t.Fatalf("frame at %#x: %v", cfp, err)
					}
				}
				if f.File != "" && f.File != script {
					t.Errorf("%s in %s, want %s", f.Function, f.File, script)
				}
				got = append(got, fmt.Sprintf("%s:%d", f.Function, f.Line))
			}
			each := "each_pair:0"
			if l.ClassPath != 0 {
				each = "Hash#each_pair:0"
			}
			want := []string{fmt.Sprintf("leaf:%d", leafLine), fmt.Sprintf("mid:%d", midLine),
				fmt.Sprintf("block in top:%d", topLine), each, fmt.Sprintf("top:%d", topLine), fmt.Sprintf("<main>:%d", mainLine)}
			if !slices.Equal(got, want) {
				t.Errorf("frames %s, want %s", strings.Join(got, " "), strings.Join(want, " "))
			}
			t.Logf("%v: %s", b.Version, strings.Join(got, " "))
		})
	}
}

// randomMemory is a process whose every byte is random: whatever the
// symbolizer reads there, it must end with an error or a frame, never a
// panic or an unbounded read.
type randomMemory struct{ seed uint64 }

func (m randomMemory) ReadAt(b []byte, off int64) (int, error) {
	if len(b) > 1<<16 {
		return 0, fmt.Errorf("read of %d bytes", len(b))
	}
	x := uint64(off) ^ m.seed
	for i := range b {
		// splitmix64 of the address: the same bytes on every read.
		z := x + uint64(i)*0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		b[i] = byte(z ^ z>>31)
	}
	return len(b), nil
}

// TestSymbolizeGarbage: random memory and random addresses give errors.
func TestSymbolizeGarbage(t *testing.T) {
	for _, v := range []Version{{3, 1, 2}, {3, 3, 8}, {3, 4, 1}} {
		for seed := uint64(1); seed <= 2000; seed++ {
			s, err := NewSymbolizer(randomMemory{seed}, v, seed*4096)
			if err != nil {
				t.Fatal(err)
			}
			s.ISeqFrame(seed*8, seed*24)
			s.CFuncFrame(seed * 16)
		}
	}
}

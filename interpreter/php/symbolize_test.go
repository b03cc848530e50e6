package php

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc/libctest"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem/memtest"
	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
)

// workload is utils/workloads/php/phpworkload.php and its "# hot: NAME"
// lines.
func workload(t testing.TB) (string, map[string]int) {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	path, err := filepath.Abs(filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", "php", "phpworkload.php"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	hot := map[string]int{}
	for i, line := range strings.Split(string(src), "\n") {
		if _, name, ok := strings.Cut(line, "# hot: "); ok {
			hot[name] = i + 1
		}
	}
	return path, hot
}

// liveFrames walks the frames of a stopped PHP process as the unwinder
// does (php.ebpf.c) and returns them as it reports them: file id and addr.
func liveFrames(t testing.TB, mem *procmem.Reader, l *Layout, eg uint64) [][2]uint64 {
	t.Helper()
	ed, err := mem.Ptr(eg + l.CurrentExecuteData)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]uint64
	for ; ed != 0 && len(out) < 64; ed, err = mem.Ptr(ed + executeDataPrev) {
		if err != nil {
			t.Fatal(err)
		}
		var ex [56]byte
		if err := mem.Read(ed, ex[:]); err != nil {
			t.Fatal(err)
		}
		fn, opline := binary.LittleEndian.Uint64(ex[executeDataFunc:]), binary.LittleEndian.Uint64(ex[executeDataOpline:])
		if fn == 0 {
			continue
		}
		typ, _ := mem.U8(fn + functionType)
		name, _ := mem.Ptr(fn + functionName)
		var flags uint64
		if binary.LittleEndian.Uint32(ex[40:])&(1<<17) != 0 {
			flags |= FrameTop
		}
		id := fn
		switch {
		case typ == internalFunction:
			opline = 0
		case name == 0:
			if id, err = mem.Ptr(fn + l.OpArrayFilename); err != nil {
				t.Fatal(err)
			}
			flags |= FrameCode
		}
		out = append(out, [2]uint64{id, opline | flags})
	}
	return out
}

// liveChain starts the chain workload under release v, stops it in its
// loop and returns a Symbolizer of it with its frames as the unwinder
// reports them.
func liveChain(t testing.TB, v string) (*Symbolizer, [][2]uint64) {
	t.Helper()
	script, _ := workload(t)
	b, err := phpfetch.PHP(v)
	if err != nil {
		t.Fatal(err)
	}
	d := detectFile(t, b.CLI)
	pid, line := libctest.StartSpinning(t, b.Command(script, "chain", "30"))
	if !strings.HasPrefix(line, "hot phase") {
		t.Fatalf("%s printed %q", b.CLI, line)
	}
	_, bias, err := libctest.Mapped(pid, func(base string) bool { return base == filepath.Base(b.CLI) })
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	s, err := NewSymbolizer(f, d.Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	return s, liveFrames(t, s.mem, s.l, bias+d.ExecutorGlobals)
}

// TestSymbolize names the chain of a spinning workload of every tested
// release from its memory: methods with their class, a C function, a
// namespaced function, the script's {main}, with files and lines (the
// innermost frame's line is the VM's register's, which this walk does not
// read: its name only is checked).
func TestSymbolize(t *testing.T) {
	script, hot := workload(t)
	for _, v := range phpfetch.Versions {
		t.Run(v, func(t *testing.T) {
			s, frames := liveChain(t, v)
			want := []Frame{{Function: `Shop\Cart::leaf`, File: script, Line: -1},
				{Function: `Shop\Cart::mid`, File: script, Line: hot["mid"]}, {Function: "array_map"},
				{Function: `Shop\top`, File: script, Line: hot["top"]}, {Function: "{main}", File: script, Line: hot["main"]}}
			var got []Frame
			for _, fr := range frames {
				sf, err := s.Frame(fr[0], fr[1])
				if err != nil {
					t.Fatalf("frame %#x at %#x: %v", fr[0], fr[1], err)
				}
				got = append(got, sf)
			}
			if len(got) != len(want) {
				t.Fatalf("frames %+v, want %+v", got, want)
			}
			for i := range want {
				if want[i].Line < 0 {
					got[i].Line = -1
				}
				if got[i] != want[i] {
					t.Errorf("frame %d: %+v, want %+v", i, got[i], want[i])
				}
			}
			// Again, from the cache: each hit confirmed by one read.
			for _, fr := range frames {
				if _, err := s.Frame(fr[0], fr[1]); err != nil {
					t.Fatal(err)
				}
			}
			if st := s.Stats(); st.Hits != 4 || st.Stale != 0 {
				t.Errorf("cache after two rounds: %+v, want 4 hits (the functions), none stale", st)
			}
		})
	}
}

// fakeMemory is a process's memory made of a few byte ranges.
type fakeMemory map[uint64][]byte

func (m fakeMemory) ReadAt(b []byte, off int64) (int, error) {
	for start, data := range m {
		if uint64(off) >= start && uint64(off)+uint64(len(b)) <= start+uint64(len(data)) {
			return copy(b, data[uint64(off)-start:]), nil
		}
	}
	return 0, errors.New("unmapped")
}

// zendString is a zend_string holding s.
func zendString(s string) []byte {
	b := make([]byte, stringVal+len(s)+1)
	binary.LittleEndian.PutUint64(b[stringLen:], uint64(len(s)))
	copy(b[stringVal:], s)
	return b
}

// TestSymbolizeReusedAddress: a function freed at a request's end and
// another allocated at its address (PHP without OPcache) is read anew,
// not named from the cache.
func TestSymbolizeReusedAddress(t *testing.T) {
	s, err := NewSymbolizer(nil, interpreter.Version{Major: 8, Minor: 2})
	if err != nil {
		t.Fatal(err)
	}
	const fn, name1, name2, file, opcodes = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000
	head := make([]byte, s.l.functionHead())
	le := binary.LittleEndian
	head[functionType] = userFunction
	le.PutUint64(head[functionName:], name1)
	le.PutUint64(head[s.l.OpArrayOpcodes:], opcodes)
	le.PutUint32(head[s.l.OpArrayLast:], 2)
	le.PutUint64(head[s.l.OpArrayFilename:], file)
	ops := make([]byte, 2*opSize)
	le.PutUint32(ops[opSize+opLineno:], 42)
	mem := fakeMemory{fn: head, name1: zendString("first"), name2: zendString("second"), file: zendString("/a.php"), opcodes: ops}
	s.mem = procmem.New(mem)
	if f, err := s.Frame(fn, opcodes+opSize); err != nil || f != (Frame{Function: "first", File: "/a.php", Line: 42}) {
		t.Fatalf("first: %+v, %v", f, err)
	}
	reused := append([]byte(nil), head...)
	le.PutUint64(reused[functionName:], name2)
	mem[fn] = reused
	if f, err := s.Frame(fn, opcodes); err != nil || f != (Frame{Function: "second", File: "/a.php"}) {
		t.Fatalf("reused: %+v, %v", f, err)
	}
	if st := s.Stats(); st.Stale != 1 || st.Misses != 2 {
		t.Errorf("stats %+v, want 2 misses, 1 stale", st)
	}
	// An opline outside the function's instructions has no line.
	if f, err := s.Frame(fn, opcodes+5*opSize); err != nil || f.Line != 0 {
		t.Errorf("opline past the end: %+v, %v", f, err)
	}
}

// TestSymbolizeGarbage: frames read from garbage give errors, not panics,
// hangs or huge allocations.
func TestSymbolizeGarbage(t *testing.T) {
	s, err := NewSymbolizer(memtest.Random{Seed: 1}, interpreter.Version{Major: 8, Minor: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		addr := uint64(i) * 0x1008
		_, _ = s.Frame(addr, uint64(i)&frameFlags|addr)
	}
}

// BenchmarkSymbolize names the chain's five frames of a live 8.4 process,
// from the cache (one read of each function's head) and afresh.
func BenchmarkSymbolize(b *testing.B) {
	s, frames := liveChain(b, phpfetch.Versions[len(phpfetch.Versions)-1])
	run := func(b *testing.B, fresh bool) {
		b.ReportAllocs()
		for b.Loop() {
			if fresh {
				s.cache = newCache()
			}
			for _, fr := range frames {
				if _, err := s.Frame(fr[0], fr[1]); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/frame")
	}
	b.Run("cached", func(b *testing.B) { run(b, false) })
	b.Run("uncached", func(b *testing.B) { run(b, true) })
}

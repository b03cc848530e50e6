package luajit

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/luajitfetch"
)

// liveScript runs leaf's loop until it is compiled, then prints what
// LuaJIT says of leaf (its GCfunc, the line of bytecode 2), of a coroutine
// (its lua_State, which points to G) and of trace 1
// (its machine code), and waits for its standard input to end.
const liveScript = `local function leaf(n) -- line 1
  local s = 0
  for i = 1, n do s = s + i % 7 end -- line 3
  return s
end
for _ = 1, 200 do leaf(1000) end
local ju = require("jit.util")
local _, mc = ju.tracemc(1)
io.write(string.format("leaf %s line %d\n", tostring(leaf):match("0x%x+"), ju.funcinfo(leaf, 2).currentline))
local co = coroutine.create(function() end)
io.write(string.format("thread %s\n", tostring(co):match("0x%x+")))
io.write(string.format("trace %.0f\n", mc or 0))
io.write("ready\n")
io.stdout:flush()
io.read("*a")
`

// live is a running luajit and what it printed.
type live struct {
	sym       *Symbolizer
	layout    *Layout
	script    string
	fn, g, mc uint64
	line      uint32
}

// startLive runs liveScript under luajit version and reads it.
func startLive(tb testing.TB, version string) *live {
	tb.Helper()
	exe, err := luajitfetch.Executable(version, runtime.GOARCH)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		tb.Fatal(err)
	}
	m := f.Machine
	f.Close()
	l := openresty21(m)
	script := filepath.Join(tb.TempDir(), "live.lua")
	if err := os.WriteFile(script, []byte(liveScript), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd, err := luajitfetch.Command(version, script)
	if err != nil {
		tb.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	lv := &live{layout: l, script: script}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		var a string
		var n int
		switch {
		case strings.HasPrefix(sc.Text(), "leaf "):
			fmt.Sscanf(sc.Text(), "leaf %s line %d", &a, &n)
			lv.fn, _ = strconv.ParseUint(a, 0, 64)
			lv.line = uint32(n)
		case strings.HasPrefix(sc.Text(), "thread "):
			fmt.Sscanf(sc.Text(), "thread %s", &a)
			lv.g, _ = strconv.ParseUint(a, 0, 64)
		case strings.HasPrefix(sc.Text(), "trace "):
			fmt.Sscanf(sc.Text(), "trace %s", &a)
			lv.mc, _ = strconv.ParseUint(a, 0, 64)
		}
	}
	if lv.fn == 0 || lv.g == 0 {
		tb.Fatalf("luajit printed no function or thread")
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mem.Close() })
	lv.sym = NewSymbolizer(procmem.New(mem), l)
	// The coroutine's G.
	if lv.g, err = lv.sym.mem.U64(lv.g + uint64(l.State.GlRef)); err != nil {
		tb.Fatal(err)
	}
	return lv
}

// leafFrame is the BPF frame of leaf at bytecode 2 (the PC saved is the
// next one's).
func (lv *live) leafFrame(tb testing.TB) (uint64, uint64) {
	bc, err := lv.sym.mem.U64(lv.fn + uint64(lv.layout.Func.PC))
	if err != nil {
		tb.Fatal(err)
	}
	return bc - uint64(lv.layout.Proto.Size), bc + 3*4
}

// TestLiveSymbolize names leaf's interpreted frame and trace 1's frame in
// a running luajit of each tested version.
func TestLiveSymbolize(t *testing.T) {
	for _, v := range luajitfetch.Versions {
		t.Run(v, func(t *testing.T) {
			lv := startLive(t, v)
			proto, pc := lv.leafFrame(t)
			want := libpf.Frame{Kind: Kind, FunctionName: "live.lua:1", SourceFile: lv.script, SourceLine: lv.line}
			for range 2 {
				out, err := lv.sym.Frames(proto, pc, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(out) != 1 || out[0] != want {
					t.Errorf("leaf's frame: %+v, want %+v", out, want)
				}
			}
			if st := lv.sym.Stats(); st.Misses != 1 || st.Hits != 1 {
				t.Errorf("cache: %+v, want one miss then one hit", st)
			}
			// No PC: the function without a line.
			if out, err := lv.sym.Frames(proto, 0, nil); err != nil || len(out) != 1 || out[0].SourceLine != 0 {
				t.Errorf("leaf without a PC: %+v, %v", out, err)
			}
			if lv.mc == 0 {
				t.Fatal("luajit compiled no trace")
			}
			out, err := lv.sym.Frames(traceTag|lv.g, lv.mc+1, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != 1 || out[0].FunctionName != "live.lua:1" || out[0].SourceLine != 3 || out[0].Tier != "trace 1" {
				t.Errorf("trace 1's frame: %+v, want live.lua:1 at line 3, trace 1", out)
			}
			if _, err := lv.sym.Frames(traceTag|lv.g, 0x1000, nil); err == nil {
				t.Error("a PC in no trace was named")
			}
			if _, err := lv.sym.Frames(0x1000, 0, nil); err == nil {
				t.Error("a prototype at an unmapped address was named")
			}
		})
	}
}

// TestChunkDisplay: file chunks lose their "@", source text chunks are
// shown as LuaJIT shows them.
func TestChunkDisplay(t *testing.T) {
	for in, want := range map[string]string{
		"@/tmp/x.lua": "/tmp/x.lua", "=stdin": "stdin", "return 1": `[string "return 1"]`,
		"a\nb": `[string "a..."]`,
	} {
		if got := chunkDisplay(in); got != want {
			t.Errorf("chunkDisplay(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParseTarget feeds the parsers of target memory (a prototype's
// header, its line table, a trace's header, the machine-code areas'
// links) garbage: errors, never a panic.
func FuzzParseTarget(f *testing.F) {
	l := openresty21(elf.EM_X86_64)
	hdr := make([]byte, l.Proto.Size)
	binary.LittleEndian.PutUint32(hdr[l.Proto.SizeBC:], 10)
	binary.LittleEndian.PutUint64(hdr[l.Proto.ChunkName:], 0x1000)
	binary.LittleEndian.PutUint32(hdr[l.Proto.FirstLine:], 5)
	binary.LittleEndian.PutUint32(hdr[l.Proto.NumLine:], 300)
	f.Add(hdr, uint32(3), uint64(0x1000))
	f.Add([]byte{1, 2, 3}, uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, pos uint32, addr uint64) {
		if h, err := parseProto(l, b); err == nil {
			p := &proto{protoHeader: h, lines: b}
			if uint64(len(b)) < uint64(h.SizeBC)*h.lineWidth() {
				p.lines = nil
				p.LineInfo = 0
			}
			_ = p.lineAt(procmem.New(emptyMem{}), pos)
		}
		if tr, err := parseTrace(l, addr, b); err == nil {
			tt := &traceTable{traces: []trace{tr}}
			if _, ok := tt.find(tr.mcode); !ok {
				t.Errorf("trace %+v not found at its start", tr)
			}
		}
		_ = validArea(addr, addr+uint64(pos), uint64(len(b)))
	})
}

// emptyMem is memory of which nothing can be read.
type emptyMem struct{}

func (emptyMem) ReadAt([]byte, int64) (int, error) { return 0, os.ErrNotExist }

func benchmarkSymbolize(b *testing.B, cached bool) {
	lv := startLive(b, luajitfetch.Versions[len(luajitfetch.Versions)-1])
	proto, pc := lv.leafFrame(b)
	var out []libpf.Frame
	b.ResetTimer()
	for range b.N {
		if !cached {
			b.StopTimer()
			lv.sym = NewSymbolizer(lv.sym.mem, lv.layout)
			b.StartTimer()
		}
		var err error
		if out, err = lv.sym.Frames(proto, pc, out[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(out)), "frames")
}

// BenchmarkSymbolize: a Lua frame named from a new symbolizer (the
// prototype, its chunk name and line table read) and from the cache (one
// read of the prototype's header).
func BenchmarkSymbolize(b *testing.B) {
	b.Run("new", func(b *testing.B) { benchmarkSymbolize(b, false) })
	b.Run("cached", func(b *testing.B) { benchmarkSymbolize(b, true) })
}

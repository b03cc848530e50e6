package luajit

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
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
local function sq(x) -- sq
  if x < 0 then error("negative") end -- sq guard
  return x * x
end
local function loop(n) -- loop
  local s = 0
  for i = 1, n do s = s + sq(i) end -- loop call
  return s
end
for _ = 1, 200 do loop(1000) end
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

// scriptLine is the line of liveScript that ends with "-- mark".
func scriptLine(t *testing.T, mark string) uint32 {
	for i, l := range strings.Split(liveScript, "\n") {
		if strings.HasSuffix(l, "-- "+mark) {
			return uint32(i + 1)
		}
	}
	t.Fatalf("no line %q in the script", mark)
	return 0
}

// TestLiveInlined: loop's trace inlines sq; the snapshot of sq's guard
// names sq (inlined) at the guard's line above loop at its call's line.
func TestLiveInlined(t *testing.T) {
	for _, v := range luajitfetch.Versions {
		t.Run(v, func(t *testing.T) {
			lv := startLive(t, v)
			sqName := "live.lua:" + strconv.Itoa(int(scriptLine(t, "sq")))
			loopName := "live.lua:" + strconv.Itoa(int(scriptLine(t, "loop")))
			guard, call := scriptLine(t, "sq guard"), scriptLine(t, "loop call")
			tt, err := lv.sym.readTraces(lv.g)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			var seen []string
			for _, tr := range tt.traces {
				snaps, err := lv.sym.mem.ReadUpTo(tr.snap, uint64(tr.nsnap)*snapshotSize)
				if err != nil {
					t.Fatal(err)
				}
				for _, sn := range parseSnapshots(snaps) {
					out, err := lv.sym.Frames(traceTag|lv.g, tr.mcode+uint64(sn.mcofs)*uint64(lv.layout.MCodeUnit), nil)
					if err != nil {
						t.Fatal(err)
					}
					var names []string
					for _, f := range out {
						names = append(names, fmt.Sprintf("%s:%d:%v", f.FunctionName, f.SourceLine, f.Inlined))
					}
					seen = append(seen, strings.Join(names, " "))
					if len(out) == 2 && out[0] == (libpf.Frame{Kind: Kind, FunctionName: sqName, SourceFile: lv.script,
						SourceLine: guard, Inlined: true, Tier: out[1].Tier}) &&
						out[1].FunctionName == loopName && out[1].SourceLine == call && !out[1].Inlined {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("no snapshot names %s:%d inlined into %s:%d; snapshots name %q", sqName, guard, loopName, call, seen)
			}
		})
	}
}

// TestDecodeSnapshot: a snapshot with one inlined frame, and broken ones.
func TestDecodeSnapshot(t *testing.T) {
	consts := map[uint32][2]uint64{0x7ff0: {irKGC, 0xf00}, 0x7ff1: {irKNUM, 0x5008}, 0x7ff2: {irKNUM, 0x5009}}
	constant := func(ref uint32) (uint8, uint64, error) {
		c, ok := consts[ref]
		if !ok {
			return 0, 0, errSnapshot
		}
		return uint8(c[0]), c[1], nil
	}
	// The frame at slot 6: its function at 4, its link at 5.
	entries := []uint32{4<<24 | 0x7ff0, 5<<24 | snapFrame | 0x7ff1, 7<<24 | 0x8001}
	got, err := decodeSnapshot(entries, 0x4000<<8|4, constant)
	want := []snapFrameRef{{fn: 0xf00, pc: 0x4000, resume: true}, {pc: 0x5008}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("decodeSnapshot: %+v, %v, want %+v", got, err, want)
	}
	for name, bad := range map[string][]uint32{
		"no link":        {4<<24 | 0x7ff0},
		"no function":    {5<<24 | snapFrame | 0x7ff1},
		"not a Lua link": {4<<24 | 0x7ff0, 5<<24 | snapFrame | 0x7ff2},
		"continuation":   {4<<24 | 0x7ff0, 5<<24 | snapFrame | snapCont | 0x7ff1},
		"function not K": {4<<24 | 0x7ff1, 5<<24 | snapFrame | 0x7ff1},
		"unknown IR":     {4<<24 | 0x7000, 5<<24 | snapFrame | 0x7ff1},
	} {
		if got, err := decodeSnapshot(bad, 0x4000<<8|4, constant); err == nil {
			t.Errorf("%s: decoded %+v", name, got)
		}
	}
	// No inlined frame: the start frame at the snapshot's PC.
	if got, err := decodeSnapshot(nil, 0x4000<<8, constant); err != nil || len(got) != 1 || got[0] != (snapFrameRef{pc: 0x4000, resume: true}) {
		t.Errorf("no inlined frame: %+v, %v", got, err)
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
// header, its line table, a trace's header and snapshots, the
// machine-code areas' links) garbage: errors, never a panic.
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
		var entries []uint32
		for i := 0; i+4 <= len(b); i += 4 {
			entries = append(entries, binary.LittleEndian.Uint32(b[i:]))
		}
		_, _ = decodeSnapshot(entries, addr, func(ref uint32) (uint8, uint64, error) {
			return uint8(ref), uint64(ref) * uint64(pos), nil
		})
		snaps := parseSnapshots(b)
		if i := snapshotAt(snaps, uint64(pos)); i >= len(snaps) {
			t.Errorf("snapshot %d of %d", i, len(snaps))
		}
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

// benchmarkSymbolize names one frame per operation, from a new
// symbolizer (uncached) or from lv's (cached).
func benchmarkSymbolize(b *testing.B, lv *live, proto, pc uint64, cached bool) {
	var out []libpf.Frame
	if cached {
		if _, err := lv.sym.Frames(proto, pc, nil); err != nil { // the cache filled
			b.Fatal(err)
		}
	}
	for b.Loop() {
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
	b.ReportMetric(float64(len(out)), "named/op")
}

// BenchmarkSymbolize, per tested version: a Lua frame named from a new
// symbolizer (the prototype, its chunk name and line table read) and from
// the cache (one read of the prototype's header); a trace frame the same
// way (new: the VM instance's trace table, the trace's snapshots and
// prototype read; cached: one read of the trace's and of the prototype's
// header).
func BenchmarkSymbolize(b *testing.B) {
	for _, v := range luajitfetch.Versions {
		lv := startLive(b, v)
		proto, pc := lv.leafFrame(b)
		run := func(proto, pc uint64) (func(*testing.B), func(*testing.B)) {
			return func(b *testing.B) { benchmarkSymbolize(b, lv, proto, pc, false) },
				func(b *testing.B) { benchmarkSymbolize(b, lv, proto, pc, true) }
		}
		uncached, cached := run(proto, pc)
		symbench.Run(b, v+"/lua", 1, uncached, cached)
		uncached, cached = run(traceTag|lv.g, lv.mc+1)
		symbench.Run(b, v+"/trace", 1, uncached, cached)
	}
}

package v8

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
)

// liveScript optimizes top with leaf and mid inlined, prints V8's own
// description of top and leaf (%DebugPrint: their SharedFunctionInfo and
// code) and then idles until killed.
const liveScript = `
function leaf(n) { let s = 0; for (let i = 0; i < n; i++) s += i % 7; return s; }
function mid(n) { return leaf(n) + 1; }
function top(n) { return mid(n) + 1; }
%PrepareFunctionForOptimization(top);
for (let i = 0; i < 10000; i++) top(10);
%OptimizeFunctionOnNextCall(top);
top(10);
%DebugPrint(top);
%DebugPrint(leaf);
console.log('ready');
setInterval(() => {}, 1000);
`

// liveNode starts node on liveScript and returns a process reading it,
// top's SharedFunctionInfo and TurboFan code object and leaf's
// SharedFunctionInfo.
func liveNode(tb testing.TB, node string) (p *process, top, topCode, leaf uint64) {
	tb.Helper()
	f, err := elf.Open(node)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	info, err := readBinary(f)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := NewLayout(info.md, info.Version)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(node, "--allow-natives-syntax", "--no-concurrent-recompilation", "-e", liveScript)
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sfi := regexp.MustCompile(`shared_info: (0x[0-9a-f]+) <SharedFunctionInfo (\w+)>`)
	// TURBOFAN_JS from V8 13.
	code := regexp.MustCompile(`- code: (0x[0-9a-f]+) <Code TURBOFAN(?:_JS)?>`)
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		if m := sfi.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseUint(m[1], 0, 64)
			if m[2] == "top" && top == 0 {
				top = v
			} else if m[2] == "leaf" {
				leaf = v
			}
		}
		if m := code.FindStringSubmatch(sc.Text()); m != nil && topCode == 0 {
			topCode, _ = strconv.ParseUint(m[1], 0, 64)
		}
	}
	if top == 0 || topCode == 0 || leaf == 0 {
		tb.Fatalf("node printed no SharedFunctionInfo of top and leaf or no TurboFan code of top")
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mem.Close() })
	b := &v8Binary{info: info, layout: l, path: node}
	return &process{bin: b, sym: newSymbolizer(procmem.New(mem), l, &info.BytecodeSizes)}, top, topCode, leaf
}

// liveFrames returns the frames BPF would report of a live system node:
// top's TurboFan frame at each return address whose position has an
// inlined function, and leaf's interpreted frame at its first bytecode.
func liveFrames(tb testing.TB) (*process, []support.Frame, support.Frame) {
	return liveFramesOf(tb, nodefetch.SystemNode)
}

// liveFramesOf is liveFrames of node.
func liveFramesOf(tb testing.TB, node string) (*process, []support.Frame, support.Frame) {
	p, top, topCode, leaf := liveNode(tb, node)
	c, err := p.sym.readCode(topCode)
	if err != nil {
		tb.Fatal(err)
	}
	var compiled []support.Frame
	for _, row := range c.positions {
		if row.codeOffset >= int64(c.size) {
			// A table decoded in the wrong format (V8 14's, read as
			// 13's, gave offsets up to 1.5 times the code's size).
			tb.Errorf("position table row at code offset %d, beyond top's %d bytes", row.codeOffset, c.size)
		}
		if inliningID(row.position) >= 0 && row.codeOffset >= 0 {
			compiled = append(compiled, support.Frame{Kind: Kind, ReturnAddress: true, FileID: top,
				Addr: frameCode<<frameTypeShift | (c.start + uint64(row.codeOffset) + 1)})
		}
	}
	if len(compiled) == 0 {
		tb.Fatal("top's TurboFan code has no position with an inlined function")
	}
	fn, err := p.sym.function(leaf)
	if err != nil {
		tb.Fatal(err)
	}
	interpreted := support.Frame{Kind: Kind, ReturnAddress: true, FileID: leaf,
		Addr: frameBytecode<<frameTypeShift | ((fn.bytecode>>3)&0xffffff)<<32}
	return p, compiled, interpreted
}

// TestLiveSymbolize names the frames of a live node of every tested
// version: top's optimized frame shows leaf and mid inlined into it,
// innermost first, in the right script; leaf's interpreted frame is leaf.
func TestLiveSymbolize(t *testing.T) {
	for _, v := range nodefetch.VersionsFor(runtime.GOARCH) {
		t.Run("Node "+v, func(t *testing.T) {
			node, err := nodefetch.Node(v)
			if err != nil {
				t.Fatal(err)
			}
			checkLiveSymbolize(t, node)
		})
	}
}

func checkLiveSymbolize(t *testing.T, node string) {
	p, compiled, interpreted := liveFramesOf(t, node)
	var names [][]string
	for _, f := range compiled {
		out, err := p.Symbolize(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ns []string
		for _, fr := range out {
			ns = append(ns, fr.FunctionName)
		}
		names = append(names, ns)
		if last := out[len(out)-1]; last.FunctionName != "top" || last.Inlined || last.Tier != TierTurbofan {
			t.Errorf("outermost frame %+v, want top, not inlined, TurboFan", last)
		}
		for _, fr := range out[:len(out)-1] {
			if !fr.Inlined || fr.SourceFile != "[eval]" || fr.SourceLine != 2 && fr.SourceLine != 3 {
				t.Errorf("inlined frame %+v, want inlined, in [eval] at line 2 or 3", fr)
			}
		}
	}
	t.Logf("top's call sites name %v", names)
	out, err := p.Symbolize(interpreted, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].FunctionName != "leaf" || out[0].Tier != TierInterpreted {
		t.Errorf("interpreted frame %+v, want leaf", out)
	}
}

func benchmarkSymbolize(b *testing.B, p *process, fs []support.Frame, cached bool) {
	var out []libpf.Frame
	b.ResetTimer()
	for i := range b.N {
		if !cached {
			b.StopTimer()
			p.sym = newSymbolizer(p.sym.h.r, p.bin.layout, &p.bin.info.BytecodeSizes)
			b.StartTimer()
		}
		var err error
		if out, err = p.Symbolize(fs[i%len(fs)], out[:0]); err != nil {
			b.Fatal(err)
		}
	}
	// Frames one operation names: the inlined functions' and top's.
	b.ReportMetric(float64(len(out)), "named/op")
}

// BenchmarkSymbolize names one frame of a live node of each tested
// version per operation: top's optimized frame (at its call sites, leaf
// and mid inlined: three frames named) or leaf's interpreted one, with
// the process's caches empty ("new": its function, script, line ends and
// code read and decoded) or filled ("cached": the SharedFunctionInfo and
// code header read again to check they did not change).
func BenchmarkSymbolize(b *testing.B) {
	for _, v := range nodefetch.VersionsFor(runtime.GOARCH) {
		b.Run(v, func(b *testing.B) {
			node, err := nodefetch.Node(v)
			if err != nil {
				b.Fatal(err)
			}
			p, compiled, interpreted := liveFramesOf(b, node)
			for _, k := range []struct {
				name   string
				frames []support.Frame
			}{{"optimized", compiled}, {"interpreted", []support.Frame{interpreted}}} {
				symbench.Run(b, k.name, 1,
					func(b *testing.B) { benchmarkSymbolize(b, p, k.frames, false) },
					func(b *testing.B) { benchmarkSymbolize(b, p, k.frames, true) })
			}
		})
	}
}

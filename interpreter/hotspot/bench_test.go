package hotspot

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
)

// liveFrames is liveFramesOf the system's JDK 17.
func liveFrames(tb testing.TB, n int) (*symbolizer, []support.Frame, []support.Frame) {
	tb.Helper()
	return liveFramesOf(tb, jdkfetch.SystemJava, n)
}

// liveFramesOf starts the chain workload under java (busy until the test
// or benchmark ends) and returns a
// symbolizer of its JVM and, for up to n of its nmethods, the frames BPF
// would report: a compiled frame at a return address with debug
// information, and an interpreted frame of the nmethod's method at its
// first bytecode.
func liveFramesOf(tb testing.TB, java string, n int) (*symbolizer, []support.Frame, []support.Frame) {
	tb.Helper()
	j := startJVM(tb, java, "chain", 600)
	time.Sleep(2 * time.Second) // the JIT compiles the JDK's code it runs
	vs := readLive(tb, j)
	r := procmem.New(j.mem)
	version, err := readVersion(r, vs)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := NewLayout(vs, version)
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := readCodeCache(r, l)
	if err != nil {
		tb.Fatal(err)
	}
	s := newSymbolizer(r, l, cc)
	lengthField := vs.Fields["HeapBlock::Header::_length"]
	lengthOff := uint64(l.HeapBlockUsed) - uint64(vs.Fields["HeapBlock::Header::_used"].Offset) + lengthField.Offset
	var compiled, interpreted []support.Frame
	for _, h := range cc.Heaps {
		for b := h.Low; b < h.High && len(compiled) < n; {
			var length uint64
			if typeWidth(lengthField.Type) == 4 {
				v, err := r.U32(b + lengthOff)
				length = uint64(v)
				if err != nil {
					break
				}
			} else if length, err = r.U64(b + lengthOff); err != nil {
				break
			}
			if length == 0 {
				break
			}
			blob := b + uint64(l.HeapBlockSize)
			b += length << h.Log2Segment
			if used, _ := r.U8(blob - uint64(l.HeapBlockSize) + uint64(l.HeapBlockUsed)); used == 0 {
				continue
			}
			id, err := r.U32(blob + uint64(l.NM.CompileID))
			if err != nil || id == 0 || id >= 1<<29 {
				continue
			}
			info, err := s.nmethod(nmethodKey{blob, id})
			if err != nil || len(info.pcs) < int(l.NM.PcDescSize) {
				continue
			}
			// A PcDesc with a scope: its PC offset is a return address.
			for i := 0; i+int(l.NM.PcDescSize) <= len(info.pcs); i += int(l.NM.PcDescSize) {
				off := binary.LittleEndian.Uint32(info.pcs[i:])
				if int32(binary.LittleEndian.Uint32(info.pcs[i+4:])) > 0 {
					compiled = append(compiled, support.Frame{FileID: blob,
						Addr: frameCompiled<<frameTypeShift | uint64(id)<<32 | uint64(off)})
					break
				}
			}
			m, err := s.method(info.method)
			if err == nil && m.codeSize > 0 {
				interpreted = append(interpreted, support.Frame{FileID: info.method,
					Addr: m.constMethod + uint64(l.Method.ConstMethodSize)})
			}
		}
	}
	if len(compiled) == 0 || len(interpreted) == 0 {
		tb.Fatalf("found %d compiled and %d interpreted frames", len(compiled), len(interpreted))
	}
	return s, compiled, interpreted
}

func benchmarkSymbolize(b *testing.B, s *symbolizer, frames []support.Frame, cached bool) {
	var out []libpf.Frame
	b.ResetTimer()
	named := 0
	for i := range b.N {
		f := frames[i%len(frames)]
		if !cached {
			s.mu.Lock()
			clear(s.methods)
			clear(s.nmethods)
			s.nmethodBytes = 0
			s.mu.Unlock()
		}
		var err error
		out, err = s.symbolize(f, out[:0])
		if err == nil {
			named++
		}
	}
	b.StopTimer()
	if named < b.N*9/10 {
		b.Fatalf("%d of %d frames named", named, b.N)
	}
	// How many different frames the operations took in turn.
	b.ReportMetric(float64(len(frames)), "distinct")
}

// BenchmarkSymbolize names live frames of each tested JDK, compiled and
// interpreted ones (of up to 200 nmethods, taken in turn): "new" with
// empty caches (a frame never seen: its method's names and line table, an
// nmethod's debug information read from the JVM), "cached" with warm ones.
func BenchmarkSymbolize(b *testing.B) {
	for _, v := range jdkfetch.Versions() {
		// A sub-benchmark per JDK, whose busy JVM ends with it.
		b.Run(v, func(b *testing.B) {
			java, err := jdkfetch.Java(v)
			if err != nil {
				b.Fatal(err)
			}
			s, compiled, interpreted := liveFramesOf(b, java, 200)
			for _, k := range []struct {
				name   string
				frames []support.Frame
			}{{"compiled", compiled}, {"interpreted", interpreted}} {
				symbench.Run(b, k.name, 1,
					func(b *testing.B) { benchmarkSymbolize(b, s, k.frames, false) },
					func(b *testing.B) { benchmarkSymbolize(b, s, k.frames, true) })
			}
		})
	}
}

// TestSymbolizerMemory names every compiled and interpreted frame of up
// to 500 nmethods of a live JVM and logs what its caches then hold: the
// Go memory one JVM costs once its hot code has been named. The nmethod
// cache stays within its bound.
func TestSymbolizerMemory(t *testing.T) {
	s, compiled, interpreted := liveFrames(t, 500)
	// Empty caches, then the heap before and after naming every frame.
	s.mu.Lock()
	clear(s.methods)
	clear(s.nmethods)
	s.nmethodBytes = 0
	s.mu.Unlock()
	var out []libpf.Frame
	for _, f := range append(compiled, interpreted...) {
		out, _ = s.symbolize(f, out[:0])
	}
	// What the caches hold: strings, line tables and debug information,
	// plus a map entry and struct per method (about 100 bytes).
	methodBytes := 0
	for _, m := range s.methods {
		methodBytes += len(m.name) + len(m.file) + len(m.signature) + 8*len(m.lines) + 100
	}
	t.Logf("%d compiled and %d interpreted frames: %d methods cached in %d bytes, %d nmethods in %d bytes",
		len(compiled), len(interpreted), len(s.methods), methodBytes, len(s.nmethods), s.nmethodBytes)
	if s.nmethodBytes > maxNMethodBytes {
		t.Errorf("%d bytes of nmethod debug information cached, bound %d", s.nmethodBytes, maxNMethodBytes)
	}
}

// Package hotspot unwinds and names the Java frames of HotSpot JVMs
// (OpenJDK 8, and 11 and later) from the tables libjvm.so exports for
// debuggers: no agent, no JVM flag, and no offset table kept by hand.
// internals.md beside this file gathers the facts about HotSpot's
// structures and frames it relies on, with their sources.
package hotspot

import (
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_JVM of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate jvm

// Kind is the frame kind of Java frames.
const Kind = libpf.FrameKind(ID)

// Runtime is HotSpot as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "jvm",
	DisplayName:  "HotSpot JVM",
	ID:           ID,
	ConfigStruct: "jvm_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The tables are filled in while the JVM starts (0.1-0.3 s): until
	// then an attach fails with interpreter.ErrStarting and is tried
	// again at RetryMin.
	RetryMin: 20 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// Compiled code is freed and its address reused by other code; the
	// compile id in each frame tells them apart, but a cached trace would
	// not look.
	TraceRecheck: 10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// recognise finds HotSpot in libjvm.so by the tables it exports.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	if path.Base(f.Path) != "libjvm.so" {
		return nil, nil
	}
	syms, err := findTableSymbols(f.ELF)
	if errors.Is(err, ErrNotHotSpot) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// The BPF unwinder knows the frames of x86_64 and arm64 (internals.md
	// and its section "arm64").
	return &jvmBinary{syms: syms, cont: contSymbols(f.ELF), err: interpreter.CheckMachine("HotSpot", f)}, nil
}

// The statics that say where a virtual thread's frames return to when
// their callers are still frozen (JDK 19+): StubRoutines::_cont_returnBarrier,
// which no table exports, and ContinuationEntry::_return_pc, which JDK 25
// and later export. Builds that keep their symbol table (Debian's) name
// both there.
const (
	contBarrierName  = "_ZN12StubRoutines19_cont_returnBarrierE"
	contReturnPCName = "_ZN17ContinuationEntry10_return_pcE"
)

// contSymbols returns the file addresses of contBarrierName and
// contReturnPCName, zero where the file has no symbol table or not the
// symbol: then a virtual thread's stack ends where its frozen frames are.
func contSymbols(f *elf.File) contStatics {
	var c contStatics
	syms, err := f.Symbols()
	if err != nil {
		return c
	}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_OBJECT || s.Size != 8 {
			continue
		}
		switch s.Name {
		case contBarrierName:
			c.barrier = s.Value
		case contReturnPCName:
			c.returnPC = s.Value
		}
	}
	return c
}

// jvmBinary is a libjvm.so.
type jvmBinary struct {
	syms tableSymbols
	// cont are the file addresses of contBarrierName and
	// contReturnPCName, zero where unknown.
	cont contStatics
	err  error
}

// Version is known only once a process runs it.
func (b *jvmBinary) Version() string         { return "" }
func (b *jvmBinary) Unsupported() error      { return b.err }
func (b *jvmBinary) CodeRanges() [][2]uint64 { return nil }
func (b *jvmBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if b.err != nil {
		return nil, b.err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	r := procmem.New(mem)
	vs, err := readVMStructs(r, b.syms, h.Bias())
	if err != nil {
		return nil, fmt.Errorf("reading the JVM's vmStructs: %w", err)
	}
	version, err := readVersion(r, vs)
	if err != nil {
		return nil, err
	}
	l, err := NewLayout(vs, version)
	if err != nil {
		return nil, interpreter.Refuse("layout", err)
	}
	cc, err := readCodeCache(r, l)
	if err != nil {
		return nil, err
	}
	var cont contStatics
	if b.cont.barrier != 0 {
		cont.barrier = b.cont.barrier + h.Bias()
		cont.returnPC = l.ContReturnPC
		if cont.returnPC == 0 && b.cont.returnPC != 0 {
			cont.returnPC = b.cont.returnPC + h.Bias()
		}
	}
	cfg, err := unwinderProc(l, cc, cont)
	if err != nil {
		return nil, interpreter.Refuse("layout", err)
	}
	regions := make([]interpreter.Region, len(cc.Heaps))
	for i, hp := range cc.Heaps {
		regions[i] = interpreter.Region{Start: hp.Low, End: hp.High, Unwind: true}
	}
	if err := h.SetConfig(cfg); err != nil {
		return nil, err
	}
	if err := h.SetRegions(regions); err != nil {
		return nil, err
	}
	return &process{sym: newSymbolizer(r, l, cc)}, nil
}

// process is a JVM the unwinder was told of.
type process struct {
	sym *symbolizer
}

func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if p.sym == nil {
		return out, interpreter.ErrDetached
	}
	return p.sym.symbolize(f, out)
}

func (p *process) Detach() { p.sym = nil }

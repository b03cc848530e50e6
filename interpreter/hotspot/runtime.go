// Package hotspot unwinds and names the Java frames of HotSpot JVMs
// (OpenJDK 8, and 11 and later) from the tables libjvm.so exports for
// debuggers: no agent, no JVM flag, and no offset table kept by hand.
// internals.md beside this file gathers the facts about HotSpot's
// structures and frames it relies on, with their sources.
package hotspot

import (
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
	return &jvmBinary{syms: syms, err: interpreter.CheckMachine("HotSpot", f)}, nil
}

// jvmBinary is a libjvm.so.
type jvmBinary struct {
	syms tableSymbols
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
	cfg, err := unwinderProc(l, cc)
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

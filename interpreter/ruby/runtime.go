package ruby

import (
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_RUBY of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate ruby

// Kind is the frame kind of Ruby frames.
const Kind = libpf.FrameKind(ID)

// Runtime is CRuby as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "ruby",
	DisplayName:  "CRuby",
	ID:           ID,
	ConfigStruct: "ruby_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The unwinder reads the thread's execution context per sample: a
	// process can be described as soon as libruby is mapped.
	RetryMin: 50 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// Instruction sequences and method entries are garbage collected and
	// their addresses reused.
	TraceRecheck: 10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// UnwinderProc mirrors struct ruby_proc in support/ebpf/ruby.ebpf.c.
type UnwinderProc struct {
	TLSIndex      uint64
	TLSOffset     uint64
	EvalLoopStart uint64
	EvalLoopEnd   uint64
	TextStart     uint64
	TextEnd       uint64
	ECVMStack     uint16
	ECVMStackSize uint16
	ECCFP         uint16
	CFPSize       uint16
}

// unwinderCFP mirrors struct ruby_cfp: the fields of rb_control_frame_t
// the unwinder reads, where it reads them.
type unwinderCFP struct{ PC, SP, ISeq, Self, EP uint64 }

// readsLayout says whether the unwinder reads control frames where l has
// them.
func readsLayout(l *Layout) bool {
	var cf unwinderCFP
	return l.CFPPC == uint64(unsafe.Offsetof(cf.PC)) && l.CFPISeq == uint64(unsafe.Offsetof(cf.ISeq)) &&
		l.CFPEP == uint64(unsafe.Offsetof(cf.EP)) && l.CFPSize >= uint64(unsafe.Sizeof(cf))
}

// recognise finds CRuby by the symbols every 3.x exports.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	b, err := Detect(f.ELF, f.DynamicSymbols, f.FunctionRanges)
	if err == ErrNotRuby {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	layout, layoutErr := LayoutFor(b.Version)
	if layoutErr == nil && !readsLayout(layout) {
		layoutErr = fmt.Errorf("CRuby %v: control frames laid out as the unwinder does not read them", b.Version)
	}
	if err := interpreter.CheckMachine("CRuby", f); err != nil {
		layoutErr = err
	}
	return &rubyBinary{Binary: b, layout: layout, err: layoutErr}, nil
}

// rubyBinary is a libruby (or static ruby) as the interpreter interface
// sees it.
type rubyBinary struct {
	*Binary
	layout *Layout
	err    error
}

func (b *rubyBinary) Version() string         { return b.Binary.Version.String() }
func (b *rubyBinary) Unsupported() error      { return b.err }
func (b *rubyBinary) CodeRanges() [][2]uint64 { return append([][2]uint64{b.EvalLoop}, b.Exec...) }

// Attach describes the process to the unwinder, which finds each thread's
// execution context per sample.
func (b *rubyBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if b.err != nil {
		return nil, b.err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	bias := h.Bias()
	s, err := NewSymbolizer(mem, b.Binary.Version, bias+b.GlobalSymbols)
	if err != nil {
		return nil, err
	}
	l := b.layout
	tlsIndex := uint64(0) // local-exec TLS: none
	if b.TLSIndex != 0 {
		tlsIndex = bias + b.TLSIndex
	}
	if err := h.SetConfig(UnwinderProc{
		TLSIndex: tlsIndex, TLSOffset: b.TLSOffset, EvalLoopStart: b.EvalLoop[0], EvalLoopEnd: b.EvalLoop[1],
		TextStart: bias + b.Text[0], TextEnd: bias + b.Text[1],
		ECVMStack: uint16(l.ECVMStack), ECVMStackSize: uint16(l.ECVMStackSize), ECCFP: uint16(l.ECCFP),
		CFPSize: uint16(l.CFPSize),
	}); err != nil {
		return nil, err
	}
	p := &process{sym: s}
	if _, err := p.Update(h); err != nil {
		return nil, err
	}
	return p, nil
}

// process is an attached CRuby process.
type process struct {
	sym *Symbolizer
	// jit is the JIT code claimed.
	jit []interpreter.Region
}

// Update claims YJIT's code (internals.md §8) for the unwinder: a sample
// in it reports the Ruby frames that the JIT code runs from the thread's
// control frames. The areas are read with the inaccessible reserve YJIT's
// code grows into.
func (p *process) Update(h interpreter.Host) (bool, error) {
	ms, err := h.ReadMappings()
	if err != nil {
		return false, err
	}
	jit := jitAreas(ms)
	if slices.Equal(jit, p.jit) {
		return false, nil
	}
	if err := h.SetRegions(jit); err != nil {
		return false, err
	}
	p.jit = jit
	return false, nil
}

// Symbolize names a Ruby frame: a method entry or an instruction
// sequence at a pc.
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	rf, err := p.sym.Frame(f.FileID, f.Addr)
	if err != nil {
		return out, err
	}
	fr := libpf.Frame{Kind: Kind, FunctionName: rf.Function, SourceFile: rf.File}
	if rf.Line > 0 {
		fr.SourceLine = uint32(rf.Line)
	}
	return append(out, fr), nil
}

// Detach has nothing to release.
func (*process) Detach() {}

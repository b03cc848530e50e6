package perl

import (
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_PERL of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate perl

// Kind is the frame kind of Perl frames.
const Kind = libpf.FrameKind(ID)

// Runtime is Perl 5 as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "perl",
	DisplayName:  "Perl",
	ID:           ID,
	ConfigStruct: "perl_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The unwinder reads the thread's interpreter per sample: a process
	// can be described as soon as the interpreter is mapped.
	RetryMin: 50 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// CVs are freed (a sub redefined) and their addresses reused; a
	// string eval's statements are freed when it ends.
	TraceRecheck: 10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// UnwinderProc mirrors struct perl_proc in support/ebpf/perl.ebpf.c.
type UnwinderProc struct {
	ThrKeyAddr         uint64
	TSDSelfOffset      int64
	TSDBlockOffset     int64
	TSDDataOffset      int64
	TSDEntrySize       uint32
	TSDMaxKey          uint32
	TSDSelfDeref       uint8
	TSDBlockDeref      uint8
	_                  [2]uint8
	InterpCurcop       uint16
	InterpCurstackinfo uint16
}

// unwinderSI mirrors struct perl_si: struct stackinfo as the unwinder
// reads it.
type unwinderSI struct {
	Stack, Cxstack, Prev, Next uint64
	Cxix, Cxmax, Cxsubix, Type int32
}

// unwinderCX mirrors struct perl_cx: the start of struct context as the
// unwinder reads it.
type unwinderCX struct {
	Type, Gimme uint8
	U16         uint16
	_           uint32
	Oldsp       uint64
	Oldcop      uint64
	BlkU        [3]uint64
	Retop       uint64
	OldCxsubix  uint64
	OldNamesv   uint64
	CV          uint64
}

// unwinderContextStride is PERL_CX_STRIDE, sizeof(PERL_CONTEXT).
const unwinderContextStride = 104

// Frame tags of enum perl_frame_tag: a frame's file_id when it is not a
// sub's CV.
const (
	frameMain = 1
	frameEval = 0x100
)

// readsLayout says whether the unwinder reads run levels and contexts
// where l has them.
func readsLayout(l *Layout) bool {
	var si unwinderSI
	var cx unwinderCX
	return l.SICxstack == uint64(unsafe.Offsetof(si.Cxstack)) && l.SIPrev == uint64(unsafe.Offsetof(si.Prev)) &&
		l.SICxix == uint64(unsafe.Offsetof(si.Cxix)) && l.SICxmax == uint64(unsafe.Offsetof(si.Cxmax)) &&
		l.SIType == uint64(unsafe.Offsetof(si.Type)) && l.CXSize == unwinderContextStride &&
		l.CXType == uint64(unsafe.Offsetof(cx.Type)) && l.CXOldcop == uint64(unsafe.Offsetof(cx.Oldcop)) &&
		l.CXRetop == uint64(unsafe.Offsetof(cx.Retop)) && l.CXCV == uint64(unsafe.Offsetof(cx.CV)) &&
		l.InterpCurcop <= 0xffff && l.InterpCurstackinfo <= 0xffff
}

// recognise finds Perl by the symbols every Perl 5 exports.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	b, err := Detect(f.ELF, f.DynamicSymbols)
	if errors.Is(err, ErrNotPerl) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &perlBinary{Binary: b, err: b.check()}, nil
}

// check says why the unwinder cannot run this build here; nil when it can.
func (b *Binary) check() error { return b.checkFor(runtime.GOARCH) }

// checkFor is check for a build of arch (GOARCH).
func (b *Binary) checkFor(arch string) error {
	l, err := layoutFor(arch, b.Version)
	switch {
	case err != nil:
		return err
	case b.ThrKey == 0:
		return fmt.Errorf("perl %v: built without threads (no %s): its interpreter is not reached as the unwinder does", b.Version, thrKeySymbol)
	case l.InterpSize != 0 && b.InterpSize != l.InterpSize:
		return fmt.Errorf("perl %v: struct interpreter of %d bytes, the layout is of a build with %d (another configuration)",
			b.Version, b.InterpSize, l.InterpSize)
	case !readsLayout(l):
		return fmt.Errorf("perl %v: contexts laid out as the unwinder does not read them", b.Version)
	}
	return nil
}

// perlBinary is a libperl (or perl executable) as the interpreter
// interface sees it.
type perlBinary struct {
	*Binary
	err error
}

func (b *perlBinary) Version() string         { return b.Binary.Version.String() }
func (b *perlBinary) Unsupported() error      { return b.err }
func (b *perlBinary) CodeRanges() [][2]uint64 { return b.Runops }

// Attach describes the process to the unwinder, which finds each thread's
// interpreter per sample.
func (b *perlBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if b.err != nil {
		return nil, b.err
	}
	l, err := LayoutFor(b.Binary.Version)
	if err != nil {
		return nil, err
	}
	tsd, err := h.Libc()
	if err != nil {
		return nil, err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	s, err := NewSymbolizer(mem, b.Binary.Version)
	if err != nil {
		return nil, err
	}
	if err := h.SetConfig(UnwinderProc{
		ThrKeyAddr:    h.Bias() + b.ThrKey,
		TSDSelfOffset: tsd.SelfOffset, TSDBlockOffset: tsd.FirstBlockOffset, TSDDataOffset: tsd.DataOffset,
		TSDEntrySize: uint32(tsd.EntrySize), TSDMaxKey: tsd.MaxFastKey,
		TSDSelfDeref: boolByte(tsd.SelfDeref), TSDBlockDeref: boolByte(tsd.BlockDeref),
		InterpCurcop: uint16(l.InterpCurcop), InterpCurstackinfo: uint16(l.InterpCurstackinfo),
	}); err != nil {
		return nil, err
	}
	return &process{sym: s}, nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// process is an attached perl process.
type process struct{ sym *Symbolizer }

// Symbolize names a Perl frame: a sub's CV, main or an eval, each at a
// statement (COP).
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	pf, err := p.sym.Frame(f.FileID, f.Addr)
	if err != nil {
		return out, err
	}
	fr := libpf.Frame{Kind: Kind, FunctionName: pf.Function, SourceFile: pf.File}
	if pf.Line > 0 {
		fr.SourceLine = uint32(pf.Line)
	}
	return append(out, fr), nil
}

// Detach has nothing to release.
func (*process) Detach() {}

package python

import (
	"fmt"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_CPYTHON of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate cpython

// Kind is the frame kind of Python frames.
const Kind = libpf.FrameKind(ID)

// Runtime is CPython as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "cpython",
	DisplayName:  "CPython",
	ID:           ID,
	ConfigStruct: "python_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// A process is looked at again until it can be described to the
	// unwinder (its C library is not mapped yet, its memory could not be
	// opened).
	RetryMin: 50 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// A code object may be freed and its address reused by another with
	// the same offsets.
	TraceRecheck: 10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// recognise finds CPython by its eval loop's symbol, not by file name, so
// static and embedded builds (uwsgi) are found too.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	in, err := detect(f.ELF, f.DynamicSymbols, f.Symbols)
	if err != nil {
		return nil, nil // not CPython
	}
	return runtimeBinary{newBinary(f.ELF, in, f.FunctionRanges)}, nil
}

// runtimeBinary is a Binary as the interpreter interface sees it.
type runtimeBinary struct{ *Binary }

func (b runtimeBinary) Version() string {
	if b.Micro < 0 {
		return b.Interpreter.Version.MajorMinor()
	}
	return fmt.Sprintf("%v.%d", b.Interpreter.Version.MajorMinor(), b.Micro)
}

func (b runtimeBinary) Unsupported() error      { return b.Err }
func (b runtimeBinary) CodeRanges() [][2]uint64 { return b.EvalRanges }

// Attach describes the process to the unwinder: the interpreter need not
// have started, as the unwinder reads its thread state key per sample.
func (b runtimeBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	tsd, err := h.Libc()
	if err != nil {
		return nil, err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	p, err := b.NewProcess(mem, h.Bias(), *tsd)
	if err != nil {
		return nil, err
	}
	if err := h.SetConfig(p.Unwinder()); err != nil {
		return nil, err
	}
	return runtimeProcess{p}, nil
}

// runtimeProcess is a Process as the interpreter interface sees it.
type runtimeProcess struct{ *Process }

// Symbolize reads the code object a Python frame runs: its file_id is the
// object's address, its addr the instruction's byte offset.
func (p runtimeProcess) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	pf, err := p.Frame(f.FileID, uint32(f.Addr))
	if err != nil {
		return out, err
	}
	fr := libpf.Frame{Kind: Kind, FunctionName: pf.FunctionName, SourceFile: pf.FileName}
	if pf.Line > 0 {
		fr.SourceLine = uint32(pf.Line)
	}
	return append(out, fr), nil
}

// Detach has nothing to release: the symbolizer's cache goes with it.
func (runtimeProcess) Detach() {}

package php

import (
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_PHP of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate php

// Kind is the frame kind of PHP frames.
const Kind = libpf.FrameKind(ID)

// TierJIT is the tier of a frame that ran OPcache's JIT code when sampled.
const TierJIT = "JIT"

// Runtime is PHP as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "php",
	DisplayName:  "PHP",
	ID:           ID,
	ConfigStruct: "php_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The unwinder reads executor_globals per sample: a process can be
	// described as soon as the engine is mapped.
	RetryMin: 50 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// Without OPcache a request's functions are freed at its end and their
	// addresses reused by the next request's.
	TraceRecheck: 10 * time.Second,
	// OPcache maps its JIT buffer at start-up; php-fpm's workers inherit
	// it from the master.
	UpdateEvery: 30 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// UnwinderProc mirrors struct php_proc in support/ebpf/php.ebpf.c.
type UnwinderProc struct {
	CurrentExecuteData uint64
	JITReturn          uint64
	OpArrayOpcodes     uint16
	OpArrayLast        uint16
	OpArrayFilename    uint16
	BodyFrameRecord    uint16
}

// unwinderFunctionHead mirrors struct php_function_head.
type unwinderFunctionHead struct {
	Type         uint8
	ArgFlags     [3]uint8
	FnFlags      uint32
	FunctionName uint64
}

// unwinderExecuteData mirrors struct php_execute_data: the fields of
// zend_execute_data the unwinder reads, where it reads them (the same in
// every supported release).
type unwinderExecuteData struct {
	Opline, Call, ReturnValue, Func uint64
	This                            uint64
	ThisTypeInfo, ThisNumArgs       uint32
	PrevExecuteData                 uint64
}

// Where zend_execute_data keeps them (internals.md §3).
const (
	executeDataOpline = 0
	executeDataFunc   = 24
	executeDataPrev   = 48
)

// readsExecuteData says whether the unwinder reads frames where PHP keeps
// them.
func readsExecuteData() bool {
	var ed unwinderExecuteData
	var fn unwinderFunctionHead
	return unsafe.Offsetof(ed.Opline) == executeDataOpline && unsafe.Offsetof(ed.Func) == executeDataFunc &&
		unsafe.Offsetof(ed.PrevExecuteData) == executeDataPrev && unsafe.Offsetof(fn.Type) == functionType &&
		unsafe.Offsetof(fn.FunctionName) == functionName
}

// recognise finds a PHP engine by the symbols every PHP 8 exports.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	b, err := Detect(f.ELF, f.DynamicSymbols)
	if err == ErrNotPHP {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	layout, layoutErr := LayoutFor(b.Version)
	switch {
	case b.ThreadSafe:
		layoutErr = fmt.Errorf("PHP %v is a thread-safe (ZTS) build: not supported", b.Version)
	case !readsExecuteData():
		layoutErr = fmt.Errorf("PHP %v: frames laid out as the unwinder does not read them", b.Version)
	}
	if err := interpreter.CheckMachine("PHP", f); err != nil {
		layoutErr = err
	}
	return &phpBinary{Binary: b, layout: layout, err: layoutErr}, nil
}

// phpBinary is a PHP engine (CLI, php-fpm, libphp) as the interpreter
// interface sees it.
type phpBinary struct {
	*Binary
	layout *Layout
	err    error
}

func (b *phpBinary) Version() string         { return b.Binary.Version.String() }
func (b *phpBinary) Unsupported() error      { return b.err }
func (b *phpBinary) CodeRanges() [][2]uint64 { return [][2]uint64{b.ExecuteEx} }

// Attach describes the process to the unwinder.
func (b *phpBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if b.err != nil {
		return nil, b.err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	s, err := NewSymbolizer(mem, b.Binary.Version)
	if err != nil {
		return nil, err
	}
	bias := h.Bias()
	cfg := UnwinderProc{
		CurrentExecuteData: bias + b.ExecutorGlobals + b.layout.CurrentExecuteData,
		OpArrayOpcodes:     uint16(b.layout.OpArrayOpcodes),
		OpArrayLast:        uint16(b.layout.OpArrayLast),
		OpArrayFilename:    uint16(b.layout.OpArrayFilename),
		BodyFrameRecord:    uint16(b.BodyFrameRecord),
	}
	if b.JITReturn != 0 {
		cfg.JITReturn = bias + b.JITReturn
	}
	if err := h.SetConfig(cfg); err != nil {
		return nil, err
	}
	p := &process{sym: s}
	if _, err := p.Update(h); err != nil {
		return nil, err
	}
	return p, nil
}

// process is an attached PHP process.
type process struct {
	sym *Symbolizer
	// jit is the JIT code claimed.
	jit []interpreter.Region
}

// Update claims OPcache's JIT buffer (internals.md §7) for the unwinder:
// a sample in it reports the PHP frames of the execute_ex call the code
// runs in.
func (p *process) Update(h interpreter.Host) (bool, error) {
	// All mappings: the buffer is not executable while OPcache compiles.
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

// jitAreas are where OPcache's JIT code may run: its shared memory, which
// the kernel shows as a deleted /dev/zero, whose end OPcache makes
// executable as the JIT buffer. While it compiles, a non-thread-safe build
// has the buffer writable and not executable (zend_jit_unprotect,
// ext/opcache/jit/zend_jit.c), and the kernel merges it with the rest into
// one mapping: so the whole of each run of adjacent /dev/zero mappings is
// claimed, the same whether the buffer is executable when the maps are
// read or not (no PC falls in the data part).
func jitAreas(ms []interpreter.Mapping) []interpreter.Region {
	var out []interpreter.Region
	for _, m := range ms {
		if m.Path != "/dev/zero" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].End == m.Start {
			out[n-1].End = m.End
			continue
		}
		out = append(out, interpreter.Region{Start: m.Start, End: m.End, Unwind: true})
	}
	return out
}

// Symbolize names a PHP frame.
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	pf, err := p.sym.Frame(f.FileID, f.Addr)
	if err != nil {
		return out, err
	}
	fr := libpf.Frame{Kind: Kind, FunctionName: pf.Function, SourceFile: pf.File}
	if pf.Line > 0 {
		fr.SourceLine = uint32(pf.Line)
	}
	if pf.JIT {
		fr.Tier = TierJIT
	}
	return append(out, fr), nil
}

// Detach has nothing to release.
func (*process) Detach() {}

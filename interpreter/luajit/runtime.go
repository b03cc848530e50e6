package luajit

import (
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_LUAJIT of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate luajit

// Kind is the frame kind of Lua frames.
const Kind = libpf.FrameKind(ID)

// Runtime is LuaJIT as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "luajit",
	DisplayName:  "LuaJIT",
	ID:           ID,
	ConfigStruct: "luajit_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The VM's unwind entry is wrong in its subroutines and trace code
	// has none: the unwinder takes both over at the PC and goes on at the
	// VM's C frame.
	CodeRangesAtPC: true,
	// The unwinder finds each VM instance per sample: a process can be
	// described as soon as the VM is mapped.
	RetryMin: 50 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// Prototypes and traces are freed and their addresses reused.
	TraceRecheck: 10 * time.Second,
	// New machine-code areas are claimed when the process is looked at
	// again.
	UpdateEvery: 2 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// UnwinderProc mirrors struct luajit_proc in support/ebpf/luajit.ebpf.c.
type UnwinderProc struct {
	VMStart, VMEnd                            uint64
	GFromRegister                             int64
	GVMState, GCurL, GJITBase                 uint16
	LGlRef, LBase, LMaxStack, LStack, LCFrame uint16
	CFL, CFPC, CFPrev, CFSize                 uint16
	FnFFID, FnPC, ProtoSize                   uint16
	_                                         uint16
}

// unwinderProc is the unwinder's configuration for a build of layout l
// for machine m.
func unwinderProc(l *Layout, m elf.Machine) (UnwinderProc, error) {
	p := UnwinderProc{
		GVMState: uint16(l.Global.VMState), GCurL: uint16(l.Global.CurL), GJITBase: uint16(l.Global.JITBase),
		LGlRef: uint16(l.State.GlRef), LBase: uint16(l.State.Base), LMaxStack: uint16(l.State.MaxStack),
		LStack: uint16(l.State.Stack), LCFrame: uint16(l.State.CFrame),
		CFL: uint16(l.CFrame.L), CFPC: uint16(l.CFrame.PC), CFPrev: uint16(l.CFrame.Prev), CFSize: uint16(l.CFrame.Size),
		FnFFID: uint16(l.Func.FFID), FnPC: uint16(l.Func.PC), ProtoSize: uint16(l.Proto.Size),
	}
	switch m {
	case elf.EM_X86_64:
		// r14 is DISPATCH, inside GG_State.
		p.GFromRegister = int64(l.GGState.G) - int64(l.GGState.Dispatch)
	case elf.EM_AARCH64:
		// x22 is G.
	default:
		return p, fmt.Errorf("luajit: no unwinder for %v", m)
	}
	return p, nil
}

// recognise finds LuaJIT's VM in the luajit executable or libluajit.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	b, err := Detect(f)
	if errors.Is(err, ErrNotLuaJIT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &luajitBinary{b}, nil
}

// luajitBinary is a luajit executable or libluajit as the interpreter
// interface sees it.
type luajitBinary struct{ *Binary }

// CodeRanges is the VM: the unwinder takes it over at the PC.
func (b *luajitBinary) CodeRanges() [][2]uint64 { return [][2]uint64{b.VM} }

// Attach describes the build's layout to the unwinder, which finds each
// VM instance per sample.
func (b *luajitBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if err := b.Unsupported(); err != nil {
		return nil, err
	}
	cfg, err := unwinderProc(b.Layout, b.Machine)
	if err != nil {
		return nil, err
	}
	cfg.VMStart, cfg.VMEnd = b.VM[0]+h.Bias(), b.VM[1]+h.Bias()
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	if err := h.SetConfig(cfg); err != nil {
		return nil, err
	}
	p := &process{sym: NewSymbolizer(procmem.New(mem), b.Layout)}
	if _, err := p.Update(h); err != nil {
		return nil, err
	}
	return p, nil
}

// process is an attached LuaJIT process.
type process struct {
	sym *Symbolizer
	// regions are the machine-code areas claimed.
	regions []interpreter.Region
}

// Symbolize names a Lua frame or a trace frame.
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if p.sym == nil {
		return out, interpreter.ErrDetached
	}
	return p.sym.Frames(f.FileID, f.Addr, out)
}

// Update claims the process's machine-code areas: anonymous mappings
// laid out as a chain of LuaJIT's areas.
func (p *process) Update(h interpreter.Host) (bool, error) {
	if p.sym == nil {
		return false, interpreter.ErrDetached
	}
	// All mappings, not only executable ones: LuaJIT makes an area
	// writable while it adds or patches a trace and executable again
	// after (LUAJIT_SECURITY_MCODE); claimed either way, its traces are
	// unwound as soon as they run again.
	ms, err := h.ReadMappings()
	if err != nil {
		return false, err
	}
	var regions []interpreter.Region
	for _, m := range ms {
		if m.Anonymous() && !m.Inaccessible && p.sym.isMCodeArea(m.Start, m.End) {
			regions = append(regions, interpreter.Region{Start: m.Start, End: m.End, Unwind: true})
		}
	}
	if slices.Equal(regions, p.regions) {
		return false, nil
	}
	if err := h.SetRegions(regions); err != nil {
		return false, err
	}
	p.regions = regions
	return true, nil
}

// Detach drops the caches.
func (p *process) Detach() { p.sym = nil }

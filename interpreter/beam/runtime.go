package beam

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_BEAM of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate beam

// Kind is the frame kind of Erlang frames.
const Kind = libpf.FrameKind(ID)

// Runtime is the BEAM as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "beam",
	DisplayName:  "Erlang/OTP (BEAM)",
	ID:           ID,
	ConfigStruct: "beam_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The JIT maps its code when the emulator starts, before it loads the
	// first module.
	RetryMin: 100 * time.Millisecond,
	RetryMax: 30 * time.Second,
	// Modules are purged and their code's addresses reused by others.
	TraceRecheck: 10 * time.Second,
	UpdateEvery:  10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// UnwinderProc mirrors struct beam_proc in support/ebpf/beam.ebpf.c.
type UnwinderProc struct {
	CodeLo, CodeHi                         uint64
	ProcHtop, ProcStop, ProcHeap, ProcHend uint16
	EsdpRegisters, EsdpCurrent, EsdpScanLo uint16
	// Dirty schedulers: where the process is (ErtsSchedulerData's
	// current_process, struct process's i) and how to read the thread's
	// ErtsSchedulerData, pthread_getspecific(*SchedKeyAddr) done as
	// interpreter/libc's TSDLayout says; SchedKeyAddr 0: not unwound.
	DirtyCurrent, ProcI                          uint16
	_                                            [3]uint16
	SchedKeyAddr                                 uint64
	TSDSelfOffset, TSDBlockOffset, TSDDataOffset int64
	TSDEntrySize, TSDMaxKey                      uint32
	TSDSelfDeref, TSDBlockDeref                  uint8
	_                                            [6]uint8
}

// Offsets in struct process (erl_process.h) the unwinder reads, the same
// in OTP 27 and 29 (measured on Debian's amd64 builds, internals.md §2;
// arm64's LP64 struct is laid out alike, from the source).
const (
	procHtop = 0x50
	procStop = 0x58
	procHeap = 0xc0
	procHend = 0xc8
)

// Where the unwinder finds the current process from C code on x86_64
// (internals.md §2; measured on Debian's OTP 27 and 29 amd64 with gdb, in
// JIT code: rbx = the X registers, r13 = c_p): ErtsSchedulerData holds the
// start of its ErtsSchedulerRegisters (rbx - 0x40, the runtime stack the
// JIT's sp is in C code) at 0x440 and its current process at 0x4e8, and
// the scheduler's C stack holds a pointer to it at registers + 0x40a8
// (29) or + 0x40b8 (27): the unwinder reads the 32 words from +0x4040.
const (
	esdpRegisters = 0x440
	esdpCurrent   = 0x4e8
	esdpScanLo    = 0x4040
)

// otpOfERTS maps an ERTS major version to its OTP release, for the
// releases whose layout was checked (internals.md §5).
var otpOfERTS = map[int]int{15: 27, 17: 29}

// isBeamName says whether a file is the emulator: Debian and OTP's own
// install name the JIT build beam.smp (debug and other flavours carry a
// suffix and are not the builds checked).
func isBeamName(p string) bool { return path.Base(p) == "beam.smp" }

// recognise finds the emulator by its name and its ERTS version by its
// directory.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	if !isBeamName(f.Path) {
		return nil, nil
	}
	b := &beamBinary{}
	b.version, b.err = ERTSVersion(f.Path)
	if b.err != nil {
		return b, nil
	}
	major, _ := strconv.Atoi(strings.SplitN(b.version, ".", 2)[0])
	var ok bool
	if b.otp, ok = otpOfERTS[major]; !ok {
		// Each OTP release since 17 (ERTS 6) came with the next ERTS major.
		b.err = fmt.Errorf("beam: ERTS %s (OTP %d) is not OTP 27 or 29, the releases whose layouts the unwinder was checked on",
			b.version, major+12)
		return b, nil
	}
	if b.tables, b.err = FindTables(f.ELF); b.err != nil {
		b.err = fmt.Errorf("beam: ERTS %s (OTP %d): %w", b.version, b.otp, b.err)
		return b, nil
	}
	b.dirty, b.codeRanges = findDirtyRanges(f)
	return b, nil
}

// findDirtyRanges finds what unwinding dirty schedulers needs: their
// thread functions' ranges (the native unwinder hands over after stepping
// past them) and the scheduler data key. Without them dirty schedulers'
// samples keep their native frames only.
func findDirtyRanges(f *interpreter.File) (Dirty, [][2]uint64) {
	d, err := FindDirty(f.ELF)
	if err != nil || f.FunctionRanges == nil {
		return Dirty{}, nil
	}
	fns, err := f.FunctionRanges()
	if err != nil {
		return Dirty{}, nil
	}
	var out [][2]uint64
	for _, a := range d.ThreadFuncs {
		i := interpreter.FunctionAt(fns, a)
		if i < 0 || fns[i][0] != a {
			// The address is not a function's start: not the code the
			// signature meant.
			return Dirty{}, nil
		}
		out = append(out, fns[i])
	}
	return d, out
}

// beamBinary is a beam.smp.
type beamBinary struct {
	version string
	otp     int
	tables  Tables
	// dirty and codeRanges: the dirty schedulers' thread functions and
	// key; none where not found.
	dirty      Dirty
	codeRanges [][2]uint64
	// err says why the binary cannot be unwound.
	err error
}

func (b *beamBinary) Version() string { return b.version }

func (b *beamBinary) Unsupported() error {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return fmt.Errorf("BEAM frames are unwound on x86_64 and arm64 only, not %s", runtime.GOARCH)
	}
	return b.err
}

// CodeRanges are the dirty schedulers' thread functions, at the bottom of
// their threads' stacks: stepping past them, the native unwinder hands
// over to the unwinder, which adds the Erlang frames of the process the
// dirty scheduler runs. The rest of the emulator's C code is walked
// natively, its JIT code is claimed per process (Update).
func (b *beamBinary) CodeRanges() [][2]uint64 { return b.codeRanges }

func (b *beamBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if err := b.Unsupported(); err != nil {
		return nil, err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	p := &process{otp: b.otp, dirtyKey: b.dirty.SchedDataKey}
	if p.dirtyKey != 0 {
		p.dirtyKey += h.Bias()
	}
	p.names = newSymbolizer(mem, Tables{Ranges: b.tables.Ranges + h.Bias(), ActiveCodeIndex: b.tables.ActiveCodeIndex + h.Bias()}, b.otp)
	if _, err := p.Update(h); err != nil {
		return nil, err
	}
	return p, nil
}

// jitMappingName is the name of the memfd the JIT maps its code from
// twice, executable and writable (internals.md §1), with " (deleted)"
// dropped.
const jitMappingName = "/memfd:vmem"

// jitRegions are the executable views of the JIT's code: its memfd's
// executable view or, with +JMsingle (the code mapped once, writable and
// executable, in anonymous memory), the anonymous executable mapping that
// holds the code header of a loaded module, firstModule's answer (0 when
// none is known yet).
func jitRegions(ms []interpreter.Mapping, firstModule uint64) []interpreter.Region {
	var out []interpreter.Region
	for _, m := range ms {
		if m.Executable && strings.TrimSuffix(m.Path, " (deleted)") == jitMappingName {
			out = append(out, interpreter.Region{Start: m.Start, End: m.End, Unwind: true})
		}
	}
	if len(out) > 0 || firstModule == 0 {
		return out
	}
	for _, m := range ms {
		if m.Executable && m.Anonymous() && firstModule >= m.Start && firstModule < m.End {
			return []interpreter.Region{{Start: m.Start, End: m.End, Unwind: true}}
		}
	}
	return nil
}

// codeLocator is a frameNamer that also says where the JIT's code is: the
// code header of the first module in the active ranges table.
type codeLocator interface {
	firstModule() (uint64, error)
}

// sharedCodeName names the interrupted PC in the JIT's code shared by all
// modules (its fragments for calls to C, garbage collection, exits).
const sharedCodeName = "[BEAM JIT shared code]"

// frameNamer names a BEAM frame's PC: the symbolizer.
type frameNamer interface {
	frame(pc uint64, returnAddress bool) (libpf.Frame, error)
}

// process is an attached Erlang process.
type process struct {
	otp int
	// dirtyKey is the address of the scheduler data's pthread key, 0
	// where dirty schedulers are not unwound.
	dirtyKey uint64
	names    frameNamer
	// What the BPF unwinder was last told, and the regions claimed.
	cfg     UnwinderProc
	regions []interpreter.Region
}

// Update claims the JIT's code and describes it to the unwinder.
func (p *process) Update(h interpreter.Host) (bool, error) {
	if p.names == nil {
		return false, interpreter.ErrDetached
	}
	ms := h.Mappings()
	regions := jitRegions(ms, 0)
	if loc, ok := p.names.(codeLocator); ok && len(regions) == 0 {
		// +JMsingle: no memfd; the modules say which anonymous mapping
		// is the JIT's.
		if first, err := loc.firstModule(); err == nil {
			regions = jitRegions(ms, first)
		}
	}
	if len(regions) == 0 {
		return false, fmt.Errorf("beam: no executable %s mapping, nor an anonymous one holding modules: %w", jitMappingName, interpreter.ErrStarting)
	}
	// The unwinder tests CPs against one range: the JIT maps one
	// executable view of its code.
	cfg := UnwinderProc{CodeLo: regions[0].Start, CodeHi: regions[len(regions)-1].End,
		ProcHtop: procHtop, ProcStop: procStop, ProcHeap: procHeap, ProcHend: procHend}
	if runtime.GOARCH == "amd64" {
		cfg.EsdpRegisters, cfg.EsdpCurrent, cfg.EsdpScanLo = esdpRegisters, esdpCurrent, esdpScanLo
	}
	if p.dirtyKey != 0 {
		// Without the C library's layout (not mapped yet, or of a shape
		// not decoded) dirty schedulers stay native; tried again on the
		// next update.
		tsd, err := h.Libc()
		if err == nil && tsd != nil {
			cfg.DirtyCurrent, cfg.ProcI, cfg.SchedKeyAddr = esdpCurrentProcess, procI, p.dirtyKey
			cfg.TSDSelfOffset, cfg.TSDBlockOffset, cfg.TSDDataOffset = tsd.SelfOffset, tsd.FirstBlockOffset, tsd.DataOffset
			cfg.TSDEntrySize, cfg.TSDMaxKey = uint32(tsd.EntrySize), tsd.MaxFastKey
			cfg.TSDSelfDeref, cfg.TSDBlockDeref = boolByte(tsd.SelfDeref), boolByte(tsd.BlockDeref)
		}
	}
	changed := false
	if cfg != p.cfg {
		if err := h.SetConfig(cfg); err != nil {
			return false, err
		}
		p.cfg, changed = cfg, true
	}
	if !slices.Equal(regions, p.regions) {
		if err := h.SetRegions(regions); err != nil {
			return changed, err
		}
		p.regions, changed = regions, true
	}
	return changed, nil
}

// Symbolize names a BEAM frame: its PC (ReturnAddress set for the CPs of
// callers) in a module's JIT code.
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if p.names == nil {
		return out, interpreter.ErrDetached
	}
	fr, err := p.names.frame(f.Addr, f.ReturnAddress)
	switch {
	case errors.Is(err, errNoFunction):
		// The JIT's code shared by modules (where C code returns to, the
		// fragments it runs between module code and C code), or a word
		// on the Erlang stack that looked like a CP and is none (an
		// uninitialised Y register).
		fr = libpf.Frame{FunctionName: sharedCodeName, Address: f.Addr}
	case err != nil:
		return out, err
	}
	fr.Kind = Kind
	return append(out, fr), nil
}

func (p *process) Detach() { p.names = nil }

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

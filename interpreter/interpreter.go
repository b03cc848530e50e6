// Package interpreter is the plug-in interface of language runtimes and
// their registry. A runtime is one package, interpreter/<name>, that
// registers a Runtime from its init; interpreter/all imports them all. The
// process manager drives every runtime through this interface in stages:
//
//   - recognise: Runtime.Recognise looks at each mapped file once per file
//     (the result is cached with the file's data), Runtime.Detect at a
//     process whose runtime shows in no file (a symbol file it writes beside JIT code);
//   - attach: Binary.Attach reads the process (version, struct offsets) and
//     pushes the per-process configuration its BPF unwinder needs
//     (Host.SetConfig);
//   - claim code ranges: Binary.CodeRanges (an eval loop in the file) and
//     Host.SetRegions (JIT code in anonymous memory, at run time);
//   - symbolize: Process.Symbolize turns the runtime's BPF frames into
//     frames with function, file and line (inlined calls as frames of their
//     own); AddrSymbolizer names native frames in its regions;
//   - detach: Process.Detach, after which the host removes every BPF entry
//     it wrote for the process.
//
// The core (processmanager, tracer, reporter, cmd) names no runtime: it
// knows one by its Runtime value and its ID.
package interpreter

import (
	"debug/elf"
	"errors"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID is a runtime's BPF id (enum runtime_id in support/ebpf/runtimes.h,
// from which go generate writes each runtime package's constant): at once
// the frame kind of its frames, the tail-call slot of its BPF unwinder and
// its half of the key of its per-process configuration.
type ID uint8

// Kind is the frame kind of the runtime's frames.
func (id ID) Kind() libpf.FrameKind { return libpf.FrameKind(id) }

// Runtime describes a language runtime. Register it from the runtime
// package's init.
type Runtime struct {
	// Name is the -tracers choice and, where ID is set, names the BPF
	// program unwind_<Name> and is the OTLP profile.frame.type of its
	// frames (the OpenTelemetry semantic conventions' value).
	Name string
	// DisplayName is what ProcessInfo.RuntimeName says.
	DisplayName string
	// ID is the runtime's BPF id; 0 for a runtime without a BPF unwinder
	// of its own (its regions are walked with frame pointers).
	ID ID
	// ConfigStruct names the C struct of the per-process configuration of
	// its BPF unwinder, which ConfigMirror (a zero value) mirrors; the
	// tracer checks the two against the object's BTF.
	ConfigStruct string
	ConfigMirror any

	// Recognise finds the runtime in a mapped file: nil, nil when the
	// file holds none. It runs once per file; an error says the file is
	// the runtime's but unreadable (counted).
	Recognise func(f *File) (Binary, error)
	// Detect finds the runtime in a process whose files do not show it
	// (a symbol file it writes beside JIT code). It runs when the process's mappings
	// change; nil, nil when the process has none. Its Host has no Bias.
	Detect func(h Host) (Process, error)

	// CodeRangesAtPC says its Binary's CodeRanges are code its unwinder
	// takes over at the PC (code without unwind tables, such as a JIT's
	// builtins), not eval loops the native unwinder steps past first.
	CodeRangesAtPC bool

	// RetryMin and RetryMax pace attach attempts that failed: from
	// RetryMin, doubling up to RetryMax.
	RetryMin, RetryMax time.Duration
	// TraceRecheck, when set, is how long a converted trace with frames of
	// this runtime is served from the cache: the runtime's objects may be
	// freed and their addresses reused.
	TraceRecheck time.Duration
	// UpdateEvery, when set, is how often a sampled process's Updater
	// looks again even though nothing asked it to (code freed and its
	// addresses reused under another name).
	UpdateEvery time.Duration
}

// FunctionAt is the index of the range of functions, File.FunctionRanges's
// ranges (sorted by start), that holds addr, or -1.
func FunctionAt(functions [][2]uint64, addr uint64) int {
	i, found := slices.BinarySearchFunc(functions, addr, func(r [2]uint64, a uint64) int {
		switch {
		case r[1] <= a:
			return -1
		case r[0] > a:
			return 1
		}
		return 0
	})
	if !found {
		return -1
	}
	return i
}

// CacheStats counts how a runtime's symbolizer cache answered: for its
// tests and benchmarks.
type CacheStats struct {
	// Hits were answered from the cache after one read of the object
	// confirmed it was still the one cached.
	Hits uint64
	// Misses read an object: not cached, or Stale.
	Misses uint64
	// Stale counts cached entries found to be for another object (the
	// cached one was freed and its address reused) and replaced.
	Stale uint64
	// Evictions made room for newer entries.
	Evictions uint64
}

// File is a mapped file as Recognise sees it.
type File struct {
	// Path is the file's path as the process that maps it names it.
	Path string
	ELF  *elf.File
	// FunctionRanges lists the ranges of the file's FDEs
	// (nativeunwind.FunctionRanges), read on first call.
	FunctionRanges func() ([][2]uint64, error)
	// DynamicSymbols and Symbols are the file's .dynsym and .symtab,
	// read once for every runtime (and the daemon's own symbol table):
	// reading a large library's costs megabytes of allocations. Their
	// names share one string per table (nativeunwind.ReadSymbols): a
	// runtime that keeps a name clones it.
	DynamicSymbols, Symbols []elf.Symbol
}

// Binary is a runtime found in a file, with what every process running it
// shares.
type Binary interface {
	// Version is the runtime's release as it states it ("3.12.1").
	Version() string
	// Unsupported says why processes of this binary can never be unwound
	// (a version without struct offsets, a debug build); nil when they can.
	Unsupported() error
	// CodeRanges are file address ranges [start, end) of the runtime's
	// eval loop: the native unwinder hands each of its frames to the
	// runtime's BPF unwinder after stepping past it (or, where the
	// Runtime's CodeRangesAtPC is set, at its PC, in every mapping of the
	// file that maps the range).
	CodeRanges() [][2]uint64
	// Attach describes a process that maps the binary to the runtime's
	// BPF unwinder. An error is retried, paced by RetryMin and RetryMax.
	Attach(h Host) (Process, error)
}

// Process is a process a runtime attached to.
type Process interface {
	// Symbolize appends the frames one BPF frame of the runtime stands
	// for, innermost first (inlined calls as frames of their own). On an
	// error it appends nothing.
	Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error)
	// Detach releases what the process holds in Go; the host removes its
	// BPF entries. It may be called once, after which nothing else is.
	Detach()
}

// AddrSymbolizer is a Process that names native frames in the regions it
// claimed (JIT code walked with frame pointers).
type AddrSymbolizer interface {
	// SymbolizeAddr names the code at a process address, false if unknown.
	SymbolizeAddr(addr uint64) (libpf.Frame, bool)
}

// Updater is a Process that wants to look again when its process's
// mappings changed, when a sample met code it claimed but could not name,
// and now and then (Runtime.UpdateEvery) while the process is sampled.
type Updater interface {
	// Update reports whether what the process names changed: traces
	// converted before are converted again.
	Update(h Host) (changed bool, err error)
}

// Host is the process manager's side of one process and one runtime.
type Host interface {
	// PID is the process in the daemon's pid namespace.
	PID() libpf.PID
	// Memory reads the process's memory.
	Memory() (io.ReaderAt, error)
	// Bias is the load bias of the file the Binary was found in: process
	// address minus file virtual address.
	Bias() uint64
	// Libc says where the process's C library keeps thread-specific data.
	Libc() (*libc.TSDLayout, error)
	// SetConfig writes the runtime's per-process configuration for its
	// BPF unwinder: a value of the Runtime's ConfigMirror type.
	SetConfig(v any) error
	// SetRegions replaces the code ranges the runtime claims in the
	// process.
	SetRegions(rs []Region) error
	// Mappings lists the process's executable mappings, anonymous ones
	// included, sorted by address.
	Mappings() []Mapping
	// ReadMappings reads all the process's mappings now, readable,
	// writable and inaccessible ones too, sorted by address: for code
	// areas reserved inaccessible and made executable as they fill.
	ReadMappings() ([]Mapping, error)
	// Root is the process's root directory as the daemon reaches it
	// (/proc/PID/root).
	Root() string
	// NamespacePID is the process's pid in its own pid namespace (the pid
	// it names its own files after).
	NamespacePID() (uint32, error)
}

// Region is process code a runtime claims: [Start, End).
type Region struct {
	Start, End uint64
	// Unwind hands frames at PCs in the region to the runtime's BPF
	// unwinder; otherwise the native unwinder walks them with frame
	// pointers and the runtime names them (AddrSymbolizer).
	Unwind bool
}

// Mapping is one mapping of a process.
type Mapping struct {
	Start, End uint64
	// Offset is where in the file the mapping starts.
	Offset uint64
	// Path is empty for anonymous memory.
	Path string
	// Executable: code may run there. Inaccessible: mapped with no
	// access at all (PROT_NONE), as reserves and guard pages are.
	Executable, Inaccessible bool
}

// Anonymous says whether the mapping is anonymous memory (JIT code),
// which the runtime may have named (PR_SET_VMA_ANON_NAME shows
// "[anon:NAME]").
func (m Mapping) Anonymous() bool { return m.Path == "" || strings.HasPrefix(m.Path, "[anon:") }

// ErrStarting says the runtime has not finished starting in the process:
// what an attach reads is not filled in yet. The process manager tries
// again after RetryMin, without backing off, up to StartingTries times;
// Attach wraps it.
var ErrStarting = errors.New("the runtime is still starting")

// StartingTries bounds the attach attempts at RetryMin that ErrStarting
// buys one runtime in one process.
const StartingTries = 25

// ErrDetached says a Process was used after Detach.
var ErrDetached = errors.New("runtime process detached")

// RefusedError says a runtime refuses a process for good: what it would
// read is hostile or broken (a symlink out of the process's root, a file
// too large). The process manager counts Reason and does not retry.
type RefusedError struct {
	Reason string
	Err    error
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// Refuse wraps err as a RefusedError with reason.
func Refuse(reason string, err error) error { return &RefusedError{Reason: reason, Err: err} }

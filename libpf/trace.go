package libpf

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// MaxFrames is the most frames one trace holds, kernel and user together.
// BPF's copy of this limit is MAX_FRAMES in support/ebpf/types.h; a test
// checks they agree.
const MaxFrames = 256

// FrameKind says which unwinder produced a frame and so how to read it.
type FrameKind uint8

const (
	FrameUnknown FrameKind = iota
	FrameNative
	FrameKernel
	// FrameAbort marks where an unwinder gave up; its Address carries the
	// unwind_error code of the failure (support/ebpf/types.h).
	FrameAbort
	// FirstRuntimeKind is the first kind of a language runtime's frames:
	// a runtime's frames have its id as their kind (package interpreter),
	// and FunctionName, SourceFile and SourceLine say what they run; they
	// have no Mapping.
	FirstRuntimeKind
)

// runtimeKinds names the runtimes' frame kinds, registered at start.
var runtimeKinds sync.Map // FrameKind -> string

// RegisterFrameKind names the frames of a runtime: name is their OTLP
// profile.frame.type. Package interpreter's registry calls it.
func RegisterFrameKind(k FrameKind, name string) {
	if k < FirstRuntimeKind {
		panic(fmt.Sprintf("libpf: frame kind %d is the core's", k))
	}
	if old, loaded := runtimeKinds.LoadOrStore(k, name); loaded && old != name {
		panic(fmt.Sprintf("libpf: frame kind %d is %s already", k, old))
	}
}

// IsRuntime says whether the kind is a language runtime's.
func (k FrameKind) IsRuntime() bool { return k >= FirstRuntimeKind }

// String is the OTLP profile.frame.type value of the kind.
func (k FrameKind) String() string {
	switch k {
	case FrameNative:
		return "native"
	case FrameKernel:
		return "kernel"
	case FrameAbort:
		return "abort-marker"
	}
	if name, ok := runtimeKinds.Load(k); ok {
		return name.(string)
	}
	return "unknown"
}

// TraceHash is the 128-bit user-space hash of a whole trace (all frames, user
// and kernel, plus the process the user addresses belong to).
type TraceHash struct{ Hi, Lo uint64 }

// Bytes is the hash as 16 big-endian bytes (Hi first): the stack-trace id
// sent to APM agents and exported on samples linked to a trace.
func (h TraceHash) Bytes() [16]byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], h.Hi)
	binary.BigEndian.PutUint64(b[8:], h.Lo)
	return b
}

// Mapping is a file mapped into a process, as a frame refers to it.
type Mapping struct {
	FileID FileID
	// Start and End bound the mapping in the process's address space;
	// FileOffset is the file offset mapped at Start.
	Start, End, FileOffset uint64
	// Bias is added to a file-relative (ELF virtual) address to get the
	// address in the process.
	Bias uint64
	// Path is the file's path as the process sees it (or "[vdso]", the
	// kernel module name, "vmlinux").
	Path string
	// GNUBuildID and GoBuildID are the build ids found in the file, if any.
	GNUBuildID, GoBuildID string
}

// Frame is one symbolized (or symbolizable) frame of a trace.
type Frame struct {
	Kind FrameKind
	// Address is file-relative: the ELF virtual address for native code, the
	// address in the kernel image or module for kernel frames. For return
	// addresses it already points inside the call instruction.
	Address uint64
	// Mapping is nil when the address could not be attributed to a file.
	Mapping *Mapping
	// FunctionName, SourceFile and SourceLine are empty/zero when unknown.
	FunctionName string
	SourceFile   string
	SourceLine   uint32
	// SourceColumn is the column in SourceLine, from 1, where the runtime
	// says (JavaScript); zero otherwise.
	SourceColumn uint32
	// SystemName is the function's name as the linker or runtime spells
	// it where that differs from FunctionName (a Java method with its
	// descriptor, "pkg.Class.m(J)J"); empty otherwise.
	SystemName string
	// Inlined says the compiler inlined the frame's function into the next
	// frame's (outward): they ran in one machine frame.
	Inlined bool
	// Tier is how a runtime ran the frame's code where it says, in the
	// runtime's words (Java: "interpreted", "C1", "C2").
	Tier string
}

// AbsAddress is the frame's address in the process (or kernel) address space.
func (f *Frame) AbsAddress() uint64 {
	if f.Mapping == nil {
		return f.Address
	}
	return f.Address + f.Mapping.Bias
}

// HashTrace computes the 128-bit trace hash of pid's frames: xxh3 over
// each frame's kind, file id and address. User frames without a file id
// have process-specific addresses, so the pid is mixed in for them; kernel
// addresses are the same in every process. Runtime frames are what they
// run: function, file and line, the same in every process. A truncated
// trace differs from a complete one of the same frames. buf is scratch
// space, returned for reuse.
func HashTrace(buf []byte, pid uint32, frames []Frame, truncated bool) (TraceHash, []byte) {
	buf = buf[:0]
	for i := range frames {
		f := &frames[i]
		if f.Kind.IsRuntime() {
			buf = append(buf, byte(f.Kind))
			buf = append(buf, f.FunctionName...)
			buf = append(buf, 0)
			buf = append(buf, f.SourceFile...)
			buf = append(buf, 0)
			buf = binary.LittleEndian.AppendUint32(buf, f.SourceLine)
			continue
		}
		var id FileID
		if f.Mapping != nil {
			id = f.Mapping.FileID
		}
		buf = append(buf, byte(f.Kind))
		buf = append(buf, id[:]...)
		buf = binary.LittleEndian.AppendUint64(buf, f.Address)
		if id.IsZero() && f.Kind != FrameKernel {
			buf = binary.LittleEndian.AppendUint32(buf, pid)
		}
	}
	if truncated {
		buf = append(buf, 1)
	}
	h := xxh3.Hash128(buf)
	return TraceHash{Hi: h.Hi, Lo: h.Lo}, buf
}

// Trace is a converted stack trace. It is immutable once built and shared by
// every sample that has the same stack; Frames[0] is the leaf.
type Trace struct {
	Hash   TraceHash
	Frames []Frame
	// Truncated is set when the stack was deeper than MaxFrames.
	Truncated bool
}

// ProcessInfo describes the process a sample was taken in.
type ProcessInfo struct {
	PID            PID
	ExecutableName string
	ExecutablePath string
	// ContainerID is empty outside containers; PodUID outside Kubernetes
	// pods.
	ContainerID, PodUID string
	// PodName, Namespace and ContainerName are the container's Kubernetes
	// names, as the node's container runtime gives them.
	PodName, Namespace, ContainerName string
	// RuntimeName and RuntimeVersion name the language runtime the process
	// runs, as the runtime names itself, and its release; empty for native
	// programs.
	RuntimeName, RuntimeVersion string
	// ServiceName, ServiceVersion and DeploymentEnvironment are what the
	// process's OpenTelemetry process context or APM agent publishes;
	// empty without one.
	ServiceName, ServiceVersion, DeploymentEnvironment string
	// Resource are the resource attributes of the process's OpenTelemetry
	// process context (values as strings).
	Resource Labels
	// AttributeKeys is the key table of the process's OpenTelemetry
	// thread contexts (OTEP 4947): a record's attribute keys are
	// indexes into it. Shared, not to be changed.
	AttributeKeys *[]string
	// Before, when set, is the info of samples taken before Since
	// (CLOCK_MONOTONIC ns, the samples' clock): the process published a
	// change at a known time, and samples taken before it may be
	// converted after it was read. One step back only.
	Before *ProcessInfo
	Since  uint64
}

// At is the info of a sample taken at ktime (CLOCK_MONOTONIC ns).
func (p *ProcessInfo) At(ktime uint64) *ProcessInfo {
	if p != nil && p.Before != nil && ktime < p.Since {
		return p.Before
	}
	return p
}

// SampleMeta is what is specific to one sample of a trace.
type SampleMeta struct {
	Time       time.Time
	TID        TID
	ThreadName string
	CPU        int
	Process    *ProcessInfo
	// APM is the APM trace the thread was in, if its process has an APM
	// agent that published one (package tracecorr).
	APM APMContext
	// Labels are the labels of the work the thread did: its goroutine's
	// pprof labels, or the attributes of its OpenTelemetry thread context.
	Labels Labels
	// Span is the OpenTelemetry span the thread was in (its thread
	// context, OTEP 4947).
	Span SpanContext
	// OffCPU is, for a sample taken as the thread left the CPU to wait,
	// how long it waited (Time is when it began); zero for a CPU sample.
	OffCPU time.Duration
}

// SpanContext identifies the OpenTelemetry span a sample was taken in.
type SpanContext struct {
	Valid   bool
	TraceID [16]byte
	SpanID  [8]byte
}

// APMContext identifies the distributed trace a sample was taken in.
type APMContext struct {
	// Valid is set when the thread was in a trace.
	Valid         bool
	TraceID       [16]byte
	SpanID        [8]byte
	TransactionID [8]byte
}

// PID is a process id (thread-group id).
type PID uint32

// TID is a thread id.
type TID uint32

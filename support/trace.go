package support

import (
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Trace is a raw trace as the BPF unwinder hands it to user space, decoded
// from struct trace in ebpf/types.h.
type Trace struct {
	PID, TID uint32
	CPU      uint32
	// KTime is the sample's CLOCK_MONOTONIC time in nanoseconds.
	KTime uint64
	// Comm is the thread's name.
	Comm string
	// Hash is the 64-bit BPF trace hash over PID, kernel and user frames.
	Hash uint64
	// Truncated is set when the stack had more than MaxFrames frames.
	Truncated bool
	// OffCPU says the trace was taken as the thread left the CPU to wait
	// (KTime is when), not by a sample; Waited is how long it waited, once
	// known (the tracer joins the trace with the wait's end).
	OffCPU bool
	Waited time.Duration
	// KernelStack holds kernel return addresses, leaf first.
	KernelStack []uint64
	// Frames holds user-space frames, leaf first.
	Frames []Frame
	// APM is the APM trace the thread was in (not part of Hash).
	APM libpf.APMContext
	// Labels are the labels of the work the thread did (a goroutine's),
	// at most MaxLabels; LabelsCut says it had more. Not part of Hash.
	Labels    []libpf.Label
	LabelsCut bool
	// Span is the OpenTelemetry span the thread was in (its thread
	// context, OTEP 4947), and ContextAttrs the attributes the context
	// set, keyed by index (not part of Hash).
	Span         libpf.SpanContext
	ContextAttrs []ContextAttr
}

// MaxLabels is the most labels a trace carries (MAX_LABELS in
// ebpf/types.h; ReadShared checks the object's).
const MaxLabels = 10

// WakesEarly says whether BPF woke the events reader early for the trace
// (unwind_stop's trace_urgent): it has runtime frames or an APM trace
// context, and user space owes it a short delay.
func (t *Trace) WakesEarly() bool {
	if t.APM.Valid {
		return true
	}
	for i := range t.Frames {
		if t.Frames[i].Kind.IsRuntime() {
			return true
		}
	}
	return false
}

// Frame is one user-space frame as BPF found it.
type Frame struct {
	Kind libpf.FrameKind
	// ReturnAddress is set for every frame but the interrupted one: Addr is
	// then the address after a call instruction.
	ReturnAddress bool
	// FileID is the low 64 bits of the file id when BPF resolved the frame
	// to a file (later unwinders); zero when Addr is a process address.
	FileID uint64
	// Addr is the process address, or the file-relative address when FileID
	// is set, or the error code for FrameAbort.
	Addr uint64
}

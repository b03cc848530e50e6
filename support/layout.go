package support

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Shared holds what user space needs to know about the BPF object, read from
// its BTF: enum values by name and the layout of the records BPF emits.
type Shared struct {
	// Programs are the core's tail-call targets: program name -> progs
	// map index.
	Programs map[string]uint32
	// Runtimes are the runtimes the object has an unwinder for: name (of
	// RUNTIME_<NAME>, lower case) -> id. Runtime <name>'s program is
	// unwind_<name>, its tail-call slot its id.
	Runtimes map[string]uint8
	// Metrics are the counter names, indexed by metric id.
	Metrics []string
	// RuntimeMetrics are the runtimes' counter names, by index in the
	// runtime_metrics map (id * RuntimeMetricsPerRuntime + counter).
	RuntimeMetrics map[uint32]string
	// DeltaPageBits: a delta page covers 1 << DeltaPageBits addresses.
	DeltaPageBits uint
	// RuleFlagRASigned is enum unwind_rule_flag's UNWIND_RULE_RA_SIGNED.
	RuleFlagRASigned uint8
	// RuleFlagStackSwitch is UNWIND_RULE_STACK_SWITCH.
	RuleFlagStackSwitch uint8

	trace traceLayout
	types *btf.Spec
	// runtimeLimit is RUNTIME_MAX.
	runtimeLimit uint64
}

// RuntimeMetricsPerRuntime is RUNTIME_METRICS_MAX: the counters each
// runtime has in the runtime_metrics map.
const RuntimeMetricsPerRuntime = 16

// RuntimeProgram names the BPF unwinder of a runtime.
func RuntimeProgram(name string) string { return "unwind_" + name }

// traceLayout holds byte offsets of struct trace and struct frame fields.
type traceLayout struct {
	typ, pid, tid, cpu, ktime, hash, comm, flags, numKernelFrames, numFrames, frames int
	frameSize, frameFileID, frameAddr, frameKind, frameFlags                         int
	maxFrames                                                                        int
	eventTrace, eventProcessExit, eventProcessExec, eventUnknownPC                   uint32
	processEventPID                                                                  int
	eventExecMapped                                                                  uint32
	// processEventAddr is struct process_event's addr.
	processEventAddr int
	// exec* are struct exec_event's offsets and size.
	execPID, execDev, execIno, execEventSize int
	// mmap* are struct mmap_event's offsets and size.
	mmapStart, mmapEnd, mmapPgoff, mmapDev, mmapIno, mmapEventSize int
	flagTruncated, frameFlagReturn                                 uint8
	// apm is struct trace's apm; flagAPM is TRACE_FLAG_APM_CONTEXT.
	apm     int
	flagAPM uint8
	// numLabels is struct trace's num_labels; label* are struct label's
	// size, offsets and room (key and value arrays' lengths);
	// flagLabelsCut is TRACE_FLAG_LABELS_CUT, labelKeyIndex
	// LABEL_KEY_INDEX.
	numLabels, labelSize, labelKeyLen, labelValueLen, labelKey, labelValue, labelFlags int
	labelKeyMax, labelValueMax                                                         int
	flagLabelsCut, labelKeyIndex                                                       uint8
	// flagSpan is TRACE_FLAG_SPAN_CONTEXT: apm holds a span's ids.
	flagSpan uint8
	// flagOffCPU is TRACE_FLAG_OFF_CPU; offCPUEnd* are struct
	// off_cpu_end's offsets and size, of EVENT_OFF_CPU_END.
	flagOffCPU                                                                   uint8
	eventOffCPUEnd                                                               uint32
	offCPUEndPID, offCPUEndTID, offCPUEndStart, offCPUEndDuration, offCPUEndSize int
}

// ReadShared extracts the shared definitions from the object's BTF and checks
// them against what the Go side assumes.
func ReadShared(spec *ebpf.CollectionSpec) (*Shared, error) {
	s := &Shared{Programs: map[string]uint32{}, types: spec.Types}
	progs, err := enumValues(spec.Types, "prog_id")
	if err != nil {
		return nil, err
	}
	for name, v := range progs {
		if name == "PROG_COUNT" {
			continue
		}
		s.Programs[strings.ToLower(strings.TrimPrefix(name, "PROG_"))] = uint32(v)
	}
	if err := s.readMetrics(); err != nil {
		return nil, err
	}
	if err := s.trace.read(spec.Types); err != nil {
		return nil, err
	}
	if err := checkFrameKinds(spec.Types); err != nil {
		return nil, err
	}
	if err := checkMirrors(spec.Types); err != nil {
		return nil, err
	}
	if err := s.readRuntimes(); err != nil {
		return nil, err
	}
	if err := checkRuntimeMetricSlots(spec, s.runtimeLimit); err != nil {
		return nil, err
	}
	if err := s.readDeltaLayout(); err != nil {
		return nil, err
	}
	return s, nil
}

// readMetrics reads the counters' names from enum metric_id.
func (s *Shared) readMetrics() error {
	r := &btfReader{types: s.types}
	metrics := r.enum("metric_id")
	count := metrics.value("METRIC_COUNT")
	if err := r.err(); err != nil {
		return err
	}
	s.Metrics = make([]string, count)
	for name, v := range metrics.values {
		if name == "METRIC_COUNT" {
			continue
		}
		if v >= count {
			return fmt.Errorf("BPF metric %s=%d is not below METRIC_COUNT=%d", name, v, count)
		}
		s.Metrics[v] = strings.ToLower(strings.TrimPrefix(name, "METRIC_"))
	}
	return nil
}

// readDeltaLayout reads the stack delta layout and rule flags.
func (s *Shared) readDeltaLayout() error {
	r := &btfReader{types: s.types}
	layout, flags := r.enum("delta_layout"), r.enum("unwind_rule_flag")
	s.DeltaPageBits = uint(layout.value("DELTA_PAGE_BITS"))
	perSlot := layout.value("DELTAS_PER_SLOT")
	s.RuleFlagRASigned = uint8(flags.value("UNWIND_RULE_RA_SIGNED"))
	s.RuleFlagStackSwitch = uint8(flags.value("UNWIND_RULE_STACK_SWITCH"))
	if err := r.err(); err != nil {
		return err
	}
	if perSlot != uint64(len(DeltaSlot{})) {
		return fmt.Errorf("BPF object stores %d deltas per slot, the Go mirror %d", perSlot, len(DeltaSlot{}))
	}
	if s.RuleFlagRASigned == 0 || s.RuleFlagStackSwitch == 0 {
		return fmt.Errorf("BPF object's enum unwind_rule_flag has a zero flag: %v", flags.values)
	}
	return nil
}

func enumValues(types *btf.Spec, name string) (map[string]uint64, error) {
	var e *btf.Enum
	if err := types.TypeByName(name, &e); err != nil {
		return nil, fmt.Errorf("BPF object lacks enum %s: %w", name, err)
	}
	values := make(map[string]uint64, len(e.Values))
	for _, v := range e.Values {
		values[v.Name] = v.Value
	}
	return values, nil
}

// btfReader reads structs and enums of the object's BTF member by member.
// Whatever it does not find is an error naming it, not 0, which is also a
// struct's first member's offset and many an enum's first value; err
// reports them all at once.
type btfReader struct {
	types *btf.Spec
	errs  []error
}

// missing reports something not found, once however often it was read.
func (r *btfReader) missing(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	for _, e := range r.errs {
		if e.Error() == err.Error() {
			return
		}
	}
	r.errs = append(r.errs, err)
}

func (r *btfReader) err() error { return errors.Join(r.errs...) }

// structMembers are the members of a struct, by name; empty for a struct
// the object lacks (reported once, not per member).
type structMembers struct {
	r      *btfReader
	name   string
	size   int
	byName map[string]btf.Member
}

func (r *btfReader) structure(name string) *structMembers {
	s := &structMembers{r: r, name: name}
	var st *btf.Struct
	if err := r.types.TypeByName(name, &st); err != nil {
		r.missing("BPF object lacks struct %s: %w", name, err)
		return s
	}
	s.size, s.byName = int(st.Size), make(map[string]btf.Member, len(st.Members))
	for _, m := range st.Members {
		s.byName[m.Name] = m
	}
	return s
}

// offset is a member's byte offset.
func (s *structMembers) offset(member string) int {
	m, ok := s.byName[member]
	if !ok && s.byName != nil {
		s.r.missing("BPF struct %s lacks member %s", s.name, member)
	}
	return int(m.Offset.Bytes())
}

// arrayLen is the length of an array member.
func (s *structMembers) arrayLen(member string) int {
	m, ok := s.byName[member]
	if !ok {
		s.offset(member) // reports it
		return 0
	}
	arr, ok := m.Type.(*btf.Array)
	if !ok {
		s.r.missing("BPF struct %s's member %s is not an array", s.name, member)
		return 0
	}
	return int(arr.Nelems)
}

// enumMembers are the values of an enum, by name; empty for an enum the
// object lacks (reported once).
type enumMembers struct {
	r      *btfReader
	name   string
	values map[string]uint64
}

func (r *btfReader) enum(name string) *enumMembers {
	values, err := enumValues(r.types, name)
	if err != nil {
		r.errs = append(r.errs, err)
	}
	return &enumMembers{r: r, name: name, values: values}
}

func (e *enumMembers) value(name string) uint64 {
	v, ok := e.values[name]
	if !ok && e.values != nil {
		e.r.missing("BPF enum %s lacks %s", e.name, name)
	}
	return v
}

// checkFrameKinds makes sure BPF's frame kinds are libpf's, no more and no
// fewer.
func checkFrameKinds(types *btf.Spec) error {
	r := &btfReader{types: types}
	kinds := r.enum("frame_kind")
	want := map[string]libpf.FrameKind{
		"FRAME_KIND_UNKNOWN": libpf.FrameUnknown,
		"FRAME_KIND_NATIVE":  libpf.FrameNative,
		"FRAME_KIND_KERNEL":  libpf.FrameKernel,
		"FRAME_KIND_ABORT":   libpf.FrameAbort,
	}
	for name := range want {
		kinds.value(name)
	}
	for name, v := range kinds.values {
		if k, ok := want[name]; !ok || uint64(k) != v {
			r.missing("BPF frame kind %s=%d has no libpf equivalent", name, v)
		}
	}
	return r.err()
}

// readRuntimes reads the runtime registry of the object (enum runtime_id)
// and each runtime's counters (its enum <name>_metric).
func (s *Shared) readRuntimes() error {
	r := &btfReader{types: s.types}
	enum := r.enum("runtime_id")
	ids, first, limit := enum.values, enum.value("RUNTIME_FIRST"), enum.value("RUNTIME_MAX")
	if err := r.err(); err != nil {
		return err
	}
	if first != uint64(libpf.FirstRuntimeKind) || limit <= first {
		return fmt.Errorf("BPF enum runtime_id starts at %d (libpf: %d), ends at %d", first, libpf.FirstRuntimeKind, limit)
	}
	s.runtimeLimit = limit
	s.Runtimes = map[string]uint8{}
	s.RuntimeMetrics = map[uint32]string{}
	for cname, id := range ids {
		if cname == "RUNTIME_FIRST" || cname == "RUNTIME_MAX" {
			continue
		}
		if id < first || id >= limit {
			return fmt.Errorf("BPF runtime %s has id %d, outside [%d, %d)", cname, id, first, limit)
		}
		name := strings.ToLower(strings.TrimPrefix(cname, "RUNTIME_"))
		s.Runtimes[name] = uint8(id)
		metrics, err := enumValues(s.types, name+"_metric")
		if err != nil {
			return fmt.Errorf("runtime %s: %w", name, err)
		}
		for mname, v := range metrics {
			if strings.HasSuffix(mname, "_COUNT") {
				continue
			}
			if v >= RuntimeMetricsPerRuntime {
				return fmt.Errorf("runtime %s: counter %s=%d beyond %d", name, mname, v, RuntimeMetricsPerRuntime)
			}
			s.RuntimeMetrics[uint32(id)*RuntimeMetricsPerRuntime+uint32(v)] = strings.ToLower(strings.TrimPrefix(mname, "METRIC_"))
		}
	}
	return nil
}

// checkRuntimeMetricSlots checks RuntimeMetricsPerRuntime against the C
// side's RUNTIME_METRICS_MAX, which BTF does not keep (a #define): the
// runtime_metrics map holds that many counters per runtime id below
// RUNTIME_MAX.
func checkRuntimeMetricSlots(spec *ebpf.CollectionSpec, runtimeLimit uint64) error {
	m, ok := spec.Maps["runtime_metrics"]
	if !ok {
		return errors.New("BPF object lacks map runtime_metrics")
	}
	if want := runtimeLimit * RuntimeMetricsPerRuntime; uint64(m.MaxEntries) != want {
		return fmt.Errorf("BPF map runtime_metrics holds %d counters, want RUNTIME_MAX (%d) × %d: "+
			"RUNTIME_METRICS_MAX is not RuntimeMetricsPerRuntime", m.MaxEntries, runtimeLimit, RuntimeMetricsPerRuntime)
	}
	return nil
}

func (l *traceLayout) read(types *btf.Spec) error {
	r := &btfReader{types: types}
	t, f, pe := r.structure("trace"), r.structure("frame"), r.structure("process_event")
	xe, me, lb := r.structure("exec_event"), r.structure("mmap_event"), r.structure("label")
	events, traceFlags, frameFlags := r.enum("event_type"), r.enum("trace_flag"), r.enum("frame_flag")
	labelFlags, oe := r.enum("label_flag"), r.structure("off_cpu_end")
	*l = traceLayout{
		typ: t.offset("type"), pid: t.offset("pid"), tid: t.offset("tid"), cpu: t.offset("cpu"),
		ktime: t.offset("ktime"), hash: t.offset("hash"), comm: t.offset("comm"), flags: t.offset("flags"),
		numKernelFrames: t.offset("num_kernel_frames"), numFrames: t.offset("num_frames"),
		frames: t.offset("frames"), maxFrames: t.arrayLen("frames"), apm: t.offset("apm"),
		numLabels: t.offset("num_labels"), labelSize: lb.size, labelKeyLen: lb.offset("key_len"),
		labelValueLen: lb.offset("value_len"), labelKey: lb.offset("key"), labelValue: lb.offset("value"),
		labelFlags:  lb.offset("flags"),
		labelKeyMax: lb.arrayLen("key"), labelValueMax: lb.arrayLen("value"),
		frameSize: f.size, frameFileID: f.offset("file_id"), frameAddr: f.offset("addr"),
		frameKind: f.offset("kind"), frameFlags: f.offset("flags"),
		processEventPID: pe.offset("pid"), processEventAddr: pe.offset("addr"),
		execPID: xe.offset("pid"), execDev: xe.offset("dev"), execIno: xe.offset("ino"), execEventSize: xe.size,
		mmapStart: me.offset("start"), mmapEnd: me.offset("end"), mmapPgoff: me.offset("pgoff"),
		mmapDev: me.offset("dev"), mmapIno: me.offset("ino"), mmapEventSize: me.size,
		eventTrace:       uint32(events.value("EVENT_TRACE")),
		eventProcessExit: uint32(events.value("EVENT_PROCESS_EXIT")),
		eventProcessExec: uint32(events.value("EVENT_PROCESS_EXEC")),
		eventUnknownPC:   uint32(events.value("EVENT_UNKNOWN_PC")),
		eventExecMapped:  uint32(events.value("EVENT_EXEC_MAPPED")),
		flagTruncated:    uint8(traceFlags.value("TRACE_FLAG_TRUNCATED")),
		flagAPM:          uint8(traceFlags.value("TRACE_FLAG_APM_CONTEXT")),
		flagLabelsCut:    uint8(traceFlags.value("TRACE_FLAG_LABELS_CUT")),
		flagSpan:         uint8(traceFlags.value("TRACE_FLAG_SPAN_CONTEXT")),
		labelKeyIndex:    uint8(labelFlags.value("LABEL_KEY_INDEX")),
		flagOffCPU:       uint8(traceFlags.value("TRACE_FLAG_OFF_CPU")),
		eventOffCPUEnd:   uint32(events.value("EVENT_OFF_CPU_END")),
		offCPUEndPID:     oe.offset("pid"), offCPUEndTID: oe.offset("tid"), offCPUEndStart: oe.offset("start"),
		offCPUEndDuration: oe.offset("duration"), offCPUEndSize: oe.size,
		frameFlagReturn: uint8(frameFlags.value("FRAME_FLAG_RETURN_ADDRESS")),
	}
	if err := r.err(); err != nil {
		return err
	}
	if n := r.structure("record").arrayLen("labels_room"); r.err() == nil && n != MaxLabels {
		return fmt.Errorf("BPF MAX_LABELS is %d, support.MaxLabels is %d", n, MaxLabels)
	}
	if err := r.err(); err != nil {
		return err
	}
	if l.maxFrames != libpf.MaxFrames {
		return fmt.Errorf("BPF MAX_FRAMES is %d, libpf.MaxFrames is %d", l.maxFrames, libpf.MaxFrames)
	}
	// DecodeEvent tells records apart by type and tests flags: a zero
	// would match every record or none.
	if l.eventTrace == 0 || l.eventProcessExit == 0 || l.eventProcessExec == 0 || l.eventUnknownPC == 0 ||
		l.eventExecMapped == 0 || l.flagTruncated == 0 || l.frameFlagReturn == 0 || l.flagAPM == 0 ||
		l.flagLabelsCut == 0 || l.flagSpan == 0 || l.labelKeyIndex == 0 || l.flagOffCPU == 0 ||
		l.eventOffCPUEnd == 0 {
		return errors.New("BPF object has a zero event type, trace flag or frame flag")
	}
	return nil
}

// EventKind says what an Event is.
type EventKind uint8

const (
	EventTrace EventKind = iota
	// EventProcessExit: the process PID exited.
	EventProcessExit
	// EventProcessExec: PID replaced its image; all its mappings changed.
	EventProcessExec
	// EventUnknownPC: a PC of PID was in no mapping loaded into BPF: a new
	// process or new code whose mappings should be read.
	EventUnknownPC
	// EventExecMapped: PID mapped a file executable (Event.Mapping).
	EventExecMapped
	// EventOffCPUEnd: thread TID of PID, whose off-CPU trace has KTime
	// Start, waited Duration.
	EventOffCPUEnd
)

// ExecMapping is a new executable file mapping: [Start, End) maps the file
// Dev/Ino (user-space device encoding, as in /proc/PID/maps) from byte
// Offset on.
type ExecMapping struct {
	Start, End, Offset uint64
	Dev, Ino           uint64
}

// Event is one decoded record of the events ring buffer.
type Event struct {
	Kind EventKind
	// Trace is set for EventTrace.
	Trace *Trace
	// PID is the process of the other kinds.
	PID libpf.PID
	// Mapping is set for EventExecMapped.
	Mapping ExecMapping
	// Program is, for EventProcessExec, the file the process now runs
	// (zero if BPF could not read it).
	Program FileKey
	// Addr is, for EventUnknownPC, the PC (0: a runtime's code ran where
	// it was not described to BPF).
	Addr uint64
	// TID, Start and Duration are set for EventOffCPUEnd.
	TID      uint32
	Start    uint64
	Duration time.Duration
}

// ErrMalformedEvent is returned for records that do not decode.
var ErrMalformedEvent = errors.New("malformed BPF event")

// DecodeEvent decodes one record of the events ring buffer. trace is reused
// as the destination of a trace record to avoid allocating per sample.
func (s *Shared) DecodeEvent(raw []byte, trace *Trace) (Event, error) {
	l := &s.trace
	if len(raw) < l.processEventPID+4 {
		return Event{}, fmt.Errorf("%w: %d bytes", ErrMalformedEvent, len(raw))
	}
	le := binary.LittleEndian
	switch le.Uint32(raw[l.typ:]) {
	case l.eventProcessExit:
		return Event{Kind: EventProcessExit, PID: libpf.PID(le.Uint32(raw[l.processEventPID:]))}, nil
	case l.eventProcessExec:
		return s.decodeExec(raw)
	case l.eventUnknownPC:
		if len(raw) < l.processEventAddr+8 {
			return Event{}, fmt.Errorf("%w: unknown-PC event of %d bytes", ErrMalformedEvent, len(raw))
		}
		return Event{Kind: EventUnknownPC, PID: libpf.PID(le.Uint32(raw[l.processEventPID:])),
			Addr: le.Uint64(raw[l.processEventAddr:])}, nil
	case l.eventExecMapped:
		return s.decodeExecMapped(raw)
	case l.eventOffCPUEnd:
		if len(raw) < l.offCPUEndSize {
			return Event{}, fmt.Errorf("%w: off-CPU end of %d bytes", ErrMalformedEvent, len(raw))
		}
		return Event{Kind: EventOffCPUEnd, PID: libpf.PID(le.Uint32(raw[l.offCPUEndPID:])),
			TID: le.Uint32(raw[l.offCPUEndTID:]), Start: le.Uint64(raw[l.offCPUEndStart:]),
			Duration: time.Duration(le.Uint64(raw[l.offCPUEndDuration:]))}, nil
	case l.eventTrace:
	default:
		return Event{}, fmt.Errorf("%w: type %d", ErrMalformedEvent, le.Uint32(raw))
	}
	if len(raw) < l.frames {
		return Event{}, fmt.Errorf("%w: trace header of %d bytes", ErrMalformedEvent, len(raw))
	}
	n := int(le.Uint32(raw[l.numFrames:]))
	nk := int(le.Uint32(raw[l.numKernelFrames:]))
	nl := int(le.Uint32(raw[l.numLabels:]))
	if n > l.maxFrames || nk > n || nl > MaxLabels || len(raw) < l.frames+n*l.frameSize+nl*l.labelSize {
		return Event{}, fmt.Errorf("%w: %d frames (%d kernel) and %d labels in %d bytes",
			ErrMalformedEvent, n, nk, nl, len(raw))
	}
	trace.PID = le.Uint32(raw[l.pid:])
	trace.TID = le.Uint32(raw[l.tid:])
	trace.CPU = le.Uint32(raw[l.cpu:])
	trace.KTime = le.Uint64(raw[l.ktime:])
	trace.Hash = le.Uint64(raw[l.hash:])
	trace.Comm = cString(raw[l.comm : l.comm+16])
	trace.Truncated = raw[l.flags]&l.flagTruncated != 0
	trace.OffCPU = raw[l.flags]&l.flagOffCPU != 0
	trace.Waited = 0
	trace.APM = libpf.APMContext{Valid: raw[l.flags]&l.flagAPM != 0}
	if trace.APM.Valid {
		a := raw[l.apm:]
		copy(trace.APM.TraceID[:], a)
		copy(trace.APM.SpanID[:], a[16:])
		copy(trace.APM.TransactionID[:], a[24:])
	}
	trace.Span = libpf.SpanContext{Valid: raw[l.flags]&l.flagSpan != 0}
	if trace.Span.Valid {
		copy(trace.Span.TraceID[:], raw[l.apm:])
		copy(trace.Span.SpanID[:], raw[l.apm+16:])
	}
	trace.LabelsCut = raw[l.flags]&l.flagLabelsCut != 0
	trace.Labels, trace.ContextAttrs = trace.Labels[:0], trace.ContextAttrs[:0]
	for i := range nl {
		b := raw[l.frames+n*l.frameSize+i*l.labelSize:]
		label := l.decodeLabel(b)
		if b[l.labelFlags]&l.labelKeyIndex != 0 {
			trace.ContextAttrs = append(trace.ContextAttrs, ContextAttr{Key: b[l.labelKey], Value: label.Value})
			continue
		}
		trace.Labels = append(trace.Labels, label)
	}
	trace.KernelStack = trace.KernelStack[:0]
	trace.Frames = trace.Frames[:0]
	for i := range n {
		f := raw[l.frames+i*l.frameSize:]
		if i < nk {
			trace.KernelStack = append(trace.KernelStack, le.Uint64(f[l.frameAddr:]))
			continue
		}
		trace.Frames = append(trace.Frames, Frame{
			Kind:          libpf.FrameKind(f[l.frameKind]),
			ReturnAddress: f[l.frameFlags]&l.frameFlagReturn != 0,
			FileID:        le.Uint64(f[l.frameFileID:]),
			Addr:          le.Uint64(f[l.frameAddr:]),
		})
	}
	return Event{Kind: EventTrace, Trace: trace}, nil
}

// decodeLabel decodes a struct label; lengths beyond the room are cut to
// it.
func (l *traceLayout) decodeLabel(b []byte) libpf.Label {
	kn := min(int(b[l.labelKeyLen]), l.labelKeyMax)
	vn := min(int(b[l.labelValueLen]), l.labelValueMax)
	return libpf.Label{Key: string(b[l.labelKey : l.labelKey+kn]), Value: string(b[l.labelValue : l.labelValue+vn])}
}

// RecordIsTrace says, without decoding it, whether a record is a trace.
func (s *Shared) RecordIsTrace(raw []byte) bool {
	return len(raw) >= s.trace.typ+4 && binary.LittleEndian.Uint32(raw[s.trace.typ:]) == s.trace.eventTrace
}

// RecordWakesEarly says, without decoding it, whether a record is a trace
// that WakesEarly: the events reader polls sooner while they come.
func (s *Shared) RecordWakesEarly(raw []byte) bool {
	l := &s.trace
	le := binary.LittleEndian
	if len(raw) < l.frames || le.Uint32(raw[l.typ:]) != l.eventTrace {
		return false
	}
	if raw[l.flags]&l.flagAPM != 0 {
		return true
	}
	n := min(int(le.Uint32(raw[l.numFrames:])), (len(raw)-l.frames)/l.frameSize)
	for i := int(le.Uint32(raw[l.numKernelFrames:])); i < n; i++ {
		if libpf.FrameKind(raw[l.frames+i*l.frameSize+l.frameKind]).IsRuntime() {
			return true
		}
	}
	return false
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// pageSize is what vm_pgoff counts in.
var pageSize = uint64(os.Getpagesize())

func (s *Shared) decodeExec(raw []byte) (Event, error) {
	l := &s.trace
	if len(raw) < l.execEventSize {
		return Event{}, fmt.Errorf("%w: exec event of %d bytes", ErrMalformedEvent, len(raw))
	}
	le := binary.LittleEndian
	return Event{Kind: EventProcessExec, PID: libpf.PID(le.Uint32(raw[l.execPID:])),
		Program: FileKey{Dev: le.Uint64(raw[l.execDev:]), Ino: le.Uint64(raw[l.execIno:])}}, nil
}

func (s *Shared) decodeExecMapped(raw []byte) (Event, error) {
	l := &s.trace
	if len(raw) < l.mmapEventSize {
		return Event{}, fmt.Errorf("%w: mapping event of %d bytes", ErrMalformedEvent, len(raw))
	}
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(raw[off:]) }
	dev := u64(l.mmapDev)
	m := ExecMapping{
		Start: u64(l.mmapStart), End: u64(l.mmapEnd), Offset: u64(l.mmapPgoff) * pageSize,
		Dev: unix.Mkdev(uint32(dev>>20), uint32(dev&(1<<20-1))), Ino: u64(l.mmapIno),
	}
	if m.End <= m.Start {
		return Event{}, fmt.Errorf("%w: mapping [%#x, %#x)", ErrMalformedEvent, m.Start, m.End)
	}
	return Event{Kind: EventExecMapped, PID: libpf.PID(binary.LittleEndian.Uint32(raw[l.processEventPID:])), Mapping: m}, nil
}

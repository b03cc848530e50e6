package support

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"strings"

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
	// execEvent are struct exec_event's offsets and size.
	execEvent     map[string]int
	execEventSize int
	// mmapEvent are struct mmap_event's offsets and size.
	mmapEvent                      map[string]int
	mmapEventSize                  int
	flagTruncated, frameFlagReturn uint8
	// apm is struct trace's apm; flagAPM is TRACE_FLAG_APM_CONTEXT.
	apm     int
	flagAPM uint8
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
	metrics, err := enumValues(spec.Types, "metric_id")
	if err != nil {
		return nil, err
	}
	s.Metrics = make([]string, metrics["METRIC_COUNT"])
	for name, v := range metrics {
		if name != "METRIC_COUNT" {
			s.Metrics[v] = strings.ToLower(strings.TrimPrefix(name, "METRIC_"))
		}
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
	layout, err := enumValues(spec.Types, "delta_layout")
	if err != nil {
		return nil, err
	}
	s.DeltaPageBits = uint(layout["DELTA_PAGE_BITS"])
	if n := layout["DELTAS_PER_SLOT"]; n != uint64(len(DeltaSlot{})) {
		return nil, fmt.Errorf("BPF object stores %d deltas per slot, the Go mirror %d", n, len(DeltaSlot{}))
	}
	flags, err := enumValues(spec.Types, "unwind_rule_flag")
	if err != nil {
		return nil, err
	}
	s.RuleFlagRASigned = uint8(flags["UNWIND_RULE_RA_SIGNED"])
	s.RuleFlagStackSwitch = uint8(flags["UNWIND_RULE_STACK_SWITCH"])
	if s.RuleFlagRASigned == 0 || s.RuleFlagStackSwitch == 0 {
		return nil, fmt.Errorf("BPF object's enum unwind_rule_flag lacks a flag: %v", flags)
	}
	return s, nil
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

// checkFrameKinds makes sure BPF's frame kinds are libpf's.
func checkFrameKinds(types *btf.Spec) error {
	kinds, err := enumValues(types, "frame_kind")
	if err != nil {
		return err
	}
	want := map[string]libpf.FrameKind{
		"FRAME_KIND_UNKNOWN": libpf.FrameUnknown,
		"FRAME_KIND_NATIVE":  libpf.FrameNative,
		"FRAME_KIND_KERNEL":  libpf.FrameKernel,
		"FRAME_KIND_ABORT":   libpf.FrameAbort,
	}
	for name, v := range kinds {
		if k, ok := want[name]; !ok || uint64(k) != v {
			return fmt.Errorf("BPF frame kind %s=%d has no libpf equivalent", name, v)
		}
	}
	return nil
}

// readRuntimes reads the runtime registry of the object (enum runtime_id)
// and each runtime's counters (its enum <name>_metric).
func (s *Shared) readRuntimes() error {
	ids, err := enumValues(s.types, "runtime_id")
	if err != nil {
		return err
	}
	first, limit := ids["RUNTIME_FIRST"], ids["RUNTIME_MAX"]
	if first != uint64(libpf.FirstRuntimeKind) || limit == 0 {
		return fmt.Errorf("BPF enum runtime_id starts at %d (libpf: %d), ends at %d", first, libpf.FirstRuntimeKind, limit)
	}
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

func memberOffsets(types *btf.Spec, name string) (map[string]int, *btf.Struct, error) {
	var st *btf.Struct
	if err := types.TypeByName(name, &st); err != nil {
		return nil, nil, fmt.Errorf("BPF object lacks struct %s: %w", name, err)
	}
	offsets := make(map[string]int, len(st.Members))
	for _, m := range st.Members {
		offsets[m.Name] = int(m.Offset.Bytes())
	}
	return offsets, st, nil
}

func (l *traceLayout) read(types *btf.Spec) error {
	t, st, err := memberOffsets(types, "trace")
	if err != nil {
		return err
	}
	f, fst, err := memberOffsets(types, "frame")
	if err != nil {
		return err
	}
	*l = traceLayout{
		typ: t["type"], pid: t["pid"], tid: t["tid"], cpu: t["cpu"], ktime: t["ktime"],
		hash: t["hash"], comm: t["comm"], flags: t["flags"],
		numKernelFrames: t["num_kernel_frames"], numFrames: t["num_frames"], frames: t["frames"], apm: t["apm"],
		frameSize: int(fst.Size), frameFileID: f["file_id"], frameAddr: f["addr"],
		frameKind: f["kind"], frameFlags: f["flags"],
	}
	for _, m := range st.Members {
		if arr, ok := m.Type.(*btf.Array); ok && m.Name == "frames" {
			l.maxFrames = int(arr.Nelems)
		}
	}
	if l.maxFrames != libpf.MaxFrames {
		return fmt.Errorf("BPF MAX_FRAMES is %d, libpf.MaxFrames is %d", l.maxFrames, libpf.MaxFrames)
	}
	pe, _, err := memberOffsets(types, "process_event")
	if err != nil {
		return err
	}
	l.processEventPID = pe["pid"]
	if _, ok := pe["addr"]; !ok {
		return errors.New("BPF struct process_event lacks addr")
	}
	l.processEventAddr = pe["addr"]
	xe, xst, err := memberOffsets(types, "exec_event")
	if err != nil {
		return err
	}
	for _, field := range []string{"pid", "dev", "ino"} {
		if _, ok := xe[field]; !ok {
			return fmt.Errorf("BPF struct exec_event lacks %s", field)
		}
	}
	l.execEvent, l.execEventSize = xe, int(xst.Size)
	me, mst, err := memberOffsets(types, "mmap_event")
	if err != nil {
		return err
	}
	for _, field := range []string{"start", "end", "pgoff", "dev", "ino"} {
		if _, ok := me[field]; !ok {
			return fmt.Errorf("BPF struct mmap_event lacks %s", field)
		}
	}
	l.mmapEvent, l.mmapEventSize = me, int(mst.Size)
	events, err := enumValues(types, "event_type")
	if err != nil {
		return err
	}
	l.eventTrace = uint32(events["EVENT_TRACE"])
	l.eventProcessExit = uint32(events["EVENT_PROCESS_EXIT"])
	l.eventProcessExec = uint32(events["EVENT_PROCESS_EXEC"])
	l.eventUnknownPC = uint32(events["EVENT_UNKNOWN_PC"])
	l.eventExecMapped = uint32(events["EVENT_EXEC_MAPPED"])
	traceFlags, err := enumValues(types, "trace_flag")
	if err != nil {
		return err
	}
	l.flagTruncated = uint8(traceFlags["TRACE_FLAG_TRUNCATED"])
	l.flagAPM = uint8(traceFlags["TRACE_FLAG_APM_CONTEXT"])
	frameFlags, err := enumValues(types, "frame_flag")
	if err != nil {
		return err
	}
	l.frameFlagReturn = uint8(frameFlags["FRAME_FLAG_RETURN_ADDRESS"])
	if l.eventTrace == 0 || l.eventProcessExit == 0 || l.eventProcessExec == 0 || l.eventUnknownPC == 0 ||
		l.eventExecMapped == 0 || l.flagTruncated == 0 || l.frameFlagReturn == 0 || l.flagAPM == 0 || l.apm == 0 {
		return errors.New("BPF object lacks event, trace flag or frame flag values")
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
	case l.eventTrace:
	default:
		return Event{}, fmt.Errorf("%w: type %d", ErrMalformedEvent, le.Uint32(raw))
	}
	if len(raw) < l.frames {
		return Event{}, fmt.Errorf("%w: trace header of %d bytes", ErrMalformedEvent, len(raw))
	}
	n := int(le.Uint32(raw[l.numFrames:]))
	nk := int(le.Uint32(raw[l.numKernelFrames:]))
	if n > l.maxFrames || nk > n || len(raw) < l.frames+n*l.frameSize {
		return Event{}, fmt.Errorf("%w: %d frames (%d kernel) in %d bytes",
			ErrMalformedEvent, n, nk, len(raw))
	}
	trace.PID = le.Uint32(raw[l.pid:])
	trace.TID = le.Uint32(raw[l.tid:])
	trace.CPU = le.Uint32(raw[l.cpu:])
	trace.KTime = le.Uint64(raw[l.ktime:])
	trace.Hash = le.Uint64(raw[l.hash:])
	trace.Comm = cString(raw[l.comm : l.comm+16])
	trace.Truncated = raw[l.flags]&l.flagTruncated != 0
	trace.APM = libpf.APMContext{Valid: raw[l.flags]&l.flagAPM != 0}
	if trace.APM.Valid {
		a := raw[l.apm:]
		copy(trace.APM.TraceID[:], a)
		copy(trace.APM.SpanID[:], a[16:])
		copy(trace.APM.TransactionID[:], a[24:])
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
	return Event{Kind: EventProcessExec, PID: libpf.PID(le.Uint32(raw[l.execEvent["pid"]:])),
		Program: FileKey{Dev: le.Uint64(raw[l.execEvent["dev"]:]), Ino: le.Uint64(raw[l.execEvent["ino"]:])}}, nil
}

func (s *Shared) decodeExecMapped(raw []byte) (Event, error) {
	l := &s.trace
	if len(raw) < l.mmapEventSize {
		return Event{}, fmt.Errorf("%w: mapping event of %d bytes", ErrMalformedEvent, len(raw))
	}
	u64 := func(field string) uint64 { return binary.LittleEndian.Uint64(raw[l.mmapEvent[field]:]) }
	dev := u64("dev")
	m := ExecMapping{
		Start: u64("start"), End: u64("end"), Offset: u64("pgoff") * pageSize,
		Dev: unix.Mkdev(uint32(dev>>20), uint32(dev&(1<<20-1))), Ino: u64("ino"),
	}
	if m.End <= m.Start {
		return Event{}, fmt.Errorf("%w: mapping [%#x, %#x)", ErrMalformedEvent, m.Start, m.End)
	}
	return Event{Kind: EventExecMapped, PID: libpf.PID(binary.LittleEndian.Uint32(raw[l.processEventPID:])), Mapping: m}, nil
}

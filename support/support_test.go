package support

import (
	"bytes"
	"encoding/binary"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// TestObjectsUpToDate rebuilds the BPF objects with the pinned compiler and
// checks the committed ones are identical: stale objects fail CI.
func TestObjectsUpToDate(t *testing.T) {
	if _, err := exec.LookPath("clang-16"); err != nil {
		t.Fatal("clang-16 is needed to check the committed BPF objects: run `make test-deps`")
	}
	if msg, err := exec.Command("make", "-s", "-C", "..", "check-ebpf").CombinedOutput(); err != nil {
		t.Errorf("make check-ebpf: %v\n%s", err, msg)
	}
}

func TestReadSharedBothArches(t *testing.T) {
	for _, name := range []string{"tracer.ebpf.amd64.o", "tracer.ebpf.arm64.o"} {
		t.Run(name, func(t *testing.T) {
			spec, err := ebpf.LoadCollectionSpec(filepath.Join("ebpf", name))
			if err != nil {
				t.Fatal(err)
			}
			s, err := ReadShared(spec)
			if err != nil {
				t.Fatal(err)
			}
			for _, prog := range []string{"unwind_stop", "unwind_native"} {
				if _, ok := s.Programs[prog]; !ok {
					t.Errorf("tail-call target %s missing from prog_id", prog)
				}
				if _, ok := spec.Programs[prog]; !ok {
					t.Errorf("program %s missing from the object", prog)
				}
			}
			for i, m := range s.Metrics {
				if m == "" {
					t.Errorf("metric id %d has no name", i)
				}
			}
		})
	}
}

// encodeTrace builds a ring buffer record the way BPF lays it out, using
// the offsets read from BTF.
func encodeTrace(l *traceLayout, pid uint32, kernel []uint64, user []Frame, truncated bool) []byte {
	n := len(kernel) + len(user)
	b := make([]byte, l.frames+n*l.frameSize)
	le := binary.LittleEndian
	le.PutUint32(b[l.typ:], l.eventTrace)
	le.PutUint32(b[l.pid:], pid)
	le.PutUint32(b[l.tid:], pid+1)
	le.PutUint32(b[l.cpu:], 1)
	le.PutUint64(b[l.ktime:], 12345)
	le.PutUint64(b[l.hash:], 0xabcdef)
	copy(b[l.comm:], "worker")
	if truncated {
		b[l.flags] = l.flagTruncated
	}
	le.PutUint32(b[l.numKernelFrames:], uint32(len(kernel)))
	le.PutUint32(b[l.numFrames:], uint32(n))
	for i, addr := range kernel {
		le.PutUint64(b[l.frames+i*l.frameSize+l.frameAddr:], addr)
	}
	for i, f := range user {
		off := l.frames + (len(kernel)+i)*l.frameSize
		le.PutUint64(b[off+l.frameAddr:], f.Addr)
		le.PutUint64(b[off+l.frameFileID:], f.FileID)
		b[off+l.frameKind] = byte(f.Kind)
		if f.ReturnAddress {
			b[off+l.frameFlags] = l.frameFlagReturn
		}
	}
	return b
}

// appendLabel appends a struct label with the given key and value,
// its lengths set to keyLen and valueLen.
func appendLabel(l *traceLayout, b []byte, key, value string, keyLen, valueLen uint8) []byte {
	lb := make([]byte, l.labelSize)
	lb[l.labelKeyLen], lb[l.labelValueLen] = keyLen, valueLen
	copy(lb[l.labelKey:l.labelKey+l.labelKeyMax], key)
	copy(lb[l.labelValue:l.labelValue+l.labelValueMax], value)
	return append(b, lb...)
}

// FuzzDecodeEvent decodes records as the ring buffer could hold them,
// seeded with a trace with labels: never a panic, never more labels or
// frames than a record holds.
func FuzzDecodeEvent(f *testing.F) {
	s, err := LoadShared()
	if err != nil {
		f.Fatal(err)
	}
	raw := encodeTrace(&s.trace, 42, []uint64{0xffffffff81000000}, []Frame{{Kind: libpf.FrameNative, Addr: 1}}, false)
	raw = appendLabel(&s.trace, raw, "tenant", "alpha", 6, 5)
	binary.LittleEndian.PutUint32(raw[s.trace.numLabels:], 1)
	f.Add(raw)
	f.Fuzz(func(t *testing.T, data []byte) {
		var tr Trace
		ev, err := s.DecodeEvent(data, &tr)
		if err != nil || ev.Kind != EventTrace {
			return
		}
		if len(tr.Labels) > MaxLabels || len(tr.Frames)+len(tr.KernelStack) > libpf.MaxFrames {
			t.Fatalf("%d labels, %d frames", len(tr.Labels), len(tr.Frames)+len(tr.KernelStack))
		}
		for _, l := range tr.Labels {
			if len(l.Key) > s.trace.labelKeyMax || len(l.Value) > s.trace.labelValueMax {
				t.Fatalf("label %q=%q beyond its room", l.Key, l.Value)
			}
		}
	})
}

func TestDecodeEvent(t *testing.T) {
	s, err := LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	user := []Frame{
		{Kind: libpf.FrameNative, Addr: 0x401000},
		{Kind: libpf.FrameNative, Addr: 0x401234, ReturnAddress: true},
	}
	raw := encodeTrace(&s.trace, 42, []uint64{0xffffffff81000000}, user, true)
	var tr Trace
	ev, err := s.DecodeEvent(raw, &tr)
	if err != nil {
		t.Fatal(err)
	}
	got := ev.Trace
	if ev.Kind != EventTrace || got == nil || got.PID != 42 || got.TID != 43 || got.CPU != 1 || got.KTime != 12345 ||
		got.Hash != 0xabcdef || got.Comm != "worker" || !got.Truncated {
		t.Fatalf("header decoded wrong: %+v", got)
	}
	if len(got.KernelStack) != 1 || got.KernelStack[0] != 0xffffffff81000000 {
		t.Errorf("kernel stack: %x", got.KernelStack)
	}
	if len(got.Frames) != 2 || got.Frames[0] != user[0] || got.Frames[1] != user[1] {
		t.Errorf("user frames: %+v", got.Frames)
	}
	if got.APM.Valid {
		t.Errorf("APM context without its flag: %+v", got.APM)
	}
	// The same trace taken in an APM trace.
	withAPM := slices.Clone(raw)
	withAPM[s.trace.flags] |= s.trace.flagAPM
	for i := range 32 {
		withAPM[s.trace.apm+i] = byte(i + 1)
	}
	if ev, err := s.DecodeEvent(withAPM, &tr); err != nil || !ev.Trace.APM.Valid ||
		ev.Trace.APM.TraceID[0] != 1 || ev.Trace.APM.SpanID[0] != 17 || ev.Trace.APM.TransactionID[7] != 32 {
		t.Errorf("APM context decoded wrong: %+v, %v", ev.Trace.APM, err)
	}

	// The same trace with labels after its frames: one cut to its room,
	// and lengths beyond the room, which BPF never writes, are cut too.
	withLabels := appendLabel(&s.trace, appendLabel(&s.trace, slices.Clone(raw), "tenant", "alpha", 6, 5),
		"k", "", 200, 200)
	withLabels[s.trace.flags] |= s.trace.flagLabelsCut
	binary.LittleEndian.PutUint32(withLabels[s.trace.numLabels:], 2)
	if ev, err := s.DecodeEvent(withLabels, &tr); err != nil || !ev.Trace.LabelsCut || len(ev.Trace.Labels) != 2 ||
		ev.Trace.Labels[0] != (libpf.Label{Key: "tenant", Value: "alpha"}) ||
		len(ev.Trace.Labels[1].Key) != s.trace.labelKeyMax || len(ev.Trace.Labels[1].Value) != s.trace.labelValueMax {
		t.Errorf("labels decoded wrong: %+v, %v", ev.Trace, err)
	}

	exit := make([]byte, s.trace.processEventAddr+8)
	binary.LittleEndian.PutUint32(exit, s.trace.eventProcessExit)
	binary.LittleEndian.PutUint32(exit[4:], 77)
	binary.LittleEndian.PutUint64(exit[s.trace.processEventAddr:], 0x7f0000001234)
	for typ, kind := range map[uint32]EventKind{
		s.trace.eventProcessExit: EventProcessExit,
		s.trace.eventUnknownPC:   EventUnknownPC,
	} {
		binary.LittleEndian.PutUint32(exit, typ)
		if ev, err := s.DecodeEvent(exit, &tr); err != nil || ev.PID != 77 || ev.Kind != kind || ev.Trace != nil ||
			(kind == EventUnknownPC) != (ev.Addr == 0x7f0000001234) {
			t.Errorf("process event of type %d: %+v, %v", typ, ev, err)
		}
	}

	le := binary.LittleEndian
	exec := make([]byte, s.trace.execEventSize)
	le.PutUint32(exec, s.trace.eventProcessExec)
	le.PutUint32(exec[s.trace.execPID:], 79)
	le.PutUint64(exec[s.trace.execDev:], 259<<20|1)
	le.PutUint64(exec[s.trace.execIno:], 4243)
	if ev, err := s.DecodeEvent(exec, &tr); err != nil || ev.Kind != EventProcessExec || ev.PID != 79 ||
		ev.Program != (FileKey{Dev: 259<<20 | 1, Ino: 4243}) {
		t.Errorf("exec event: %+v, %v", ev, err)
	}

	mapped := make([]byte, s.trace.mmapEventSize)
	le.PutUint32(mapped, s.trace.eventExecMapped)
	le.PutUint32(mapped[s.trace.processEventPID:], 78)
	for off, v := range map[int]uint64{s.trace.mmapStart: 0x7f0000001000, s.trace.mmapEnd: 0x7f0000003000,
		s.trace.mmapPgoff: 1, s.trace.mmapDev: 259<<20 | 1, s.trace.mmapIno: 4242} {
		le.PutUint64(mapped[off:], v)
	}
	ev, err = s.DecodeEvent(mapped, &tr)
	want := ExecMapping{Start: 0x7f0000001000, End: 0x7f0000003000, Offset: pageSize,
		Dev: unix.Mkdev(259, 1), Ino: 4242}
	if err != nil || ev.Kind != EventExecMapped || ev.PID != 78 || ev.Mapping != want {
		t.Errorf("mapping event: %+v, %v; want %+v", ev, err, want)
	}

	// A trace taken at a switch-out, and the end of its wait.
	offCPU := slices.Clone(raw)
	offCPU[s.trace.flags] |= s.trace.flagOffCPU
	if ev, err := s.DecodeEvent(offCPU, &tr); err != nil || !ev.Trace.OffCPU || ev.Trace.Waited != 0 {
		t.Errorf("off-CPU trace: %+v, %v", ev.Trace, err)
	}
	if ev, err := s.DecodeEvent(raw, &tr); err != nil || ev.Trace.OffCPU {
		t.Errorf("a CPU sample decoded as off-CPU: %+v, %v", ev.Trace, err)
	}
	offEnd := make([]byte, s.trace.offCPUEndSize)
	le.PutUint32(offEnd, s.trace.eventOffCPUEnd)
	le.PutUint32(offEnd[s.trace.offCPUEndPID:], 80)
	le.PutUint32(offEnd[s.trace.offCPUEndTID:], 81)
	le.PutUint64(offEnd[s.trace.offCPUEndStart:], 12345)
	le.PutUint64(offEnd[s.trace.offCPUEndDuration:], 2_000_000)
	if ev, err := s.DecodeEvent(offEnd, &tr); err != nil || ev.Kind != EventOffCPUEnd || ev.PID != 80 || ev.TID != 81 ||
		ev.Start != 12345 || ev.Duration != 2*time.Millisecond {
		t.Errorf("off-CPU end: %+v, %v", ev, err)
	}

	for name, bad := range map[string][]byte{
		"short":           raw[:4],
		"cut off-CPU end": offEnd[:len(offEnd)-1],
		"cut mapping":     mapped[:len(mapped)-1],
		"cut exec":        exec[:len(exec)-1],
		"cut unknown PC": func() []byte {
			b := bytes.Clone(exit[:len(exit)-1])
			binary.LittleEndian.PutUint32(b, s.trace.eventUnknownPC)
			return b
		}(),
		"unknown type": {9, 0, 0, 0, 0, 0, 0, 0},
		"cut header":   raw[:s.trace.frames-1],
		"cut frames":   raw[:len(raw)-1],
		"cut labels":   withLabels[:len(withLabels)-1],
		"too many labels": func() []byte {
			b := bytes.Clone(withLabels)
			binary.LittleEndian.PutUint32(b[s.trace.numLabels:], MaxLabels+1)
			return b
		}(),
		"too many frames": func() []byte {
			b := bytes.Clone(raw)
			binary.LittleEndian.PutUint32(b[s.trace.numFrames:], libpf.MaxFrames+1)
			return b
		}(),
	} {
		if _, err := s.DecodeEvent(bad, &tr); err == nil {
			t.Errorf("%s: malformed record decoded", name)
		}
	}
}

// RecordWakesEarly answers from the raw record what WakesEarly answers
// from the decoded trace.
func TestRecordWakesEarly(t *testing.T) {
	s, err := LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	native := Frame{Kind: libpf.FrameNative, Addr: 0x401000}
	runtime := Frame{Kind: libpf.FirstRuntimeKind, Addr: 0x10}
	withAPM := encodeTrace(&s.trace, 1, nil, []Frame{native}, false)
	withAPM[s.trace.flags] |= s.trace.flagAPM
	exit := make([]byte, s.trace.processEventAddr+8)
	binary.LittleEndian.PutUint32(exit, s.trace.eventProcessExit)
	for name, c := range map[string]struct {
		raw  []byte
		want bool
	}{
		"native":      {encodeTrace(&s.trace, 1, []uint64{0xffffffff81000000}, []Frame{native}, false), false},
		"runtime":     {encodeTrace(&s.trace, 1, []uint64{0xffffffff81000000}, []Frame{native, runtime}, false), true},
		"APM":         {withAPM, true},
		"exit":        {exit, false},
		"cut":         {encodeTrace(&s.trace, 1, nil, []Frame{native, runtime}, false)[:s.trace.frames+s.trace.frameSize], false},
		"header only": {encodeTrace(&s.trace, 1, nil, nil, false)[:s.trace.frames-1], false},
	} {
		if got := s.RecordWakesEarly(c.raw); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
		var tr Trace
		if ev, err := s.DecodeEvent(c.raw, &tr); err == nil && ev.Kind == EventTrace && tr.WakesEarly() != c.want {
			t.Errorf("%s: WakesEarly %v, want %v", name, tr.WakesEarly(), c.want)
		}
	}
}

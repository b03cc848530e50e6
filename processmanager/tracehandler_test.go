package processmanager

import (
	"bytes"
	"debug/elf"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	"github.com/hostprof/ebpf-profiler/support"
)

type sample struct {
	trace *libpf.Trace
	meta  *libpf.SampleMeta
}

type recordingReporter struct{ samples []sample }

func (r *recordingReporter) ReportSample(t *libpf.Trace, m *libpf.SampleMeta) {
	r.samples = append(r.samples, sample{t, m})
}

func (r *recordingReporter) last(t *testing.T) sample {
	t.Helper()
	if len(r.samples) == 0 {
		t.Fatal("no sample reported")
	}
	return r.samples[len(r.samples)-1]
}

// fakeLib is an ELF file for fake processes to map (this process's vDSO
// image) and one of its functions.
type fakeLib struct {
	path     string
	fn       string
	fnAddr   uint64
	loadAddr uint64 // vaddr of the PT_LOAD at offset 0
}

func newFakeLib(t *testing.T, fs *fakeProcFS) fakeLib {
	t.Helper()
	image := filetest.OwnVDSO(t)
	f, err := elf.NewFile(bytes.NewReader(image))
	if err != nil {
		t.Fatal(err)
	}
	lib := fakeLib{path: fs.writeFile("libfake.so", image)}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Off == 0 {
			lib.loadAddr = p.Vaddr
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL && s.Size > 4 {
			lib.fn, lib.fnAddr = s.Name, s.Value
			return lib
		}
	}
	t.Skip("vdso has no sized global function")
	return lib
}

// mapAt maps the library at base; fnAbs is where its function lands.
func (l fakeLib) mapAt(base uint64) (m fakeMapping, fnAbs uint64) {
	return fakeMapping{start: base, end: base + 0x2000, file: l.path}, base + l.fnAddr - l.loadAddr
}

func newTestHandler(t *testing.T, fs *fakeProcFS) (*Handler, *recordingReporter) {
	t.Helper()
	// Lines off (newLinesHandler's tests have them): the debug files'
	// reader settling between two traces would convert a cached trace
	// again.
	return newHandlerWith(t, fs, -1)
}

// newLinesHandler is newTestHandler with source lines on.
func newLinesHandler(t *testing.T, fs *fakeProcFS) (*Handler, *recordingReporter) {
	t.Helper()
	return newHandlerWith(t, fs, 0)
}

func newHandlerWith(t *testing.T, fs *fakeProcFS, debugInfoBytes int64) (*Handler, *recordingReporter) {
	t.Helper()
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger(), DebugInfoBytes: debugInfoBytes})
	if err != nil {
		t.Fatal(err)
	}
	rep := &recordingReporter{}
	h, err := NewHandler(m, rep, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, rep
}

// handleNow hands h a trace and waits for what the lifecycle does with it,
// as exitedNow and execedNow do for process events: the tests see each
// event's effects before the next.
func (h *Handler) handleNow(raw *support.Trace) {
	h.HandleTrace(raw)
	h.Flush()
}

func (h *Handler) exitedNow(pid libpf.PID) {
	h.ProcessExited(pid)
	h.Flush()
}

func (h *Handler) execedNow(pid libpf.PID, program support.FileKey) {
	h.ProcessExeced(pid, program)
	h.Flush()
}

// quietLogger drops the warnings a fake kernel without build id causes.
func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func monotonicNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

func TestHandlerCachesConversions(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/usr/bin/fake app", mapping)
	h, rep := newTestHandler(t, fs)

	raw := &support.Trace{PID: 100, TID: 101, CPU: 3, Comm: "worker", Hash: 0xfeed,
		KTime: monotonicNow(t),
		Frames: []support.Frame{
			{Kind: libpf.FrameNative, Addr: fnAbs + 2},
			{Kind: libpf.FrameNative, Addr: fnAbs + 4, ReturnAddress: true},
			{Kind: libpf.FrameAbort, Addr: 7},
		}}
	h.handleNow(raw)
	first := rep.last(t)
	h.handleNow(raw)
	second := rep.last(t)
	if first.trace != second.trace {
		t.Error("second sample of one BPF trace was converted again")
	}
	if s := h.Stats(); s.TracesReceived != 2 || s.TraceCacheHits != 1 || s.TraceCacheMisses != 1 ||
		s.ProcessesTracked != 1 || s.TraceCacheSize != 1 || s.FileCacheSize != 1 {
		t.Errorf("stats %+v", s)
	}

	meta := second.meta
	if meta.TID != 101 || meta.CPU != 3 || meta.ThreadName != "worker" {
		t.Errorf("meta %+v", meta)
	}
	if d := time.Since(meta.Time); d < -time.Second || d > time.Second {
		t.Errorf("sample time %v is %v away from now", meta.Time, d)
	}
	wantInfo := libpf.ProcessInfo{PID: 100, ExecutableName: "fake app", ExecutablePath: "/usr/bin/fake app",
		ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	if *meta.Process != wantInfo {
		t.Errorf("process %+v, want %+v", *meta.Process, wantInfo)
	}

	fr := first.trace.Frames
	if len(fr) != 3 {
		t.Fatalf("frames %+v", fr)
	}
	for i, want := range []uint64{lib.fnAddr + 2, lib.fnAddr + 3} {
		if fr[i].FunctionName != lib.fn || fr[i].Address != want || fr[i].Mapping == nil ||
			fr[i].Mapping.Path != lib.path || fr[i].AbsAddress() != fnAbs+want-lib.fnAddr {
			t.Errorf("frame %d = %+v, want %s at %#x", i, fr[i], lib.fn, want)
		}
	}
	if fr[0].Mapping != fr[1].Mapping {
		t.Error("frames in one mapping do not share it")
	}
	if fr[2].Kind != libpf.FrameAbort || fr[2].Address != 7 || fr[2].Mapping != nil {
		t.Errorf("abort frame %+v", fr[2])
	}
}

func TestHandlerPIDReuse(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/old", mapping)
	h, rep := newTestHandler(t, fs)
	raw := &support.Trace{PID: 100, Hash: 0xbeef, Frames: []support.Frame{{Addr: fnAbs}}}

	h.handleNow(raw)
	old := rep.last(t)
	if old.trace.Frames[0].FunctionName != lib.fn {
		t.Fatalf("frame %+v", old.trace.Frames[0])
	}

	// The process exits and a new one with the same pid maps another file
	// at the same address; BPF hashes its identical stack identically.
	h.exitedNow(100)
	other := fs.writeFile("other.bin", []byte("not an ELF file, just data"))
	fs.setProcess(100, 2, "/bin/new", fakeMapping{start: 0x7f0000000000, end: 0x7f0000002000, file: other})
	h.handleNow(raw)
	reused := rep.last(t)
	if reused.trace == old.trace {
		t.Fatal("served the exited process's trace to its pid's successor")
	}
	f := reused.trace.Frames[0]
	if f.Mapping == nil || f.Mapping.Path != other || f.FunctionName != "" {
		t.Errorf("frame %+v", f)
	}
	if reused.meta.Process.ExecutablePath != "/bin/new" {
		t.Errorf("process %+v", reused.meta.Process)
	}
	if reused.trace.Hash == old.trace.Hash {
		t.Error("different files, same trace hash")
	}
	if s := h.Stats(); s.ProcessesExited != 1 || s.TraceCacheMisses != 2 {
		t.Errorf("stats %+v", s)
	}
}

// An exec event handled after the new image was already read from /proc
// (a chain of execs) keeps the state; a real exec replaces it.
func TestHandlerExecEvents(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mapping)
	h, rep := newTestHandler(t, fs)
	raw := &support.Trace{PID: 100, Hash: 0xbeef, Frames: []support.Frame{{Addr: fnAbs}}}
	h.handleNow(raw)
	first := rep.last(t)

	h.execedNow(100, support.FileKey{}) // the exec into /bin/app, handled late
	h.handleNow(raw)
	if rep.last(t).meta.Process != first.meta.Process {
		t.Error("a stale exec event replaced the process's state")
	}

	other := fs.writeFile("other.bin", []byte("not an ELF file, just data"))
	fs.setProcess(100, 1, "/bin/new", fakeMapping{start: 0x7f0000000000, end: 0x7f0000002000, file: other})
	h.execedNow(100, support.FileKey{})
	h.handleNow(raw)
	if got := rep.last(t); got.meta.Process.ExecutablePath != "/bin/new" || got.trace == first.trace {
		t.Errorf("after a real exec: process %+v", got.meta.Process)
	}
	if s := h.Stats(); s.StaleExecs != 1 || s.ProcessesExited != 1 {
		t.Errorf("stats %+v: want 1 stale exec and 1 state replaced", s)
	}
}

// The vDSO cannot be read while a process execs, though /proc shows the new
// image's maps already: an exec event that finds the maps read is stale
// (the state, attached runtimes and all, is kept), and the file that could
// not be read is read again with the maps, which an unknown PC in it asks
// for.
func TestExecRereadsUnreadMapping(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	image, err := os.ReadFile(lib.path)
	if err != nil {
		t.Fatal(err)
	}
	const vdso = 0x10000000
	fnAbs := vdso + lib.fnAddr - lib.loadAddr
	fs.setProcess(100, 1, "/bin/app", fakeMapping{start: vdso, end: vdso + uint64(len(image)), path: "[vdso]"})
	h, rep := newTestHandler(t, fs)
	raw := &support.Trace{PID: 100, Hash: 0xbeef, Frames: []support.Frame{{Addr: fnAbs}}}
	h.handleNow(raw) // its memory is empty: the vDSO is unread
	if f := rep.last(t).trace.Frames[0]; f.Mapping == nil || !f.Mapping.FileID.IsZero() {
		t.Fatalf("frame %+v, want the vDSO without a file", f)
	}

	mem, err := os.OpenFile(filepath.Join(fs.root, "100", "mem"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.WriteAt(image, vdso); err != nil {
		t.Fatal(err)
	}
	mem.Close()
	h.execedNow(100, support.FileKey{})
	clock := h.m.now().Add(defaultMapsRereadInterval)
	h.m.now = func() time.Time { return clock }
	h.UnknownPC(100, fnAbs) // BPF found no deltas for it
	h.Flush()
	h.handleNow(raw)
	if f := rep.last(t).trace.Frames[0]; f.Mapping == nil || f.Mapping.FileID.IsZero() || f.FunctionName != lib.fn {
		t.Errorf("after the exec event: frame %+v, want %s in the vDSO read", f, lib.fn)
	}
	if s := h.Stats(); s.StaleExecs != 1 || s.ProcessesExited != 0 {
		t.Errorf("stats %+v: want the exec taken as stale, the state kept", s)
	}
}

// A sample of the main thread under a new name, handled before the exec
// event (taken during the exec) or without one (the event was lost),
// replaces the state of a process that exec'd; a rename does not.
func TestSampleRevealsExec(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mapping)
	h, rep := newTestHandler(t, fs)
	raw := &support.Trace{PID: 100, TID: 100, Comm: "app", Hash: 0xbeef, Frames: []support.Frame{{Addr: fnAbs}}}
	h.handleNow(raw)
	first := rep.last(t).meta.Process

	renamed := *raw
	renamed.Comm = "worker"
	h.handleNow(&renamed)
	thread := renamed
	thread.TID, thread.Comm = 101, "other"
	h.handleNow(&thread)
	if got := rep.last(t).meta.Process; got != first {
		t.Fatalf("a rename replaced the process's state: %+v", got)
	}

	fs.setProcess(100, 1, "/bin/new", mapping)
	h.handleNow(&renamed) // same name as before: no cue
	if got := rep.last(t).meta.Process; got != first {
		t.Fatalf("state replaced without a cue: %+v", got)
	}
	execed := *raw
	execed.Comm = "new"
	h.handleNow(&execed)
	if got := rep.last(t).meta.Process; got.ExecutablePath != "/bin/new" {
		t.Errorf("after a sample of the new image: process %+v", got)
	}
	h.execedNow(100, support.FileKey{}) // its event, handled late
	if s := h.Stats(); s.ExecsFoundBySample != 1 || s.StaleExecs != 1 {
		t.Errorf("stats %+v: want 1 exec found by a sample, then its event stale", s)
	}
}

// dlopenFixture is pid 100 with one copy of a library mapped and a trace
// whose frame is in a second copy that mapLib maps later (a dlopen). now is
// the manager's clock.
type dlopenFixture struct {
	fs            *fakeProcFS
	lib           fakeLib
	first, second fakeMapping
	fnAbs         uint64
	h             *Handler
	rep           *recordingReporter
	now           time.Time
	raw           *support.Trace
}

func newDlopenFixture(t *testing.T) *dlopenFixture {
	f := &dlopenFixture{fs: newFakeProcFS(t), now: time.Unix(1000, 0)}
	f.lib = newFakeLib(t, f.fs)
	f.first, _ = f.lib.mapAt(0x7f0000000000)
	f.second, f.fnAbs = f.lib.mapAt(0x7e0000000000)
	f.fs.setProcess(100, 1, "/bin/app", f.first)
	f.h, f.rep = newTestHandler(t, f.fs)
	f.h.m.now = func() time.Time { return f.now }
	// The process is no longer young: its re-reads wait the full interval
	// unless the last one found new mappings.
	f.h.m.youngProcess, f.h.m.newbornProcess = 0, 0
	f.raw = &support.Trace{PID: 100, Hash: 1, Frames: []support.Frame{{Addr: f.fnAbs}}}
	return f
}

func (f *dlopenFixture) mapLib() { f.fs.setProcess(100, 1, "/bin/app", f.first, f.second) }

func TestMapsRereadInvalidatesCache(t *testing.T) {
	f := newDlopenFixture(t)
	h, rep, raw := f.h, f.rep, f.raw

	h.handleNow(raw)
	if fr := rep.last(t).trace.Frames[0]; fr.Mapping != nil || fr.Address != f.fnAbs {
		t.Fatalf("unmapped frame %+v", fr)
	}

	// The library gets mapped (dlopen) but the re-read is rate limited.
	f.mapLib()
	f.now = f.now.Add(time.Second / 2)
	h.handleNow(raw) // cache hit: nothing changed as far as we know
	if _, _, err := h.m.ConvertTrace(raw); err != nil {
		t.Fatal(err)
	}
	if s := h.Stats(); s.MapsRereadsLimited == 0 || s.MapsReads != 1 {
		t.Errorf("stats %+v", s)
	}

	kept := h.m.procs[100].mappings[0].pf
	f.now = f.now.Add(time.Second)
	tr, _, err := h.m.ConvertTrace(raw)
	if err != nil {
		t.Fatal(err)
	}
	if fr := tr.Frames[0]; fr.FunctionName != f.lib.fn || fr.Mapping == nil || fr.Mapping.Start != f.second.start {
		t.Errorf("after re-read, frame %+v", fr)
	}
	// The re-read changed the mappings: the cached, unmapped conversion is
	// stale.
	h.handleNow(raw)
	if fr := rep.last(t).trace.Frames[0]; fr.FunctionName != f.lib.fn {
		t.Errorf("handler served stale frame %+v", fr)
	}
	// The mapping that did not change keeps its *libpf.Mapping.
	p := h.m.procs[100]
	if len(p.mappings) != 2 || p.mappings[1].pf != kept {
		t.Errorf("mappings %+v; unchanged one was %p", p.mappings, kept)
	}
}

func TestExitedProcessNotCached(t *testing.T) {
	fs := newFakeProcFS(t)
	h, rep := newTestHandler(t, fs)
	raw := &support.Trace{PID: 4242, Comm: "gone", Hash: 5, Frames: []support.Frame{{Addr: 0x1234}}}
	h.handleNow(raw)
	h.handleNow(raw)
	s := h.Stats()
	if s.TraceCacheMisses != 2 || s.ProcessesTracked != 0 || s.ProcessesVanished != 2 || s.UnmappedFrames != 2 {
		t.Errorf("stats %+v", s)
	}
	smp := rep.last(t)
	if smp.meta.Process.ExecutableName != "gone" || smp.trace.Frames[0].Address != 0x1234 {
		t.Errorf("sample %+v %+v", smp.trace.Frames, smp.meta.Process)
	}
}

func TestSweep(t *testing.T) {
	fs := newFakeProcFS(t)
	for _, pid := range []uint32{1, 2, 3} {
		fs.setProcess(pid, 10, "")
	}
	h, _ := newTestHandler(t, fs)
	for _, pid := range []uint32{1, 2, 3} {
		h.handleNow(&support.Trace{PID: pid, Hash: uint64(pid)})
	}
	fs.removeProcess(1)
	fs.setProcess(2, 11, "") // pid 2 was reused
	if n := h.m.Sweep(); n != 2 {
		t.Errorf("Sweep forgot %d processes, want 2", n)
	}
	if s := h.Stats(); s.ProcessesTracked != 1 || s.ProcessesExited != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestTraceHash(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapA, fnA := lib.mapAt(0x7f0000000000)
	mapB, fnB := lib.mapAt(0x7e0000000000)
	fs.setProcess(1, 1, "", mapA)
	fs.setProcess(2, 1, "", mapB)
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	hash := func(pid uint32, addrs ...uint64) libpf.TraceHash {
		t.Helper()
		raw := &support.Trace{PID: pid}
		for _, a := range addrs {
			raw.Frames = append(raw.Frames, support.Frame{Addr: a})
		}
		tr, _, err := m.ConvertTrace(raw)
		if err != nil {
			t.Fatal(err)
		}
		return tr.Hash
	}
	same := []struct {
		name string
		a, b libpf.TraceHash
	}{
		{"stable", hash(1, fnA, fnA+8), hash(1, fnA, fnA+8)},
		{"same file, other process and address", hash(1, fnA, fnA+8), hash(2, fnB, fnB+8)},
	}
	for _, tt := range same {
		if tt.a != tt.b {
			t.Errorf("%s: %v != %v", tt.name, tt.a, tt.b)
		}
	}
	distinct := []struct {
		name string
		a, b libpf.TraceHash
	}{
		{"other address", hash(1, fnA, fnA+8), hash(1, fnA, fnA+9)},
		{"other order", hash(1, fnA, fnA+8), hash(1, fnA+8, fnA)},
		{"extra frame", hash(1, fnA), hash(1, fnA, fnA)},
		{"unmapped in other process", hash(1, 0x1000), hash(2, 0x1000)},
	}
	for _, tt := range distinct {
		if tt.a == tt.b {
			t.Errorf("%s: both %v", tt.name, tt.a)
		}
	}
}

// TestUnknownFramesRetriedThroughHandler: a conversion with an address
// outside every mapping is served from the cache only until a maps re-read
// is allowed again; then the handler itself converts anew and finds code
// mapped in the meantime (no direct ConvertTrace call to force it).
func TestUnknownFramesRetriedThroughHandler(t *testing.T) {
	f := newDlopenFixture(t)
	f.h.handleNow(f.raw)
	f.mapLib()
	f.now = f.now.Add(time.Second / 2)
	f.h.handleNow(f.raw) // within the rate limit: the cached conversion
	if fr := f.rep.last(t).trace.Frames[0]; fr.Mapping != nil {
		t.Fatalf("frame resolved before a re-read was allowed: %+v", fr)
	}
	f.now = f.now.Add(time.Second)
	f.h.handleNow(f.raw)
	if fr := f.rep.last(t).trace.Frames[0]; fr.FunctionName != f.lib.fn || fr.Mapping == nil {
		t.Errorf("handler kept serving the unmapped frame: %+v", fr)
	}
	if s := f.h.Stats(); s.TraceCacheMisses != 2 || s.TraceCacheHits != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestFramesOfGoneProcessesAndJIT: a frame BPF resolved to a file is named
// even for a process whose mappings were never read, and frames in
// anonymous executable memory collapse into one labelled frame between
// named ones.
func TestFramesOfGoneProcessesAndJIT(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMap, fnAbs := lib.mapAt(0x7f0000000000)
	jit := fakeMapping{start: 0x10000000, end: 0x10010000}
	fs.setProcess(100, 1, "/bin/app", libMap, jit)
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	tr, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{
		{Addr: fnAbs}, {Addr: 0x10000100, ReturnAddress: true}, {Addr: 0x10000200, ReturnAddress: true},
		{Addr: fnAbs + 1, ReturnAddress: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range tr.Frames {
		names = append(names, f.FunctionName)
	}
	if want := []string{lib.fn, anonymousCode, lib.fn}; !slices.Equal(names, want) {
		t.Errorf("frames %q, want %q", names, want)
	}

	// Pid 300 never existed here; BPF resolved its frame to the library.
	fileID := tr.Frames[0].Mapping.FileID.Low64()
	tr, _, err = m.ConvertTrace(&support.Trace{PID: 300, Frames: []support.Frame{
		{Addr: lib.fnAddr, FileID: fileID},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if f := tr.Frames[0]; f.FunctionName != lib.fn || f.Mapping == nil || f.Mapping.FileID.Low64() != fileID {
		t.Errorf("frame of a gone process: %+v", f)
	}
}

// TestSamplesAfterExit: samples of a process's teardown arrive after its
// exit event; they are converted but do not bring its state back, and a
// later process with its pid gets state of its own.
func TestSamplesAfterExit(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mapping)
	fs.setProcess(101, 1, "/bin/app", mapping)
	fs.setProcess(102, 1, "/bin/app", mapping)
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	raw := func(pid uint32) *support.Trace {
		return &support.Trace{PID: pid, Comm: "app", Frames: []support.Frame{{Addr: fnAbs}}}
	}
	for _, pid := range []uint32{100, 102} {
		if _, _, err := m.ConvertTrace(raw(pid)); err != nil {
			t.Fatal(err)
		}
	}
	m.ProcessExited(100)
	m.ProcessExited(101) // never sampled before its exit
	m.ProcessExited(102)
	fs.removeProcess(102) // reaped before its last samples are converted
	for _, pid := range []uint32{100, 101, 102} {
		tr, info, err := m.ConvertTrace(raw(pid))
		if err != nil || info.PID != libpf.PID(pid) || len(tr.Frames) != 1 {
			t.Fatalf("late sample of %d: %+v %+v %v", pid, tr, info, err)
		}
		if pid != 101 && info.ExecutablePath != "/bin/app" {
			t.Errorf("late sample of %d: process %+v, want the one sampled before its exit", pid, info)
		}
		m.RefreshMappings(libpf.PID(pid))
		if m.Tracks(libpf.PID(pid)) {
			t.Errorf("process %d tracked again after its exit", pid)
		}
	}
	if s := m.Stats(); s.ProcessesSeen != 2 || s.MapsReads != 2 || s.ProcessesVanished != 0 {
		t.Errorf("stats %+v: want two processes seen, two maps reads, none vanished", s)
	}
	fs.setProcess(100, 2, "/bin/app", mapping) // pid 100 reused
	if _, _, err := m.ConvertTrace(raw(100)); err != nil || !m.Tracks(100) {
		t.Errorf("the pid's next process is not tracked: %v", err)
	}
}

// TestQuickRereadAfterChange: a re-read that finds new mappings lets the
// next one come after quickRereadInterval; one that finds none restores
// the full interval.
func TestQuickRereadAfterChange(t *testing.T) {
	f := newDlopenFixture(t)
	m := f.h.m
	m.RefreshMappings(100) // the first read
	third, _ := f.lib.mapAt(0x7d0000000000)
	reads := func() uint64 { return m.Stats().MapsReads }

	f.now = f.now.Add(2 * time.Second)
	f.mapLib()
	m.RefreshMappings(100) // finds the second copy
	if reads() != 2 {
		t.Fatalf("%d maps reads, want 2", reads())
	}
	f.fs.setProcess(100, 1, "/bin/app", f.first, f.second, third)
	f.now = f.now.Add(2 * quickRereadInterval)
	m.RefreshMappings(100) // allowed soon: finds the third copy
	if reads() != 3 || len(m.procs[100].mappings) != 3 {
		t.Fatalf("%d maps reads and %d mappings, want 3 and 3", reads(), len(m.procs[100].mappings))
	}
	f.now = f.now.Add(2 * quickRereadInterval)
	m.RefreshMappings(100) // allowed soon again: finds nothing new
	f.now = f.now.Add(2 * quickRereadInterval)
	m.RefreshMappings(100) // limited: the last read found nothing
	if reads() != 4 || m.Stats().MapsRereadsLimited != 1 {
		t.Errorf("%d maps reads, %d limited; want 4 and 1", reads(), m.Stats().MapsRereadsLimited)
	}
}

// TestQuickRereadWhileYoung: a process the manager has known for less
// than youngProcess may have its maps re-read after quickRereadInterval
// even when the last read found nothing new.
func TestQuickRereadWhileYoung(t *testing.T) {
	f := newDlopenFixture(t)
	m := f.h.m
	m.youngProcess = 5 * time.Second
	m.RefreshMappings(100) // the first read
	for i := 0; i < 3; i++ {
		f.now = f.now.Add(2 * quickRereadInterval)
		m.RefreshMappings(100)
	}
	if s := m.Stats(); s.MapsReads != 4 || s.MapsRereadsLimited != 0 {
		t.Errorf("%d maps reads, %d limited; want 4 and 0", s.MapsReads, s.MapsRereadsLimited)
	}
	f.now = f.now.Add(m.youngProcess)
	m.RefreshMappings(100) // old now, and a full interval has passed: allowed
	f.now = f.now.Add(2 * quickRereadInterval)
	m.RefreshMappings(100)
	if s := m.Stats(); s.MapsReads != 5 || s.MapsRereadsLimited != 1 {
		t.Errorf("%d maps reads, %d limited; want 5 and 1", s.MapsReads, s.MapsRereadsLimited)
	}
}

// TestNewbornRereads: during a process's first newbornProcess its maps may
// be re-read every newbornRereadInterval, as the dynamic loader maps its
// libraries; after it, the young process's quickRereadInterval holds.
func TestNewbornRereads(t *testing.T) {
	f := newDlopenFixture(t)
	m := f.h.m
	m.youngProcess, m.newbornProcess = youngProcess, newbornProcess
	m.RefreshMappings(100) // the first read
	f.now = f.now.Add(newbornRereadInterval)
	m.RefreshMappings(100) // allowed
	f.now = f.now.Add(newbornRereadInterval / 2)
	m.RefreshMappings(100) // limited
	if s := m.Stats(); s.MapsReads != 2 || s.MapsRereadsLimited != 1 {
		t.Errorf("newborn: %d maps reads, %d limited; want 2 and 1", s.MapsReads, s.MapsRereadsLimited)
	}
	f.now = f.now.Add(newbornProcess)
	m.RefreshMappings(100) // allowed: a quick interval has passed
	f.now = f.now.Add(newbornRereadInterval)
	m.RefreshMappings(100) // limited: young, no longer newborn
	if s := m.Stats(); s.MapsReads != 3 || s.MapsRereadsLimited != 2 {
		t.Errorf("young: %d maps reads, %d limited; want 3 and 2", s.MapsReads, s.MapsRereadsLimited)
	}
}

// TestHandlerDropsExitedTraces: the cached traces of a process that exited
// are dropped at the next sweep (a pre-forking server's recycled workers
// would fill the cache), those of live processes kept.
func TestHandlerDropsExitedTraces(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mapping)
	fs.setProcess(200, 1, "/bin/app", mapping)
	h, _ := newTestHandler(t, fs)
	clock := time.Now()
	h.m.now = func() time.Time { return clock }
	raw := func(pid uint32, hash uint64) *support.Trace {
		return &support.Trace{PID: pid, Comm: "app", Hash: hash, KTime: monotonicNow(t), Frames: []support.Frame{{Addr: fnAbs}}}
	}
	for i := range uint64(3) {
		h.handleNow(raw(100, 0x100+i))
		h.handleNow(raw(200, 0x200+i))
	}
	h.exitedNow(100)
	h.handleNow(raw(200, 0x200))
	if n := h.Stats().TraceCacheSize; n != 6 {
		t.Errorf("%d traces cached before the next sweep, want 6", n)
	}
	clock = clock.Add(exitSweepInterval)
	h.handleNow(raw(200, 0x200))
	if n := h.Stats().TraceCacheSize; n != 3 {
		t.Errorf("%d traces cached after the sweep, want 3 (process 200's)", n)
	}
	if s := h.Stats(); s.TraceCacheHits != 2 {
		t.Errorf("%d cache hits, want 2: process 200's traces stay cached", s.TraceCacheHits)
	}
}

// TestHandlerDropsIdleTraces: a cached trace not seen for traceIdleExpiry
// is dropped at a sweep, one seen within it stays (a hit keeps it fresh).
func TestHandlerDropsIdleTraces(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mapping)
	h, _ := newTestHandler(t, fs)
	clock := time.Now()
	h.m.now = func() time.Time { return clock }
	raw := func(hash uint64) *support.Trace {
		return &support.Trace{PID: 100, Comm: "app", Hash: hash, KTime: monotonicNow(t), Frames: []support.Frame{{Addr: fnAbs}}}
	}
	h.handleNow(raw(1))
	h.handleNow(raw(2))
	// Trace 1 is seen every few minutes, trace 2 never again.
	for range 4 {
		clock = clock.Add(traceIdleExpiry / 3)
		h.handleNow(raw(1))
	}
	if n := h.Stats().TraceCacheSize; n != 1 {
		t.Errorf("%d traces cached, want 1: the one seen within %v", n, traceIdleExpiry)
	}
	if s := h.Stats(); s.TraceCacheHits != 4 || s.TraceCacheMisses != 2 {
		t.Errorf("%d hits and %d misses, want 4 and 2: the trace in use stays cached", s.TraceCacheHits, s.TraceCacheMisses)
	}
	clock = clock.Add(traceIdleExpiry)
	h.handleNow(raw(2))
	if s := h.Stats(); s.TraceCacheSize != 1 || s.TraceCacheMisses != 3 {
		t.Errorf("%d cached, %d misses; want 1 and 3: trace 1 dropped, 2 converted again", s.TraceCacheSize, s.TraceCacheMisses)
	}
}

package processmanager

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// testRuntimeID is the BPF id of the test runtime: one no real runtime
// uses (support/ebpf/runtimes.h).
const testRuntimeID interpreter.ID = 30

// testRuntime is a runtime found in the fake library (its eval loop the
// first 0x100 bytes of its code) that counts what the manager asks of it.
type testRuntime struct {
	rt *interpreter.Runtime
	// recognised counts Recognise calls, attaches Attach calls,
	// detaches Detach calls.
	recognised, attaches, detaches int
	// attach, when set, runs inside Attach after the configuration and a
	// JIT region were written; its error fails the attach.
	attach func(h interpreter.Host) error
	// jit is the region the process claims at attach.
	jit interpreter.Region
}

func newTestRuntime() *testRuntime {
	tr := &testRuntime{jit: interpreter.Region{Start: 0x60000000, End: 0x60010000, Unwind: true}}
	tr.rt = &interpreter.Runtime{
		Name: "testrt", DisplayName: "Test Runtime", ID: testRuntimeID,
		RetryMin: time.Second, RetryMax: 4 * time.Second,
		Recognise: func(f *interpreter.File) (interpreter.Binary, error) {
			tr.recognised++
			if !strings.HasSuffix(f.Path, "libfake.so") {
				return nil, nil
			}
			return testBinary{tr}, nil
		},
	}
	return tr
}

type testBinary struct{ tr *testRuntime }

func (testBinary) Version() string         { return "1.0" }
func (testBinary) Unsupported() error      { return nil }
func (testBinary) CodeRanges() [][2]uint64 { return [][2]uint64{{0, 0x100}} }

func (b testBinary) Attach(h interpreter.Host) (interpreter.Process, error) {
	b.tr.attaches++
	if err := h.SetConfig(fmt.Sprint(h.PID())); err != nil {
		return nil, err
	}
	if err := h.SetRegions([]interpreter.Region{b.tr.jit}); err != nil {
		return nil, err
	}
	if b.tr.attach != nil {
		if err := b.tr.attach(h); err != nil {
			return nil, err
		}
	}
	return &testProcess{tr: b.tr}, nil
}

type testProcess struct{ tr *testRuntime }

// Symbolize names frame Addr n as two frames, an inlined call and its
// caller; Addr 0 fails.
func (p *testProcess) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if f.Addr == 0 {
		return out, errors.New("object freed")
	}
	return append(out,
		libpf.Frame{Kind: testRuntimeID.Kind(), FunctionName: fmt.Sprintf("inlined%d", f.Addr)},
		libpf.Frame{Kind: testRuntimeID.Kind(), FunctionName: fmt.Sprintf("fn%d", f.Addr)}), nil
}

func (p *testProcess) Detach() { p.tr.detaches++ }

// jitRuntime detects itself in any process with anonymous executable
// memory, claims it (walked with frame pointers) and names its code; it
// looks again when asked.
type jitRuntime struct {
	rt      *interpreter.Runtime
	updates int
	refuse  bool
}

func newJITRuntime() *jitRuntime {
	j := &jitRuntime{}
	j.rt = &interpreter.Runtime{Name: "testjit", DisplayName: "Test JIT", RetryMin: time.Second, RetryMax: time.Second,
		Detect: func(h interpreter.Host) (interpreter.Process, error) {
			if j.refuse {
				return nil, interpreter.Refuse("hostile", errors.New("a hostile file"))
			}
			p := &jitProcess{j: j}
			if _, err := p.Update(h); err != nil {
				return nil, err
			}
			if len(p.regions) == 0 {
				return nil, nil
			}
			return p, nil
		}}
	return j
}

type jitProcess struct {
	j       *jitRuntime
	regions []interpreter.Region
}

func (p *jitProcess) Update(h interpreter.Host) (bool, error) {
	p.j.updates++
	var rs []interpreter.Region
	for _, m := range h.Mappings() {
		if m.Path == "" {
			rs = append(rs, interpreter.Region{Start: m.Start, End: m.End})
		}
	}
	p.regions = rs
	return true, h.SetRegions(rs)
}

func (p *jitProcess) SymbolizeAddr(addr uint64) (libpf.Frame, bool) {
	return libpf.Frame{Kind: libpf.FrameNative, Address: addr, FunctionName: fmt.Sprintf("jit@%#x", addr)}, true
}

func (p *jitProcess) Symbolize(support.Frame, []libpf.Frame) ([]libpf.Frame, error) {
	return nil, errors.New("no BPF frames")
}
func (p *jitProcess) Detach() {}

// runtimeEntries counts a pid's configurations and mapping trie entries.
func runtimeEntries(maps *fakeDeltaMaps, pid uint32) (configs, mappings int) {
	for k := range maps.runtimes {
		if k.PID == pid {
			configs++
		}
	}
	for k := range maps.mappings {
		if k.PID == pid {
			mappings++
		}
	}
	return configs, mappings
}

// regionOwner returns the runtime id of the trie entries of pid at
// addr's prefix: -1 if none covers it.
func regionOwner(maps *fakeDeltaMaps, pid uint32, addr uint64) int {
	for k, v := range maps.mappings {
		if k.PID != pid {
			continue
		}
		n := k.PrefixLen - 32 // the key's first 32 bits are the pid
		mask := ^uint64(0) << (64 - n)
		if n == 0 {
			mask = 0
		}
		if addr&mask == bits.ReverseBytes64(k.AddrBE)&mask && v.FileID == 0 {
			return int(v.Runtime)
		}
	}
	return -1
}

// TestRuntimeLifecycle drives a runtime found in a file through the
// stages: recognised once per file, attached on the first sample with its
// configuration and claimed code in the maps, its frames symbolized, and
// detached with every entry gone when the file is unmapped, at exec and at
// exit.
func TestRuntimeLifecycle(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMap, fnAbs := lib.mapAt(0x7f0000000000)
	tr := newTestRuntime()
	maps := newFakeDeltaMaps()
	m := newUnwindingManager(t, fs, maps, nil, tr.rt)
	now := time.Now()
	m.now = func() time.Time { return now }

	fs.setProcess(100, 1, "/bin/app", libMap)
	fs.setProcess(200, 1, "/bin/app", libMap)
	raw := func(pid uint32, frames ...support.Frame) *support.Trace {
		return &support.Trace{PID: pid, TID: pid, Frames: append(frames, support.Frame{Addr: fnAbs})}
	}
	for _, pid := range []uint32{100, 200} {
		if _, _, err := m.ConvertTrace(raw(pid)); err != nil {
			t.Fatal(err)
		}
	}
	m.unwind.wait()
	if tr.recognised != 1 || tr.attaches != 2 {
		t.Errorf("recognised %d times, attached %d times; want once per file and once per process", tr.recognised, tr.attaches)
	}
	for _, pid := range []uint32{100, 200} {
		if configs, _ := runtimeEntries(maps, pid); configs != 1 {
			t.Errorf("pid %d: %d configurations, want 1", pid, configs)
		}
		if owner := regionOwner(maps, pid, tr.jit.Start+0x10); owner != int(testRuntimeID) {
			t.Errorf("pid %d: JIT region owned by %d, want %d", pid, owner, testRuntimeID)
		}
	}
	if s := m.Stats(); s.RuntimeProcesses["testrt"] != 2 || s.RuntimeAttached["testrt"] != 2 {
		t.Errorf("stats %v %v", s.RuntimeProcesses, s.RuntimeAttached)
	}

	// Its BPF frames: each symbolized in order, the failed one named and
	// counted.
	tr1, info, err := m.ConvertTrace(raw(100,
		support.Frame{Kind: testRuntimeID.Kind(), Addr: 1},
		support.Frame{Kind: testRuntimeID.Kind(), Addr: 0},
		support.Frame{Kind: testRuntimeID.Kind(), Addr: 2}))
	if err != nil {
		t.Fatal(err)
	}
	got := functionNamesOf(tr1)
	want := []string{"inlined1", "fn1", "[unknown Test Runtime frame]", "inlined2", "fn2", lib.fn}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("frames %v, want %v", got, want)
	}
	if info.RuntimeName != "Test Runtime" || info.RuntimeVersion != "1.0" {
		t.Errorf("process info %+v", info)
	}
	if n := m.Stats().RuntimeFrameErrors; n != 1 {
		t.Errorf("%d frame errors, want 1", n)
	}

	// Unmapped: the runtime goes, the process stays.
	fs.setProcess(100, 1, "/bin/app")
	now = now.Add(time.Minute) // past the maps re-read limit
	m.RefreshMappings(100)
	m.unwind.wait()
	if configs, mappings := runtimeEntries(maps, 100); configs != 0 || mappings != 0 || tr.detaches != 1 {
		t.Errorf("after unmapping: %d configurations, %d trie entries, %d detaches", configs, mappings, tr.detaches)
	}
	// Exec: the old image's runtime goes with it.
	fs.setProcess(200, 1, "/bin/other")
	m.ProcessExeced(200)
	m.unwind.wait()
	if configs, _ := runtimeEntries(maps, 200); configs != 0 || tr.detaches != 2 {
		t.Errorf("after exec: %d configurations, %d detaches", configs, tr.detaches)
	}
	m.ProcessExited(100)
	m.ProcessExited(200)
	m.unwind.wait()
	if len(maps.runtimes) != 0 || len(maps.mappings) != 0 || tr.detaches != 2 {
		t.Errorf("after the exits: %d configurations, %d trie entries, %d detaches (want 2: once each)",
			len(maps.runtimes), len(maps.mappings), tr.detaches)
	}
	if n := m.Stats().RuntimeProcesses["testrt"]; n != 0 {
		t.Errorf("%d processes still run the runtime", n)
	}
}

func functionNamesOf(tr *libpf.Trace) []string {
	var names []string
	for _, f := range tr.Frames {
		names = append(names, f.FunctionName)
	}
	return names
}

// TestRuntimeExitsDuringAttach: the process exits while the runtime
// attaches, after it wrote some entries: they are removed, the failure is
// counted, retries are paced, and the exit leaves nothing behind.
func TestRuntimeExitsDuringAttach(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMap, fnAbs := lib.mapAt(0x7f0000000000)
	tr := newTestRuntime()
	tr.attach = func(h interpreter.Host) error {
		fs.removeProcess(uint32(h.PID()))
		if _, err := h.NamespacePID(); err == nil {
			return errors.New("the process's status is still there")
		}
		return errors.New("process exited")
	}
	maps := newFakeDeltaMaps()
	m := newUnwindingManager(t, fs, maps, nil, tr.rt)
	now := time.Now()
	m.now = func() time.Time { return now }
	fs.setProcess(100, 1, "/bin/app", libMap)
	errorsBefore := m.Stats().InterpreterErrors
	sample := &support.Trace{PID: 100, TID: 100, Frames: []support.Frame{{Addr: fnAbs}}}
	if _, _, err := m.ConvertTrace(sample); err != nil {
		t.Fatal(err)
	}
	m.unwind.wait()
	if configs, _ := runtimeEntries(maps, 100); configs != 0 || regionOwner(maps, 100, tr.jit.Start) >= 0 {
		t.Errorf("a failed attach left %d configurations and its region", configs)
	}
	if n := m.Stats().InterpreterErrors - errorsBefore; n != 1 {
		t.Errorf("%d errors counted, want 1", n)
	}
	// The next sample at once does not try again; one after RetryMin
	// does.
	m.ConvertTrace(sample)
	if tr.attaches != 1 {
		t.Errorf("%d attaches without time passing, want 1", tr.attaches)
	}
	now = now.Add(time.Second)
	fs.setProcess(100, 1, "/bin/app", libMap)
	tr.attach = nil
	m.ConvertTrace(sample)
	m.unwind.wait()
	if tr.attaches != 2 {
		t.Errorf("%d attaches after RetryMin, want 2", tr.attaches)
	}
	m.ProcessExited(100)
	m.unwind.wait()
	if len(maps.runtimes) != 0 || len(maps.mappings) != 0 || tr.detaches != 1 {
		t.Errorf("after the exit: %d configurations, %d trie entries, %d detaches",
			len(maps.runtimes), len(maps.mappings), tr.detaches)
	}
}

// TestDetectedRuntime drives a runtime without a file (a perf map reader):
// detected in a process with anonymous code, which it claims and names,
// updated when the mappings change and refused for good when it says so.
func TestDetectedRuntime(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMap, fnAbs := lib.mapAt(0x7f0000000000)
	jit := fakeMapping{start: 0x50000000, end: 0x50001000}
	j := newJITRuntime()
	maps := newFakeDeltaMaps()
	m := newUnwindingManager(t, fs, maps, nil, j.rt)
	now := time.Now()
	m.now = func() time.Time { return now }
	fs.setProcess(100, 1, "/bin/app", libMap, jit)
	sample := &support.Trace{PID: 100, TID: 100, Frames: []support.Frame{{Addr: jit.start + 0x10}, {Addr: fnAbs, ReturnAddress: true}}}
	tr, _, err := m.ConvertTrace(sample)
	if err != nil {
		t.Fatal(err)
	}
	m.unwind.wait()
	if got := tr.Frames[0].FunctionName; got != fmt.Sprintf("jit@%#x", jit.start+0x10) {
		t.Errorf("JIT frame named %q", got)
	}
	if owner := regionOwner(maps, 100, jit.start); owner != 0 {
		t.Errorf("JIT region owner %d, want 0 (walked with frame pointers)", owner)
	}
	// New anonymous code: the runtime claims it too.
	more := fakeMapping{start: 0x58000000, end: 0x58002000}
	fs.setProcess(100, 1, "/bin/app", libMap, jit, more)
	now = now.Add(time.Minute) // past the maps re-read limit
	m.RefreshMappings(100)
	m.unwind.wait()
	if regionOwner(maps, 100, more.start+0x1800) != 0 || j.updates < 2 {
		t.Errorf("new code not claimed after %d updates", j.updates)
	}
	m.ProcessExited(100)
	m.unwind.wait()
	if len(maps.mappings) != 0 {
		t.Errorf("%d trie entries after the exit", len(maps.mappings))
	}

	// A refusal is counted and not retried.
	j.refuse = true
	fs.setProcess(300, 1, "/bin/app", libMap, jit)
	sample.PID, sample.TID = 300, 300
	for range 3 {
		m.ConvertTrace(sample)
		now = now.Add(time.Minute)
	}
	if got := m.Stats().RuntimeRefusals; got["testjit/hostile"] != 1 {
		t.Errorf("refusals %v, want testjit/hostile once", got)
	}
}

// TestRuntimeSwitchedOff: a runtime the manager is not given is never
// asked about a file.
func TestRuntimeSwitchedOff(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMap, fnAbs := lib.mapAt(0x7f0000000000)
	tr := newTestRuntime()
	m := newUnwindingManager(t, fs, newFakeDeltaMaps(), nil)
	fs.setProcess(100, 1, "/bin/app", libMap)
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	if tr.recognised != 0 {
		t.Errorf("a runtime switched off recognised %d files", tr.recognised)
	}
}

package processmanager

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

// The test runtimes are handed to the Manager (Config.Runtimes), never
// registered: the registry is global. testRuntimeID is an id no real
// runtime has (support/ebpf/runtimes.h: cpython is 4, ids are below 32);
// noRuntimeID is the kind of frames no runtime of the manager has.
const (
	testRuntimeID interpreter.ID = 30
	noRuntimeID   interpreter.ID = 29
)

// testRuntime is a runtime found in the fake library, libfake.so (its eval
// loop the first 0x100 bytes of its code), that records what the manager
// asks of it. Attach writes its configuration (the pid as a string) and
// claims a JIT region for its BPF unwinder.
type testRuntime struct {
	rt *interpreter.Runtime
	// recognised counts Recognise calls by file name.
	recognised         map[string]int
	attaches, detaches int
	// bias is the Bias each process was attached with.
	bias map[libpf.PID]uint64
	// recogniseErr, when set, is Recognise's answer for libfake.so.
	recogniseErr error
	// attach, when set, runs inside Attach after the configuration and the
	// region were written; its error fails the attach.
	attach func(h interpreter.Host) error
	jit    interpreter.Region
}

func newTestRuntime() *testRuntime {
	tr := &testRuntime{
		recognised: map[string]int{},
		bias:       map[libpf.PID]uint64{},
		jit:        interpreter.Region{Start: 0x60000000, End: 0x60010000, Unwind: true},
	}
	tr.rt = &interpreter.Runtime{
		Name: "testrt", DisplayName: "Test Runtime", ID: testRuntimeID,
		RetryMin: time.Second, RetryMax: 4 * time.Second,
		Recognise: func(f *interpreter.File) (interpreter.Binary, error) {
			name := filepath.Base(f.Path)
			tr.recognised[name]++
			switch {
			case name != "libfake.so":
				return nil, nil
			case tr.recogniseErr != nil:
				return nil, tr.recogniseErr
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
	b.tr.bias[h.PID()] = h.Bias()
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

// Symbolize names the frame with Addr n as two frames, an inlined call and
// its caller; Addr 0 fails (the object was freed).
func (p *testProcess) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if f.Addr == 0 {
		return out, errors.New("object freed")
	}
	return append(out,
		libpf.Frame{Kind: testRuntimeID.Kind(), FunctionName: fmt.Sprintf("inlined%d", f.Addr)},
		libpf.Frame{Kind: testRuntimeID.Kind(), FunctionName: fmt.Sprintf("fn%d", f.Addr)}), nil
}

func (p *testProcess) Detach() { p.tr.detaches++ }

// jitRuntime is a runtime without a file or BPF unwinder, as the perf map
// reader is: it detects itself in a process with anonymous executable
// memory, claims that memory (walked with frame pointers) and names the
// code in it. Like the perf map reader it sets its regions again only when
// they changed.
type jitRuntime struct {
	rt                         *interpreter.Runtime
	detects, updates, detaches int
	// refuse, when set, is the reason Detect refuses every process.
	refuse string
	// notYet is how many more detections find nothing, as before a
	// process has written its perf map.
	notYet int
}

func newJITRuntime() *jitRuntime {
	j := &jitRuntime{}
	j.rt = &interpreter.Runtime{
		Name: "testjit", DisplayName: "Test JIT", RetryMin: time.Second, RetryMax: time.Second,
		Detect: func(h interpreter.Host) (interpreter.Process, error) {
			j.detects++
			if j.refuse != "" {
				return nil, interpreter.Refuse(j.refuse, errors.New("a hostile symbol file"))
			}
			rs := anonymousRegions(h.Mappings())
			if len(rs) == 0 || j.notYet > 0 {
				j.notYet--
				return nil, nil
			}
			if err := h.SetRegions(rs); err != nil {
				return nil, err
			}
			return &jitProcess{j: j, regions: rs}, nil
		},
	}
	return j
}

// anonymousRegions claims every anonymous executable mapping, named
// ([anon:NAME]) or not.
func anonymousRegions(ms []interpreter.Mapping) []interpreter.Region {
	var rs []interpreter.Region
	for _, m := range ms {
		if m.Path == "" || strings.HasPrefix(m.Path, "[anon:") {
			rs = append(rs, interpreter.Region{Start: m.Start, End: m.End})
		}
	}
	return rs
}

type jitProcess struct {
	j       *jitRuntime
	regions []interpreter.Region
}

func (p *jitProcess) Update(h interpreter.Host) (bool, error) {
	p.j.updates++
	rs := anonymousRegions(h.Mappings())
	if slices.Equal(rs, p.regions) {
		return false, nil
	}
	if err := h.SetRegions(rs); err != nil {
		return false, err
	}
	p.regions = rs
	return true, nil
}

func (p *jitProcess) SymbolizeAddr(addr uint64) (libpf.Frame, bool) {
	for _, r := range p.regions {
		if addr >= r.Start && addr < r.End {
			return libpf.Frame{Kind: libpf.FrameNative, Address: addr, FunctionName: fmt.Sprintf("jit@%#x", addr)}, true
		}
	}
	return libpf.Frame{}, false
}

func (p *jitProcess) Symbolize(support.Frame, []libpf.Frame) ([]libpf.Frame, error) {
	return nil, errors.New("no BPF frames")
}

func (p *jitProcess) Detach() { p.j.detaches++ }

// runtimeFixture is a fake procfs with two ELF files, the fake library
// (the test runtime's) and another one, and a Manager over fake unwinder
// maps whose clock is now.
type runtimeFixture struct {
	fs    *fakeProcFS
	lib   fakeLib
	other string
	maps  *unwindmapstest.Maps
	m     *Manager
	now   time.Time
}

func newRuntimeFixture(t *testing.T, rts ...*interpreter.Runtime) *runtimeFixture {
	t.Helper()
	fs := newFakeProcFS(t)
	f := &runtimeFixture{
		fs:  fs,
		lib: newFakeLib(t, fs),
		// Other bytes, so another file id.
		other: fs.writeFile("libother.so", append(filetest.OwnVDSO(t), "other"...)),
		maps:  unwindmapstest.NewMaps(),
		now:   time.Unix(1_000_000, 0),
	}
	f.m = newUnwindingManager(t, fs, f.maps, nil, rts...)
	f.m.now = func() time.Time { return f.now }
	// Timers are the test's: it advances the clock and samples itself.
	f.m.afterFunc = func(time.Duration, func()) {}
	return f
}

// otherAt maps the other file at base.
func (f *runtimeFixture) otherAt(base uint64) fakeMapping {
	return fakeMapping{start: base, end: base + 0x2000, file: f.other}
}

// convert converts a sample of pid: frames, then a native frame at pc.
func (f *runtimeFixture) convert(t *testing.T, pid uint32, pc uint64, frames ...support.Frame) *libpf.Trace {
	t.Helper()
	raw := &support.Trace{PID: pid, TID: pid, Frames: append(frames, support.Frame{Addr: pc})}
	tr, _, err := f.m.ConvertTrace(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// settle waits until the unwinder maps hold what was queued.
func (f *runtimeFixture) settle() { f.m.unwind.Wait() }

// entries counts pid's runtime configurations and mapping trie entries,
// and those of the trie entries that are runtime regions (no file).
func (f *runtimeFixture) entries(pid uint32) (configs, trie, regions int) {
	for k := range f.maps.Runtimes {
		if k.PID == pid {
			configs++
		}
	}
	for k, v := range f.maps.Mappings {
		if k.PID == pid {
			trie++
			if v.FileID == 0 {
				regions++
			}
		}
	}
	return configs, trie, regions
}

// trieAt returns the mapping trie's entry for pid at addr, as BPF's
// longest-prefix lookup finds it.
func (f *runtimeFixture) trieAt(pid uint32, addr uint64) (support.PidMapping, bool) {
	best, found := -1, support.PidMapping{}
	for k, v := range f.maps.Mappings {
		n := int(k.PrefixLen) - 32 // the key's first 32 bits are the pid
		if k.PID == pid && n > best && addr>>(64-n) == bits.ReverseBytes64(k.AddrBE)>>(64-n) {
			best, found = n, v
		}
	}
	return found, best >= 0
}

// claimedBy returns the runtime id of the region of pid at addr: -1 if
// none claims it.
func (f *runtimeFixture) claimedBy(pid uint32, addr uint64) int {
	if e, ok := f.trieAt(pid, addr); ok && e.FileID == 0 {
		return int(e.Runtime)
	}
	return -1
}

func (f *runtimeFixture) config(pid uint32, id interpreter.ID) (any, bool) {
	v, ok := f.maps.Runtimes[support.RuntimeProcKey{PID: pid, Runtime: uint32(id)}]
	return v, ok
}

func functionNamesOf(tr *libpf.Trace) []string {
	var names []string
	for _, f := range tr.Frames {
		names = append(names, f.FunctionName)
	}
	return names
}

// TestRuntimeRecognisedOncePerFile: Recognise looks at each file once, not
// once per process that maps it; each process is attached on its first
// sample with the bias of its own mapping, its configuration in the
// runtimes' map under (pid, id) and its region in the mapping trie.
func TestRuntimeRecognisedOncePerFile(t *testing.T) {
	tr := newTestRuntime()
	f := newRuntimeFixture(t, tr.rt)
	bases := map[uint32]uint64{100: 0x7f0000000000, 200: 0x7e0000000000}
	pcs := map[uint32]uint64{}
	for _, pid := range []uint32{100, 200} {
		lib, pc := f.lib.mapAt(bases[pid])
		pcs[pid] = pc
		f.fs.setProcess(pid, 1, "/bin/app", lib, f.otherAt(0x7d0000000000))
	}
	if len(tr.recognised) != 0 || tr.attaches != 0 {
		t.Fatalf("before any sample: recognised %v, %d attaches", tr.recognised, tr.attaches)
	}
	for _, pid := range []uint32{100, 200} {
		f.convert(t, pid, pcs[pid])
	}
	f.settle()
	if want := map[string]int{"libfake.so": 1, "libother.so": 1}; !maps.Equal(tr.recognised, want) {
		t.Errorf("Recognise calls by file %v, want %v", tr.recognised, want)
	}
	if tr.attaches != 2 {
		t.Errorf("%d attaches, want one per process", tr.attaches)
	}
	for _, pid := range []uint32{100, 200} {
		if got, want := tr.bias[libpf.PID(pid)], bases[pid]-f.lib.loadAddr; got != want {
			t.Errorf("pid %d attached with bias %#x, want %#x", pid, got, want)
		}
		if v, ok := f.config(pid, testRuntimeID); !ok || v != fmt.Sprint(pid) {
			t.Errorf("pid %d: configuration %v (present %v), want %q", pid, v, ok, fmt.Sprint(pid))
		}
		if owner := f.claimedBy(pid, tr.jit.Start+0x10); owner != int(testRuntimeID) {
			t.Errorf("pid %d: JIT region owned by %d, want %d", pid, owner, testRuntimeID)
		}
	}
	s := f.m.Stats()
	if s.RuntimeProcesses["testrt"] != 2 || s.RuntimeAttached["testrt"] != 2 || s.RuntimeConfigs != 2 {
		t.Errorf("stats: processes %v, attached %v, %d configurations; want 2 each",
			s.RuntimeProcesses, s.RuntimeAttached, s.RuntimeConfigs)
	}
}

// TestRuntimeAttachTriggers: whatever loads a new process's maps first
// attaches its runtime, once.
func TestRuntimeAttachTriggers(t *testing.T) {
	tests := []struct {
		name  string
		first func(f *runtimeFixture, lib fakeMapping, pc uint64)
	}{
		{"sample", func(f *runtimeFixture, _ fakeMapping, pc uint64) {
			_, _, _ = f.m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: pc}}})
		}},
		{"unknown PC", func(f *runtimeFixture, _ fakeMapping, _ uint64) { f.m.RefreshMappings(100) }},
		{"exec event", func(f *runtimeFixture, _ fakeMapping, _ uint64) { f.m.ProcessExeced(100, support.FileKey{}) }},
		{"mapping event", func(f *runtimeFixture, lib fakeMapping, _ uint64) {
			f.m.ExecMapped(100, support.ExecMapping{Start: lib.start, End: lib.end})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTestRuntime()
			f := newRuntimeFixture(t, tr.rt)
			lib, pc := f.lib.mapAt(0x7f0000000000)
			f.fs.setProcess(100, 1, "/bin/app", lib)
			tt.first(f, lib, pc)
			if _, ok := f.config(100, testRuntimeID); tr.attaches != 1 || !ok {
				t.Fatalf("%d attaches, configuration present %v; want 1 and true", tr.attaches, ok)
			}
			f.convert(t, 100, pc)
			f.m.RefreshMappings(100)
			if tr.attaches != 1 {
				t.Errorf("%d attaches after more samples, want 1", tr.attaches)
			}
		})
	}
}

// TestRuntimeFrames: each of the runtime's BPF frames becomes the frames
// its Symbolize appends, in order; one it cannot symbolize, or of a
// runtime the process has not, is named as such and counted.
func TestRuntimeFrames(t *testing.T) {
	tr := newTestRuntime()
	f := newRuntimeFixture(t, tr.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(100, 1, "/bin/app", lib)
	frame := func(id interpreter.ID, addr uint64) support.Frame { return support.Frame{Kind: id.Kind(), Addr: addr} }
	tests := []struct {
		name   string
		frames []support.Frame
		want   []string
		errors uint64
	}{
		{"inlined calls in order", []support.Frame{frame(testRuntimeID, 1), frame(testRuntimeID, 2)},
			[]string{"inlined1", "fn1", "inlined2", "fn2"}, 0},
		{"object freed", []support.Frame{frame(testRuntimeID, 1), frame(testRuntimeID, 0), frame(testRuntimeID, 3)},
			[]string{"inlined1", "fn1", "[unknown Test Runtime frame]", "inlined3", "fn3"}, 1},
		{"runtime not in the process", []support.Frame{frame(noRuntimeID, 1)},
			[]string{"[unknown runtime frame]"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.m.Stats().RuntimeFrameErrors
			got := functionNamesOf(f.convert(t, 100, pc, tt.frames...))
			if want := append(tt.want, f.lib.fn); !slices.Equal(got, want) {
				t.Errorf("frames %q, want %q", got, want)
			}
			if n := f.m.Stats().RuntimeFrameErrors - before; n != tt.errors {
				t.Errorf("%d frame errors counted, want %d", n, tt.errors)
			}
		})
	}
	_, info, err := f.m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: pc}}})
	if err != nil || info.RuntimeName != "Test Runtime" || info.RuntimeVersion != "1.0" {
		t.Errorf("process info %+v (%v), want the runtime's name and version", info, err)
	}
}

// TestRuntimeDetached: however the runtime leaves a process (its file
// unmapped, an exec, an exit, the pid reused with the exit event lost) it
// is detached exactly once and the process's configuration and regions are
// gone: the counts return to what they were before it was attached.
func TestRuntimeDetached(t *testing.T) {
	const pid = 100
	tests := []struct {
		name string
		// leave makes the runtime leave; alive says the process
		// (or its pid's successor) is still tracked after.
		leave func(f *runtimeFixture)
		alive bool
	}{
		{"file unmapped", func(f *runtimeFixture) {
			f.fs.setProcess(pid, 1, "/bin/app", f.otherAt(0x7d0000000000))
			f.now = f.now.Add(time.Minute) // past the maps re-read limit
			f.m.RefreshMappings(pid)
		}, true},
		{"exec", func(f *runtimeFixture) {
			f.fs.setProcess(pid, 1, "/bin/other", f.otherAt(0x7d0000000000))
			f.m.ProcessExeced(pid, support.FileKey{})
		}, true},
		{"exit", func(f *runtimeFixture) {
			f.fs.removeProcess(pid)
			f.m.ProcessExited(pid)
		}, false},
		{"pid reused, exit event lost", func(f *runtimeFixture) {
			f.fs.setProcess(pid, 2, "/bin/other", f.otherAt(0x7d0000000000))
			f.m.Sweep()
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTestRuntime()
			f := newRuntimeFixture(t, tr.rt)
			lib, pc := f.lib.mapAt(0x7f0000000000)
			f.fs.setProcess(pid, 1, "/bin/app", lib, f.otherAt(0x7d0000000000))
			baseConfigs, _, baseRegions := f.entries(pid)
			f.convert(t, pid, pc)
			f.settle()
			if configs, _, regions := f.entries(pid); configs != baseConfigs+1 || regions == baseRegions {
				t.Fatalf("attached: %d configurations and %d region entries, baseline %d and %d",
					configs, regions, baseConfigs, baseRegions)
			}

			tt.leave(f)
			f.settle()
			configs, trie, regions := f.entries(pid)
			if configs != baseConfigs || regions != baseRegions || tr.detaches != 1 {
				t.Errorf("after leaving: %d configurations, %d region entries, %d detaches; want %d, %d, 1",
					configs, regions, tr.detaches, baseConfigs, baseRegions)
			}
			if tt.alive != f.m.Tracks(pid) {
				t.Errorf("pid tracked %v, want %v", f.m.Tracks(pid), tt.alive)
			}
			if tt.alive && trie == 0 {
				t.Error("the other file's mapping went with the runtime")
			}
			if s := f.m.Stats(); s.RuntimeProcesses["testrt"] != 0 || s.RuntimeConfigs != 0 {
				t.Errorf("stats still count the runtime: %v, %d configurations", s.RuntimeProcesses, s.RuntimeConfigs)
			}

			f.m.ProcessExited(pid)
			f.settle()
			if configs, trie, _ := f.entries(pid); configs != baseConfigs || trie != 0 || tr.detaches != 1 {
				t.Errorf("after the exit: %d configurations, %d trie entries, %d detaches; want %d, 0, 1",
					configs, trie, tr.detaches, baseConfigs)
			}
		})
	}
}

// TestRuntimeExitsDuringAttach: the process exits while its runtime
// attaches, after it wrote its configuration and region: they are removed
// at once, the failure is counted, the next sample does not try again
// before RetryMin, and after the exit event nothing of the pid is left.
func TestRuntimeExitsDuringAttach(t *testing.T) {
	const pid = 100
	tr := newTestRuntime()
	f := newRuntimeFixture(t, tr.rt)
	tr.attach = func(h interpreter.Host) error {
		f.fs.removeProcess(uint32(h.PID()))
		_, err := h.Memory()
		if !errors.Is(err, ErrProcessExited) {
			return fmt.Errorf("the memory of an exited process: %v", err)
		}
		return fmt.Errorf("reading the runtime's state: %w", err)
	}
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(pid, 1, "/bin/app", lib)
	errorsBefore := f.m.Stats().InterpreterErrors
	f.convert(t, pid, pc)
	f.settle()
	if configs, _, regions := f.entries(pid); configs != 0 || regions != 0 {
		t.Errorf("a failed attach left %d configurations and %d region entries", configs, regions)
	}
	if n := f.m.Stats().InterpreterErrors - errorsBefore; n != 1 {
		t.Errorf("%d errors counted, want 1", n)
	}
	f.convert(t, pid, pc) // the clock did not move
	if tr.attaches != 1 || tr.detaches != 0 {
		t.Errorf("%d attaches and %d detaches, want 1 and 0", tr.attaches, tr.detaches)
	}

	f.m.ProcessExited(pid)
	f.settle()
	if configs, trie, _ := f.entries(pid); configs != 0 || trie != 0 || f.m.Tracks(pid) {
		t.Errorf("after the exit: %d configurations, %d trie entries, tracked %v", configs, trie, f.m.Tracks(pid))
	}
	f.now = f.now.Add(time.Minute)
	f.convert(t, pid, pc) // a late sample
	if tr.attaches != 1 || tr.detaches != 0 {
		t.Errorf("after a late sample: %d attaches and %d detaches, want 1 and 0", tr.attaches, tr.detaches)
	}
}

// TestRuntimeAttachRetriesPaced: a failed attach is tried again from
// RetryMin, doubling up to RetryMax, and at once when the process maps
// something new; never once it attached.
func TestRuntimeAttachRetriesPaced(t *testing.T) {
	const pid = 100
	tr := newTestRuntime() // RetryMin 1s, RetryMax 4s
	ready := false
	tr.attach = func(interpreter.Host) error {
		if !ready {
			return errors.New("the runtime has not started")
		}
		return nil
	}
	f := newRuntimeFixture(t, tr.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(pid, 1, "/bin/app", lib)
	steps := []struct {
		name    string
		advance time.Duration
		// mapsChange maps another file, ready lets the attach succeed.
		mapsChange, ready bool
		attaches          int
	}{
		{name: "first sample", attaches: 1},
		{name: "at once", attaches: 1},
		{name: "before RetryMin", advance: 999 * time.Millisecond, attaches: 1},
		{name: "at RetryMin", advance: time.Millisecond, attaches: 2},
		{name: "before twice RetryMin", advance: 1999 * time.Millisecond, attaches: 2},
		{name: "at twice RetryMin", advance: time.Millisecond, attaches: 3},
		{name: "before RetryMax", advance: 3999 * time.Millisecond, attaches: 3},
		{name: "at RetryMax", advance: time.Millisecond, attaches: 4},
		{name: "still RetryMax", advance: 4 * time.Second, attaches: 5},
		{name: "new mapping", advance: time.Second, mapsChange: true, attaches: 6},
		{name: "attached", advance: 4 * time.Second, ready: true, attaches: 7},
		{name: "not again", advance: time.Minute, attaches: 7},
	}
	for _, s := range steps {
		f.now = f.now.Add(s.advance)
		ready = s.ready
		if s.mapsChange {
			f.fs.setProcess(pid, 1, "/bin/app", lib, f.otherAt(0x7d0000000000))
			f.m.RefreshMappings(pid)
		} else {
			f.convert(t, pid, pc)
		}
		if tr.attaches != s.attaches {
			t.Fatalf("%s: %d attaches, want %d", s.name, tr.attaches, s.attaches)
		}
	}
	if s := f.m.Stats(); s.InterpreterErrors != 6 || s.RuntimeAttached["testrt"] != 1 {
		t.Errorf("%d errors and %v attached, want 6 and 1", s.InterpreterErrors, s.RuntimeAttached)
	}
}

// TestRuntimeAttachWhileStarting: an attach that fails with
// interpreter.ErrStarting is tried again after RetryMin without backing
// off and without counting an error, up to interpreter.StartingTries
// times, also when no sample comes (a timer); then it backs off as any
// failure.
func TestRuntimeAttachWhileStarting(t *testing.T) {
	const pid = 100
	tr := newTestRuntime() // RetryMin 1s, RetryMax 4s
	tr.attach = func(interpreter.Host) error {
		return fmt.Errorf("%w: no tables yet", interpreter.ErrStarting)
	}
	f := newRuntimeFixture(t, tr.rt)
	var timers []func()
	f.m.afterFunc = func(d time.Duration, fn func()) {
		if d != time.Second {
			t.Errorf("retry timer of %v, want RetryMin", d)
		}
		timers = append(timers, fn)
	}
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(pid, 1, "/bin/app", lib)
	f.convert(t, pid, pc)
	if len(timers) != 1 {
		t.Fatalf("%d retry timers, want 1", len(timers))
	}
	f.now = f.now.Add(time.Second)
	timers[0]() // no sample: the timer tries
	if tr.attaches != 2 {
		t.Fatalf("%d attaches after the timer, want 2", tr.attaches)
	}
	for i := 3; i <= interpreter.StartingTries; i++ {
		f.now = f.now.Add(time.Second)
		f.convert(t, pid, pc)
		if tr.attaches != i {
			t.Fatalf("after %d s: %d attaches, want %d", i-1, tr.attaches, i)
		}
	}
	if s := f.m.Stats(); s.InterpreterErrors != 0 {
		t.Errorf("%d errors while starting, want 0", s.InterpreterErrors)
	}
	// Then failures count and back off: 1 s, then 2 s.
	for _, want := range []int{1, 2, 2} {
		f.now = f.now.Add(time.Second)
		f.convert(t, pid, pc)
		if s := f.m.Stats(); tr.attaches != interpreter.StartingTries+want || s.InterpreterErrors != uint64(want) {
			t.Fatalf("%d attaches and %d errors, want %d and %d", tr.attaches, s.InterpreterErrors,
				interpreter.StartingTries+want, want)
		}
	}
}

// TestRuntimeRefusal: a runtime that refuses a process is counted once
// under "<runtime>/<reason>", leaves nothing in the maps and is never
// asked again, not even when the process maps something new; its
// process's traces are cached as any other's.
func TestRuntimeRefusal(t *testing.T) {
	const pid = 100
	tests := []struct {
		name string
		// setup returns the runtime and its count of attempts.
		setup  func() (*interpreter.Runtime, *int)
		reason string
	}{
		{"attach", func() (*interpreter.Runtime, *int) {
			tr := newTestRuntime()
			tr.attach = func(interpreter.Host) error {
				return interpreter.Refuse("hostile", errors.New("a hostile runtime state"))
			}
			return tr.rt, &tr.attaches
		}, "testrt/hostile"},
		{"detect", func() (*interpreter.Runtime, *int) {
			j := newJITRuntime()
			j.refuse = "symlink"
			return j.rt, &j.detects
		}, "testjit/symlink"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt, attempts := tt.setup()
			f := newRuntimeFixture(t, rt)
			h, _ := NewHandler(f.m, &recordingReporter{}, 0)
			lib, pc := f.lib.mapAt(0x7f0000000000)
			jit := fakeMapping{start: 0x50000000, end: 0x50001000}
			f.fs.setProcess(pid, 1, "/bin/app", lib, jit)
			raw := &support.Trace{PID: pid, Hash: 1, Frames: []support.Frame{{Addr: jit.start + 0x10}, {Addr: pc}}}
			h.handleNow(raw)
			h.handleNow(raw)
			if hits := h.Stats().TraceCacheHits; hits != 1 {
				t.Errorf("%d cache hits of the trace converted twice, want 1", hits)
			}
			f.now = f.now.Add(time.Minute)
			h.handleNow(raw)
			f.fs.setProcess(pid, 1, "/bin/app", lib, jit, f.otherAt(0x7d0000000000))
			f.m.RefreshMappings(pid)
			f.now = f.now.Add(time.Minute)
			h.handleNow(raw)
			f.settle()
			if *attempts != 1 {
				t.Errorf("%d attempts, want 1", *attempts)
			}
			s := f.m.Stats()
			if want := map[string]uint64{tt.reason: 1}; !maps.Equal(s.RuntimeRefusals, want) {
				t.Errorf("refusals %v, want %v", s.RuntimeRefusals, want)
			}
			if s.InterpreterErrors != 0 {
				t.Errorf("%d errors counted for a refusal", s.InterpreterErrors)
			}
			if configs, _, regions := f.entries(pid); configs != 0 || regions != 0 {
				t.Errorf("a refusal left %d configurations and %d region entries", configs, regions)
			}
		})
	}
}

// TestRuntimeRecogniseError: a file a runtime finds to be its own but
// cannot read is counted once, however many processes map it, and its
// processes are not attached.
func TestRuntimeRecogniseError(t *testing.T) {
	tr := newTestRuntime()
	tr.recogniseErr = errors.New("truncated runtime data")
	f := newRuntimeFixture(t, tr.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	for _, pid := range []uint32{100, 200} {
		f.fs.setProcess(pid, 1, "/bin/app", lib)
		f.convert(t, pid, pc)
	}
	if s := f.m.Stats(); s.InterpreterErrors != 1 || tr.attaches != 0 || tr.recognised["libfake.so"] != 1 {
		t.Errorf("%d errors, %d attaches, %d Recognise calls; want 1, 0, 1",
			s.InterpreterErrors, tr.attaches, tr.recognised["libfake.so"])
	}
}

// TestDetectedRuntime drives a runtime without a file (a perf map reader)
// through a process whose anonymous code changes: it claims each
// anonymous mapping for the native unwinder (runtime 0) and names the
// frames in it, and every change of the mappings lets it look again
// (Update), its new regions replacing the old. A claimed region outlives a
// change of its mapping's name, and a file mapped over it is the file's.
func TestDetectedRuntime(t *testing.T) {
	const pid = 100
	j := newJITRuntime()
	f := newRuntimeFixture(t, j.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	a := fakeMapping{start: 0x50000000, end: 0x50001000}
	b := fakeMapping{start: 0x58000000, end: 0x58002000}
	namedB := b
	namedB.path = "[anon:jit]"
	f.fs.setProcess(pid, 1, "/bin/app", lib, a)
	tr := f.convert(t, pid, pc, support.Frame{Addr: a.start + 0x10})
	f.settle()
	if got, want := tr.Frames[0].FunctionName, fmt.Sprintf("jit@%#x", a.start+0x10); got != want {
		t.Errorf("JIT frame named %q, want %q", got, want)
	}
	if j.detects != 1 || f.claimedBy(pid, a.start) != 0 {
		t.Fatalf("%d detects, region at %#x owned by %d; want 1 and 0 (walked with frame pointers)",
			j.detects, a.start, f.claimedBy(pid, a.start))
	}

	steps := []struct {
		name     string
		mappings []fakeMapping
		claimed  []fakeMapping
		// fileAt is an address the trie must give a file.
		fileAt uint64
	}{
		{name: "new code", mappings: []fakeMapping{lib, a, b}, claimed: []fakeMapping{a, b}},
		{name: "code freed", mappings: []fakeMapping{lib, b}, claimed: []fakeMapping{b}},
		{name: "mapping named", mappings: []fakeMapping{lib, namedB}, claimed: []fakeMapping{b}},
		{name: "file mapped over", mappings: []fakeMapping{lib, f.otherAt(b.start)}, fileAt: b.start},
	}
	for _, s := range steps {
		updates := j.updates
		f.fs.setProcess(pid, 1, "/bin/app", s.mappings...)
		f.now = f.now.Add(time.Minute) // past the maps re-read and update limits
		f.m.RefreshMappings(pid)
		f.settle()
		if j.updates == updates {
			t.Errorf("%s: no Update", s.name)
		}
		for _, mp := range []fakeMapping{a, b} {
			want := -1
			if slices.Contains(s.claimed, mp) {
				want = 0
			}
			if got := f.claimedBy(pid, mp.start+0x10); got != want {
				t.Errorf("%s: region at %#x owned by %d, want %d", s.name, mp.start, got, want)
			}
		}
		if s.fileAt != 0 {
			if e, ok := f.trieAt(pid, s.fileAt); !ok || e.FileID == 0 {
				t.Errorf("%s: trie entry at %#x %+v (found %v), want the file's", s.name, s.fileAt, e, ok)
			}
		}
		if _, _, regions := f.entries(pid); regions == 0 && len(s.claimed) > 0 {
			t.Errorf("%s: no region entries", s.name)
		}
	}

	f.m.ProcessExited(pid)
	f.settle()
	if _, trie, _ := f.entries(pid); trie != 0 || j.detaches != 1 {
		t.Errorf("after the exit: %d trie entries, %d detaches; want 0 and 1", trie, j.detaches)
	}
}

// TestVanishedProcessKeepsState: samples of a process convert after it
// exited (they wait in the ring buffer ahead of its exit event). A read
// that finds it gone, reaped or a zombie, keeps its state, so its JIT code
// is still named, and reads nothing more; the exit event frees it, or,
// when that event was lost, the next sample after vanishedGrace.
func TestVanishedProcessKeepsState(t *testing.T) {
	const pid = 100
	for _, tt := range []struct {
		name      string
		zombie    bool
		exitEvent bool
	}{
		{"reaped", false, true},
		{"zombie", true, true},
		{"exit event lost", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			j := newJITRuntime()
			f := newRuntimeFixture(t, j.rt)
			lib, pc := f.lib.mapAt(0x7f0000000000)
			code := fakeMapping{start: 0x50000000, end: 0x50001000}
			f.fs.setProcess(pid, 1, "/bin/app", lib, code)
			jit := support.Frame{Addr: code.start + 0x10}
			want := fmt.Sprintf("jit@%#x", jit.Addr)
			f.convert(t, pid, pc, jit)
			f.settle()

			if tt.zombie {
				f.fs.zombie(pid, 1)
			} else {
				f.fs.removeProcess(pid)
			}
			f.now = f.now.Add(time.Minute) // checks and updates are due
			reads := f.m.Stats().MapsReads
			for range 3 {
				if got := f.convert(t, pid, pc, jit).Frames[0].FunctionName; got != want {
					t.Fatalf("after the process was reaped its JIT frame is %q, want %q", got, want)
				}
			}
			s := f.m.Stats()
			if !f.m.Tracks(pid) || s.ProcessesVanished != 1 || s.MapsReads-reads != 1 || j.detaches != 0 {
				t.Fatalf("tracked %v, %d vanished, %d maps reads, %d detaches; want true, 1, 1, 0",
					f.m.Tracks(pid), s.ProcessesVanished, s.MapsReads-reads, j.detaches)
			}

			if tt.exitEvent {
				f.m.ProcessExited(pid)
			} else {
				f.now = f.now.Add(vanishedGrace)
				f.convert(t, pid, pc, jit)
			}
			f.settle()
			if _, trie, _ := f.entries(pid); f.m.Tracks(pid) || trie != 0 || j.detaches != 1 {
				t.Errorf("after the exit: tracked %v, %d trie entries, %d detaches; want false, 0, 1",
					f.m.Tracks(pid), trie, j.detaches)
			}
		})
	}
}

// TestMappingGoneWhileRunning: a read that fails as if the process had
// exited while it still runs (a mapping the dynamic loader unmapped
// between the maps read and opening its map_files link) drops the state,
// which the next sample reads anew; the process is not taken for gone.
func TestMappingGoneWhileRunning(t *testing.T) {
	const pid = 100
	j := newJITRuntime()
	f := newRuntimeFixture(t, j.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(pid, 1, "/bin/app", lib)
	f.convert(t, pid, pc)
	reads := f.m.Stats().MapsReads
	f.m.mu.Lock()
	f.m.procError(pid, fmt.Errorf("opening a mapping: %w", ErrProcessExited))
	f.m.mu.Unlock()
	if f.m.Tracks(pid) {
		t.Fatal("state kept after a read failed while the process runs")
	}
	if got := f.convert(t, pid, pc).Frames[0].FunctionName; got != f.lib.fn {
		t.Errorf("frame %q after the state was read anew, want %q", got, f.lib.fn)
	}
	if n := f.m.Stats().MapsReads - reads; n != 1 {
		t.Errorf("%d maps reads, want 1", n)
	}
}

// TestRuntimeSelection: a runtime the manager is not given is never asked
// about a file or a process.
func TestRuntimeSelection(t *testing.T) {
	tests := []struct {
		name          string
		file, process bool // which runtime the manager gets
	}{
		{"none", false, false},
		{"file runtime only", true, false},
		{"detected runtime only", false, true},
		{"both", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, j := newTestRuntime(), newJITRuntime()
			var rts []*interpreter.Runtime
			if tt.file {
				rts = append(rts, tr.rt)
			}
			if tt.process {
				rts = append(rts, j.rt)
			}
			f := newRuntimeFixture(t, rts...)
			lib, pc := f.lib.mapAt(0x7f0000000000)
			jit := fakeMapping{start: 0x50000000, end: 0x50001000}
			f.fs.setProcess(100, 1, "/bin/app", lib, jit)
			f.convert(t, 100, pc, support.Frame{Addr: jit.start})
			if asked := len(tr.recognised) > 0; asked != tt.file || (tr.attaches > 0) != tt.file {
				t.Errorf("file runtime: recognised %v, %d attaches", tr.recognised, tr.attaches)
			}
			if asked := j.detects > 0; asked != tt.process {
				t.Errorf("detected runtime: %d detects", j.detects)
			}
		})
	}
}

// TestRuntimeCodeAtPC: a runtime whose code ranges are taken over at the
// PC (Runtime.CodeRangesAtPC) gets them as trie entries of the file's
// mapping that name it, so BPF hands a PC there to its unwinder while the
// rest of the file is native code; they go with the mapping.
func TestRuntimeCodeAtPC(t *testing.T) {
	tr := newTestRuntime()
	tr.rt.CodeRangesAtPC = true
	f := newRuntimeFixture(t, tr.rt)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	f.fs.setProcess(100, 1, "/bin/app", lib)
	f.convert(t, 100, pc)
	f.settle()
	in, ok := f.trieAt(100, lib.start+0x10-f.lib.loadAddr)
	if !ok || in.FileID == 0 || in.Runtime != uint8(testRuntimeID) {
		t.Errorf("trie at the code range: %+v (found %v), want the file's entry naming runtime %d", in, ok, testRuntimeID)
	}
	out, ok := f.trieAt(100, lib.start+0x1000)
	if !ok || out.FileID != in.FileID || out.Runtime != 0 {
		t.Errorf("trie past the code range: %+v (found %v), want the file's entry without a runtime", out, ok)
	}
	f.fs.setProcess(100, 1, "/bin/app")
	f.m.ProcessExited(100)
	f.settle()
	if configs, trie, _ := f.entries(100); configs != 0 || trie != 0 {
		t.Errorf("%d configurations and %d trie entries after the exit, want none", configs, trie)
	}
}

// TestRuntimeAttachedLater: a trace converted before its process's runtime
// attached (the process was read before it wrote its perf map) is
// converted again once the runtime attaches, not served from the cache
// with its JIT frame unnamed.
func TestRuntimeAttachedLater(t *testing.T) {
	const pid = 100
	j := newJITRuntime()
	j.notYet = 1
	f := newRuntimeFixture(t, j.rt)
	rec := &recordingReporter{}
	h, _ := NewHandler(f.m, rec, 0)
	lib, pc := f.lib.mapAt(0x7f0000000000)
	jit := fakeMapping{start: 0x50000000, end: 0x50001000}
	f.fs.setProcess(pid, 1, "/bin/app", lib, jit)
	raw := &support.Trace{PID: pid, Hash: 1, Frames: []support.Frame{{Addr: jit.start + 0x10}, {Addr: pc}}}
	h.handleNow(raw)
	if name := rec.last(t).trace.Frames[0].FunctionName; name == "jit@0x50000010" {
		t.Fatalf("JIT frame named %q before the runtime attached", name)
	}
	f.now = f.now.Add(j.rt.RetryMax) // the next detection is due
	h.handleNow(raw)
	if j.detects != 2 {
		t.Fatalf("%d detections, want 2", j.detects)
	}
	if name := rec.last(t).trace.Frames[0].FunctionName; name != "jit@0x50000010" {
		t.Errorf("JIT frame named %q once the runtime attached, want jit@0x50000010", name)
	}
}

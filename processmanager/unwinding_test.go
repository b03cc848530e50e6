package processmanager

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwindSyncFollowsProcesses: the manager mirrors a process's file
// mappings into the trie and loads the file's deltas once for two
// processes; exits remove everything again.
func TestUnwindSyncFollowsProcesses(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	first, fnAbs := lib.mapAt(0x7f0000000000)
	second, _ := lib.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/app", first)
	fs.setProcess(200, 1, "/bin/app", second)

	maps := unwindmapstest.NewMaps()
	extractions := 0
	u := testUnwinding(maps, &extractions)
	// aged moves the clock of idle files past any time they are kept.
	var aged atomic.Bool
	u.Now = func() time.Time {
		if aged.Load() {
			return time.Now().Add(time.Hour)
		}
		return time.Now()
	}
	m := newManagerWith(t, fs, u)
	for _, pid := range []uint32{100, 200} {
		if _, _, err := m.ConvertTrace(&support.Trace{PID: pid, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
			t.Fatal(err)
		}
	}
	m.unwind.Wait()
	if extractions != 1 {
		t.Errorf("%d extractions of one file, want 1", extractions)
	}
	if len(maps.Pages) == 0 {
		t.Fatal("no delta pages loaded")
	}
	trie := map[uint32]int{}
	for k, v := range maps.Mappings {
		trie[k.PID]++
		if v.FileID == 0 {
			t.Errorf("trie entry %+v without a file id", k)
		}
	}
	if trie[100] == 0 || trie[200] == 0 {
		t.Fatalf("trie entries per pid: %v", trie)
	}
	res := m.Stats().DeltasResident
	if want := (unwindmaps.DeltaResidency{Files: 1, Deltas: len(maps.Deltas), Pages: len(maps.Pages), Rules: 1,
		MappingPrefixes: len(maps.Mappings), Mappings: 2}); res != want {
		t.Errorf("resident %+v, want %+v", res, want)
	}

	m.ProcessExited(100)
	m.unwind.Wait()
	if len(maps.Pages) == 0 {
		t.Error("deltas unloaded while pid 200 still maps the file")
	}
	m.ProcessExited(200)
	m.unwind.Wait()
	if len(maps.Mappings) != 0 {
		t.Errorf("left behind: %d trie entries", len(maps.Mappings))
	}
	if res := m.Stats().DeltasResident; res.Files != 1 || res.IdleFiles != 1 || res.Mappings != 0 || res.MappingPrefixes != 0 {
		t.Errorf("after the exits: %+v, want the file idle and no mappings", res)
	}
	// Once idle long enough, the next job unloads it.
	aged.Store(true)
	m.unwind.Forget(300)
	m.unwind.Wait()
	if len(maps.Pages) != 0 {
		t.Errorf("left behind: %d pages", len(maps.Pages))
	}
	if s := m.Stats(); s.DeltaFilesLoaded != 1 || s.DeltaLoadErrors != 0 || s.DeltasResident != (unwindmaps.DeltaResidency{Rules: 1}) {
		t.Errorf("stats %+v", s)
	}
}

// TestExecMappedAddsMapping: a mapping BPF reports joins the process's
// state and the trie without a read of its maps, and BPF learns the file's
// kernel name.
func TestExecMappedAddsMapping(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	first, fnAbs := lib.mapAt(0x7f0000000000)
	second, _ := lib.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/app", first)
	maps := unwindmapstest.NewMaps()
	m := newUnwindingManager(t, fs, maps, nil)
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	m.unwind.Wait()
	// The process maps the library a second time.
	fs.setProcess(100, 1, "/bin/app", first, second)
	m.ExecMapped(100, support.ExecMapping{Start: second.start, End: second.end, Offset: second.offset, Dev: 7, Ino: 42})
	m.ExecMapped(100, support.ExecMapping{Start: 0x1000, End: 0x2000, Dev: 7, Ino: 43}) // already unmapped
	m.unwind.Wait()

	if s := m.Stats(); s.MapsReads != 1 || s.MappingsAdded != 1 || s.ProcessesVanished != 0 {
		t.Errorf("stats %+v: want one maps read and one mapping added", s)
	}
	if !m.Tracks(100) {
		t.Fatal("process forgotten after a mapping that was gone")
	}
	if got := m.Stats().DeltasResident.Mappings; got != 2 {
		t.Errorf("%d mappings in the trie, want 2", got)
	}
	if _, ok := maps.Known[support.NewFileKey(7, 42)]; !ok {
		t.Errorf("known files %v lack the reported one", maps.Known)
	}
}

// newUnwindingManager returns a Manager over fs that loads into maps one
// delta per file, counting extractions in *extractions when it is set.
func newUnwindingManager(t *testing.T, fs *fakeProcFS, maps *unwindmapstest.Maps, extractions *int,
	runtimes ...*interpreter.Runtime) *Manager {
	t.Helper()
	return newManagerWith(t, fs, testUnwinding(maps, extractions), runtimes...)
}

// newManagerWith returns a Manager over fs that keeps the unwinder's maps
// as u says.
func newManagerWith(t *testing.T, fs *fakeProcFS, u *unwindmaps.Unwinding, runtimes ...*interpreter.Runtime) *Manager {
	t.Helper()
	// Lines off (newLinesHandler's tests have them): the debug files'
	// reader settling between two traces would convert a cached trace
	// again.
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger(), DebugInfoBytes: -1,
		Unwinding: u, Runtimes: runtimes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// testUnwinding loads into maps one delta per file, counting extractions in
// *extractions when it is set.
func testUnwinding(maps *unwindmapstest.Maps, extractions *int) *unwindmaps.Unwinding {
	extract := func(io.ReaderAt) (nativeunwind.Deltas, error) {
		if extractions != nil {
			*extractions++
		}
		return nativeunwind.Deltas{{Address: 0, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}}}, nil
	}
	return &unwindmaps.Unwinding{Maps: maps, Capacity: support.DeltaCapacity{Rules: 8, Deltas: 1024, PageBits: 16},
		Extract: extract, Runtimes: maps}
}

// TestExecOfKnownProgramReadAtFirstSample: with ReadAtFirstSample, an exec
// of a program whose deltas are loaded reads nothing, nor do its mapping
// events or its exit; its first sample reads it. An unknown program is
// read at once.
func TestExecOfKnownProgramReadAtFirstSample(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mp, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mp)
	maps := unwindmapstest.NewMaps()
	m := newUnwindingManager(t, fs, maps, nil)
	m.unwinding.ReadAtFirstSample = true
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	m.unwind.Wait()
	if len(maps.Known) != 1 {
		t.Fatalf("known files %v, want the library's", maps.Known)
	}
	var program support.FileKey
	for k, v := range maps.Known {
		program = k
		if v.FileID == 0 {
			t.Errorf("known file %+v without a file id", v)
		}
	}

	before := m.Stats()
	fs.setProcess(300, 7, "/bin/app", mp)
	m.ProcessExeced(300, program)
	m.ExecMapped(300, support.ExecMapping{Start: mp.start, End: mp.end})
	if s := m.Stats(); m.Tracks(300) || s.MapsReads != before.MapsReads || s.ExecsDeferred != 1 {
		t.Errorf("exec of a known program: tracked %v, maps reads %d -> %d, deferred %d; want nothing read",
			m.Tracks(300), before.MapsReads, s.MapsReads, s.ExecsDeferred)
	}
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 300, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	if s := m.Stats(); !m.Tracks(300) || s.MapsReads != before.MapsReads+1 {
		t.Errorf("first sample: tracked %v, maps reads %d; want it read once", m.Tracks(300), s.MapsReads-before.MapsReads)
	}

	// An exec'd process that exits unsampled leaves nothing behind.
	fs.setProcess(400, 8, "/bin/app", mp)
	m.ProcessExeced(400, program)
	fs.removeProcess(400)
	m.ProcessExited(400)
	if _, ok := m.unread.Get(400); ok || m.Tracks(400) {
		t.Error("state kept for an unsampled process after its exit")
	}

	// A program BPF does not know is read at once.
	fs.setProcess(500, 9, "/bin/app", mp)
	m.ProcessExeced(500, support.FileKey{Dev: 1, Ino: 2})
	if !m.Tracks(500) {
		t.Error("exec of an unknown program not read at once")
	}
	// Without ReadAtFirstSample every exec is read at once.
	m.unwinding.ReadAtFirstSample = false
	fs.setProcess(600, 10, "/bin/app", mp)
	m.ProcessExeced(600, program)
	if !m.Tracks(600) {
		t.Error("exec not read at once without ReadAtFirstSample")
	}
}

// fakeTracked records what the manager says of the processes it tracks.
type fakeTracked struct {
	filtering bool
	pids      map[uint32]bool
}

func (f *fakeTracked) FilterProcessEvents() error { f.filtering = true; return nil }
func (f *fakeTracked) TrackProcess(pid uint32)    { f.pids[pid] = true }
func (f *fakeTracked) UntrackProcess(pid uint32)  { delete(f.pids, pid) }

// TestTrackedProcesses: with ReadAtFirstSample, BPF's process event filter
// holds exactly the processes the manager keeps state for: added before
// a process is read, removed when it is forgotten (exit or exec), never
// the idle task. Without ReadAtFirstSample the filter stays off.
func TestTrackedProcesses(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	mp, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", mp)
	newManager := func(readAtFirstSample bool) (*Manager, *fakeTracked) {
		tracked := &fakeTracked{pids: map[uint32]bool{}}
		maps := unwindmapstest.NewMaps()
		m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger(),
			Unwinding: &unwindmaps.Unwinding{Maps: maps, Capacity: support.DeltaCapacity{Rules: 8, Deltas: 1024, PageBits: 16},
				Extract: func(io.ReaderAt) (nativeunwind.Deltas, error) { return nil, nil }, Runtimes: maps,
				ReadAtFirstSample: readAtFirstSample, Tracked: tracked}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		return m, tracked
	}

	m, tracked := newManager(true)
	if !tracked.filtering {
		t.Fatal("filter not turned on")
	}
	for _, pid := range []uint32{100, 0} {
		if _, _, err := m.ConvertTrace(&support.Trace{PID: pid, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
			t.Fatal(err)
		}
	}
	if !tracked.pids[100] || tracked.pids[0] || len(tracked.pids) != 1 {
		t.Errorf("tracked %v after samples of 100 and the idle task, want {100}", tracked.pids)
	}
	m.ProcessExeced(100, support.FileKey{Dev: 1, Ino: 2}) // unknown program: read again
	if !tracked.pids[100] {
		t.Error("a process read again after exec is not tracked")
	}
	fs.removeProcess(100)
	m.ProcessExited(100)
	if len(tracked.pids) != 0 {
		t.Errorf("tracked %v after the exit, want none", tracked.pids)
	}

	fs.setProcess(100, 1, "/bin/app", mp)
	m, tracked = newManager(false)
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	if tracked.filtering || len(tracked.pids) != 0 {
		t.Errorf("without ReadAtFirstSample: filtering %v, tracked %v; want the filter off", tracked.filtering, tracked.pids)
	}
}

// TestHugeMappingTable: a process with more executable mappings than
// MaxEagerMappings (one file mapped over and over) has its file opened
// once and none of them handed to the unwinder when read; a sample in one
// hands that one over, and an unknown-PC report in another hands it over
// without reading the maps again.
func TestHugeMappingTable(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	var mappings []fakeMapping
	var pcs []uint64
	for i := range MaxEagerMappings + 10 {
		mp, pc := lib.mapAt(0x7f0000000000 + uint64(i)*0x10000)
		mappings = append(mappings, mp)
		pcs = append(pcs, pc)
	}
	fs.setProcess(100, 1, "/bin/app", mappings...)
	maps := unwindmapstest.NewMaps()
	m := newUnwindingManager(t, fs, maps, nil)

	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: pcs[7]}}}); err != nil {
		t.Fatal(err)
	}
	m.unwind.Wait()
	s := m.Stats()
	if s.DeltaMappingsDeferred != uint64(len(mappings)) || s.FileCacheMisses != 1 {
		t.Errorf("deferred %d mappings (want %d), file cache misses %d (want 1)",
			s.DeltaMappingsDeferred, len(mappings), s.FileCacheMisses)
	}
	if got := s.DeltasResident.Mappings; got != 1 {
		t.Errorf("%d mappings in the trie after a sample in one, want 1", got)
	}
	reads := s.MapsReads
	m.UnknownPC(100, pcs[3])
	m.unwind.Wait()
	if s := m.Stats(); s.DeltasResident.Mappings != 2 || s.MapsReads != reads {
		t.Errorf("after an unknown PC in a known mapping: %d in the trie (want 2), %d maps reads (want none)",
			s.DeltasResident.Mappings, s.MapsReads-reads)
	}
	// A PC outside every mapping reads the maps again.
	m.UnknownPC(100, 0x1000)
	if s := m.Stats(); s.MapsReads == reads && s.MapsRereadsLimited == 0 {
		t.Error("an unknown PC outside every mapping neither read the maps nor was rate limited")
	}
}

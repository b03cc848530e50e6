package processmanager

import (
	"io"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
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

	maps := newFakeDeltaMaps()
	extractions := 0
	m := newUnwindingManager(t, fs, maps, &extractions)
	for _, pid := range []uint32{100, 200} {
		if _, _, err := m.ConvertTrace(&support.Trace{PID: pid, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
			t.Fatal(err)
		}
	}
	m.unwind.wait()
	if extractions != 1 {
		t.Errorf("%d extractions of one file, want 1", extractions)
	}
	if len(maps.pages) == 0 {
		t.Fatal("no delta pages loaded")
	}
	trie := map[uint32]int{}
	for k, v := range maps.mappings {
		trie[k.PID]++
		if v.FileID == 0 {
			t.Errorf("trie entry %+v without a file id", k)
		}
	}
	if trie[100] == 0 || trie[200] == 0 {
		t.Fatalf("trie entries per pid: %v", trie)
	}
	res := m.Stats().DeltasResident
	if want := (DeltaResidency{Files: 1, Deltas: len(maps.deltas), Pages: len(maps.pages), Rules: 1,
		MappingPrefixes: len(maps.mappings), Mappings: 2}); res != want {
		t.Errorf("resident %+v, want %+v", res, want)
	}

	m.ProcessExited(100)
	m.unwind.wait()
	if len(maps.pages) == 0 {
		t.Error("deltas unloaded while pid 200 still maps the file")
	}
	m.ProcessExited(200)
	m.unwind.wait()
	if len(maps.mappings) != 0 {
		t.Errorf("left behind: %d trie entries", len(maps.mappings))
	}
	if res := m.Stats().DeltasResident; res.Files != 1 || res.IdleFiles != 1 || res.Mappings != 0 || res.MappingPrefixes != 0 {
		t.Errorf("after the exits: %+v, want the file idle and no mappings", res)
	}
	// Once idle long enough, the next job unloads it.
	m.unwind.loader.now = func() time.Time { return time.Now().Add(idleFileKeep) }
	m.unwind.forget(300)
	m.unwind.wait()
	if len(maps.pages) != 0 {
		t.Errorf("left behind: %d pages", len(maps.pages))
	}
	if s := m.Stats(); s.DeltaFilesLoaded != 1 || s.DeltaLoadErrors != 0 || s.DeltasResident != (DeltaResidency{Rules: 1}) {
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
	maps := newFakeDeltaMaps()
	m := newUnwindingManager(t, fs, maps, nil)
	if _, _, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: fnAbs}}}); err != nil {
		t.Fatal(err)
	}
	m.unwind.wait()
	// The process maps the library a second time.
	fs.setProcess(100, 1, "/bin/app", first, second)
	m.ExecMapped(100, support.ExecMapping{Start: second.start, End: second.end, Offset: second.offset, Dev: 7, Ino: 42})
	m.ExecMapped(100, support.ExecMapping{Start: 0x1000, End: 0x2000, Dev: 7, Ino: 43}) // already unmapped
	m.unwind.wait()

	if s := m.Stats(); s.MapsReads != 1 || s.MappingsAdded != 1 || s.ProcessesVanished != 0 {
		t.Errorf("stats %+v: want one maps read and one mapping added", s)
	}
	if !m.Tracks(100) {
		t.Fatal("process forgotten after a mapping that was gone")
	}
	if got := m.Stats().DeltasResident.Mappings; got != 2 {
		t.Errorf("%d mappings in the trie, want 2", got)
	}
	if _, ok := maps.known[support.NewFileKey(7, 42)]; !ok {
		t.Errorf("known files %v lack the reported one", maps.known)
	}
}

// newUnwindingManager returns a Manager over fs that loads into maps one
// delta per file, counting extractions in *extractions when it is set.
func newUnwindingManager(t *testing.T, fs *fakeProcFS, maps *fakeDeltaMaps, extractions *int,
	runtimes ...*interpreter.Runtime) *Manager {
	t.Helper()
	extract := func(io.ReaderAt) (nativeunwind.Deltas, error) {
		if extractions != nil {
			*extractions++
		}
		return nativeunwind.Deltas{{Address: 0, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}}}, nil
	}
	m, err := New(Config{ProcFS: fs.root, SysFS: t.TempDir(), Logger: quietLogger(),
		Unwinding: &Unwinding{Maps: maps, Capacity: support.DeltaCapacity{Rules: 8, Deltas: 1024, PageBits: 16},
			Extract: extract, Runtimes: maps}, Runtimes: runtimes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

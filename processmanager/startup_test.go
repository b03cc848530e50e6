package processmanager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
)

// setCPUTime rewrites a fake process's stat with ticks of user time.
func (f *fakeProcFS) setCPUTime(pid uint32, startTime, ticks uint64) {
	f.t.Helper()
	stat := fmt.Sprintf("%d (fake) R 1 1 1 0 -1 0 0 0 0 0 %d 0 0 0 20 0 1 0 %d 0 0\n", pid, ticks, startTime)
	if err := os.WriteFile(filepath.Join(f.root, fmt.Sprint(pid), "stat"), []byte(stat), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func TestBusySince(t *testing.T) {
	before := CPUTimes{procs: map[uint32]procCPU{1: {10, 100}, 2: {10, 100}, 3: {10, 100}, 4: {10, 100}}}
	now := CPUTimes{procs: map[uint32]procCPU{
		1: {10, 100}, // idle
		2: {10, 130}, // 30 ticks
		3: {20, 5},   // the pid was reused: 5 ticks
		4: {10, 400}, // 300 ticks
		5: {30, 50},  // new: 50 ticks
		6: {30, 0},   // new and idle
	}}
	if got, want := busySince(before, now), []uint32{4, 5, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("busy %v, want %v (busiest first)", got, want)
	}
}

// oneBusyProcess makes processes 100 and 200, each mapping a copy of one
// library, of which 100 used CPU time since the returned times were read
// (minBusyWindow ago).
func oneBusyProcess(t *testing.T) (*fakeProcFS, CPUTimes) {
	t.Helper()
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	busy, _ := lib.mapAt(0x7f0000000000)
	other, _ := lib.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/busy", busy)
	fs.setProcess(200, 1, "/bin/other", other)
	fs.setCPUTime(100, 1, 7)
	fs.setCPUTime(200, 1, 7)
	before := ReadCPUTimes(fs.root)
	before.at = time.Now().Add(-minBusyWindow)
	fs.setCPUTime(100, 1, 40)
	return fs, before
}

// TestPrepareBusy: the processes that used CPU time are read and their
// deltas loaded before PrepareBusy returns; an idle one is left for its
// first sample.
func TestPrepareBusy(t *testing.T) {
	fs, before := oneBusyProcess(t)
	maps := unwindmapstest.NewMaps()
	m := newUnwindingManager(t, fs, maps, nil)
	got := m.PrepareBusy(context.Background(), before)
	if got.Busy != 1 || got.Prepared != 1 || !got.Complete {
		t.Errorf("prepared %+v, want 1 of 1 busy process, complete", got)
	}
	if !m.Tracks(100) || m.Tracks(200) {
		t.Errorf("tracked: busy %v, idle %v; want the busy process only", m.Tracks(100), m.Tracks(200))
	}
	if res := m.Stats().DeltasResident; res.Files != 1 || res.Mappings != 1 {
		t.Errorf("resident %+v, want the busy process's file loaded and mapped", res)
	}
}

// mapsHook calls onMaps before each maps read.
type mapsHook struct {
	proc.Source
	onMaps func(pid uint32)
}

func (h mapsHook) Maps(pid uint32, which proc.Mappings) ([]proc.MapsEntry, error) {
	h.onMaps(pid)
	return h.Source.Maps(pid, which)
}

// TestPrepareBusyLooksAgain: a process that got no clock tick before the
// first look (many processes sharing the CPUs) but did while the first
// busy one was set up is set up too.
func TestPrepareBusyLooksAgain(t *testing.T) {
	fs, before := oneBusyProcess(t)
	src := mapsHook{Source: proc.FS{Mount: fs.root}, onMaps: func(pid uint32) {
		if pid == 100 {
			fs.setCPUTime(200, 1, 9)
		}
	}}
	m, err := New(Config{ProcFS: fs.root, ProcessSource: src, SysFS: t.TempDir(), Logger: quietLogger(),
		DebugInfoBytes: -1, Unwinding: testUnwinding(unwindmapstest.NewMaps(), nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if got := m.PrepareBusy(context.Background(), before); got.Busy != 2 || got.Prepared != 2 {
		t.Errorf("prepared %+v, want both processes", got)
	}
	if !m.Tracks(100) || !m.Tracks(200) {
		t.Errorf("tracked: first %v, later %v; want both", m.Tracks(100), m.Tracks(200))
	}
}

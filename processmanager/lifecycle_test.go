package processmanager

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/support"
)

// blockingSource holds up the opening of pid's files until release is
// closed, as a large binary being read would; entered is closed when the
// first such open starts.
type blockingSource struct {
	proc.Source
	pid      uint32
	entered  chan struct{}
	release  chan struct{}
	enterOne sync.Once
}

func (b *blockingSource) OpenMapping(pid uint32, e *proc.MapsEntry) (*os.File, error) {
	if pid == b.pid {
		b.enterOne.Do(func() { close(b.entered) })
		<-b.release
	}
	return b.Source.OpenMapping(pid, e)
}

// lockedReporter records samples reported from any goroutine.
type lockedReporter struct {
	mu      sync.Mutex
	samples []sample
}

func (r *lockedReporter) ReportSample(t *libpf.Trace, m *libpf.SampleMeta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, sample{t, m})
}

func (r *lockedReporter) taken() []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sample(nil), r.samples...)
}

// blockedHandler is a Handler whose source holds up the opening of a
// pid's files (blockingSource; set its pid when the hold should start) and
// a reporter safe for the lifecycle's goroutine. release lets the opens go
// (once; also at cleanup, before the Handler closes, if a test failed
// holding them up). debugInfoBytes is Config.DebugInfoBytes (-1: no lines).
type blockedHandler struct {
	h       *Handler
	src     *blockingSource
	rep     *lockedReporter
	release func()
}

func newBlockedHandler(t *testing.T, fs *fakeProcFS, pid uint32, debugInfoBytes int64) blockedHandler {
	t.Helper()
	src := &blockingSource{Source: proc.FS{Mount: fs.root}, pid: pid,
		entered: make(chan struct{}), release: make(chan struct{})}
	m, err := New(Config{ProcessSource: src, SysFS: t.TempDir(), Logger: quietLogger(), DebugInfoBytes: debugInfoBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	rep := &lockedReporter{}
	h, err := NewHandler(m, rep, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	var once sync.Once
	release := func() { once.Do(func() { close(src.release) }) }
	t.Cleanup(release)
	return blockedHandler{h: h, src: src, rep: rep, release: release}
}

// nativeTrace is a trace of pid's main thread with one native frame.
func nativeTrace(pid uint32, hash uint64, addr uint64) *support.Trace {
	return &support.Trace{PID: pid, TID: pid, Comm: "app", Hash: hash,
		Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: addr}}}
}

// TestSetUpLeavesConversion: while a new process's files are read (held up
// here), traces of a process already set up are converted and reported at
// once, and the new process's traces wait for its set-up, then come out in
// their order, symbolized. So does a trace behind an exec event: it is
// converted with the state the exec made.
func TestSetUpLeavesConversion(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	known, fnKnown := lib.mapAt(0x7f0000000000)
	fresh, fnFresh := lib.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/known", known)
	fs.setProcess(200, 1, "/bin/fresh", fresh)
	fs.setProcess(300, 1, "/bin/before", known)

	b := newBlockedHandler(t, fs, 200, -1)
	h, src, rep, trace := b.h, b.src, b.rep, nativeTrace
	h.HandleTrace(trace(100, 1, fnKnown))
	h.HandleTrace(trace(300, 2, fnKnown))
	h.Flush()

	h.HandleTrace(trace(200, 3, fnFresh))
	<-src.entered // its set-up is reading its file
	h.HandleTrace(trace(200, 4, fnFresh+1))
	fs.setProcess(300, 1, "/bin/after", fresh)
	h.ProcessExeced(300, support.FileKey{})
	h.HandleTrace(trace(300, 5, fnFresh))
	h.HandleTrace(trace(100, 6, fnKnown+1))
	got := rep.taken()
	if len(got) != 3 || got[2].trace.Frames[0].FunctionName != lib.fn {
		t.Fatalf("%d samples reported while a set-up reads, want the 2 before and the known process's one, named", len(got))
	}
	b.release()
	h.Flush()
	got = rep.taken()[3:]
	if len(got) != 3 {
		t.Fatalf("%d samples reported after the set-up, want 3", len(got))
	}
	for i, want := range []struct {
		pid  libpf.PID
		exe  string
		addr uint64
	}{{200, "/bin/fresh", fnFresh}, {200, "/bin/fresh", fnFresh + 1}, {300, "/bin/after", fnFresh}} {
		s := got[i]
		f := s.trace.Frames[0]
		if s.meta.Process.PID != want.pid || s.meta.Process.ExecutablePath != want.exe ||
			f.FunctionName != lib.fn || f.Mapping == nil || f.Mapping.Start != fresh.start {
			t.Errorf("sample %d: process %+v, frame %+v; want pid %d of %s in the mapping at %#x",
				i, s.meta.Process, f, want.pid, want.exe, fresh.start)
		}
	}
	if s := h.Stats().Lifecycle; s.TracesQueued != 5 || s.QueuedTracesPeak < 2 || s.Queue != 0 {
		t.Errorf("lifecycle stats %+v, want 5 traces queued (3 first samples, 1 behind a set-up, 1 behind an exec)", s)
	}
}

// TestLifecycleQueueBound: a pump that hands over more traces than the
// lifecycle holds waits for room (counted) and loses none.
func TestLifecycleQueueBound(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var done []uint64
	l := newLifecycle(func(it *lifecycleItem) {
		<-release
		mu.Lock()
		done = append(done, it.trace.Hash)
		mu.Unlock()
	})
	defer l.close()
	queued := make(chan struct{})
	go func() {
		defer close(queued)
		for i := range maxQueuedTraces + 2 {
			l.queueTrace(&support.Trace{PID: 1, Hash: uint64(i)})
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for l.stats().QueueFullWaits == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if l.stats().QueueFullWaits == 0 {
		t.Fatal("the pump never waited for room")
	}
	close(release)
	<-queued
	l.flush()
	if len(done) != maxQueuedTraces+2 {
		t.Fatalf("%d traces done, want %d", len(done), maxQueuedTraces+2)
	}
	for i, hash := range done {
		if hash != uint64(i) {
			t.Fatalf("trace %d done as the %dth", hash, i)
		}
	}
	if s := l.stats(); s.QueuedTracesPeak != maxQueuedTraces || s.QueueFullWaits != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestMappedFileReadLeavesConversion: the file of a process's new mapping
// (a dlopen of a large library) is read before the manager's lock, so a
// known process's traces are converted meanwhile; then the new mapping's
// frames are named.
func TestMappedFileReadLeavesConversion(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	first, fnFirst := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, "/bin/app", first)
	fs.setProcess(300, 1, "/bin/other", first)
	b := newBlockedHandler(t, fs, 0, -1)
	h, src, rep, trace := b.h, b.src, b.rep, nativeTrace
	h.HandleTrace(trace(100, 1, fnFirst))
	h.HandleTrace(trace(300, 2, fnFirst))
	h.Flush()

	// A copy of the library, a file of its own, mapped later.
	image, err := os.ReadFile(lib.path)
	if err != nil {
		t.Fatal(err)
	}
	second := lib
	second.path = fs.writeFile("libsecond.so", image)
	mapped, fnMapped := second.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/app", first, mapped)
	st, err := os.Stat(second.path)
	if err != nil {
		t.Fatal(err)
	}
	src.pid = 100 // from here on its files' opens are held up
	h.ExecMapped(100, support.ExecMapping{Start: mapped.start, End: mapped.end, Dev: 0xfe00, Ino: st.Sys().(*syscall.Stat_t).Ino})
	<-src.entered
	reported := make(chan struct{})
	go func() {
		h.HandleTrace(trace(300, 3, fnFirst+1))
		close(reported)
	}()
	select {
	case <-reported:
	case <-time.After(10 * time.Second):
		t.Fatal("a known process's trace waited for another's new mapping's file")
	}
	if got := rep.taken(); len(got) != 3 || got[2].meta.Process.PID != 300 {
		t.Fatalf("%d samples reported while the mapping's file was read, want the known process's", len(got))
	}
	b.release()
	h.Flush()
	h.HandleTrace(trace(100, 4, fnMapped))
	h.Flush()
	got := rep.taken()
	if f := got[len(got)-1].trace.Frames[0]; f.FunctionName != lib.fn || f.Mapping == nil || f.Mapping.Start != mapped.start {
		t.Errorf("frame in the new mapping %+v, want %s in the mapping at %#x", f, lib.fn, mapped.start)
	}
	if s := h.Stats(); s.MappingsAdded != 1 {
		t.Errorf("stats %+v, want one mapping added", s)
	}
}

// TestLinesOpenLeavesConversion: the first trace of a known process with a
// frame in a file whose source lines were never looked up converts at once;
// the file is opened through the process's mapping in the background (held
// up here), and the trace is converted again with lines once that is done.
func TestLinesOpenLeavesConversion(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	image, err := os.ReadFile(lib.path)
	if err != nil {
		t.Fatal(err)
	}
	first, fnFirst := lib.mapAt(0x7f0000000000)
	other := lib
	other.path = fs.writeFile("libother.so", append(image, "another file"...))
	second, fnSecond := other.mapAt(0x7e0000000000)
	fs.setProcess(100, 1, "/bin/app", first, second)
	b := newBlockedHandler(t, fs, 0, 0)
	h, src, rep, m := b.h, b.src, b.rep, b.h.m
	trace := func(hash uint64, addr uint64) *support.Trace { return nativeTrace(100, hash, addr) }
	h.HandleTrace(trace(1, fnFirst))
	h.Flush()
	m.lines.wait()

	src.pid = 100 // from here on its files' opens are held up
	reported := make(chan struct{})
	go func() {
		h.HandleTrace(trace(2, fnSecond))
		close(reported)
	}()
	select {
	case <-reported:
	case <-time.After(10 * time.Second):
		t.Fatal("a known process's trace waited for its file's lines to be opened")
	}
	<-src.entered
	if got := rep.taken(); len(got) != 2 || got[1].trace.Frames[0].FunctionName != lib.fn {
		t.Fatalf("%d samples reported while the file was opened, want 2, the second named", len(got))
	}
	b.release()
	m.lines.wait()
	h.HandleTrace(trace(2, fnSecond))
	h.Flush()
	if s := h.Stats(); s.TraceCacheMisses != 3 {
		t.Errorf("stats %+v: want the trace converted again once its file was opened (3 conversions)", s)
	}
}

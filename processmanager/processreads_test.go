package processmanager

import (
	"context"
	"io"
	"maps"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

// countingSource counts the calls into a Source, by method. The delta
// loader reads mappings on its own goroutine, hence the lock.
type countingSource struct {
	proc.Source
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingSource) count(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[method]++
}

// take returns the calls counted so far and starts counting anew.
func (c *countingSource) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

func (c *countingSource) Stat(pid uint32) (proc.Stat, error) {
	c.count("Stat")
	return c.Source.Stat(pid)
}

func (c *countingSource) Maps(pid uint32, which proc.Mappings) ([]proc.MapsEntry, error) {
	c.count("Maps")
	return c.Source.Maps(pid, which)
}

func (c *countingSource) Info(pid uint32, comm string) *libpf.ProcessInfo {
	c.count("Info")
	return c.Source.Info(pid, comm)
}

func (c *countingSource) Executable(pid uint32) (string, error) {
	c.count("Executable")
	return c.Source.Executable(pid)
}

func (c *countingSource) OpenMapping(pid uint32, e *proc.MapsEntry) (*os.File, error) {
	c.count("OpenMapping")
	return c.Source.OpenMapping(pid, e)
}

func (c *countingSource) MappingPath(pid uint32, start, end uint64) (string, bool, error) {
	c.count("MappingPath")
	return c.Source.MappingPath(pid, start, end)
}

func (c *countingSource) OpenMemory(pid uint32) (proc.ReadAtCloser, error) {
	c.count("OpenMemory")
	return c.Source.OpenMemory(pid)
}

func (c *countingSource) NamespacePID(pid uint32) (uint32, error) {
	c.count("NamespacePID")
	return c.Source.NamespacePID(pid)
}

func (c *countingSource) Root(pid uint32) string {
	c.count("Root")
	return c.Source.Root(pid)
}

func (c *countingSource) PIDs() ([]uint32, error) {
	c.count("PIDs")
	return c.Source.PIDs()
}

func (c *countingSource) Kallsyms() (io.ReadCloser, error) {
	c.count("Kallsyms")
	return c.Source.Kallsyms()
}

// TestKnownProcessReadsNothing: once a process's first trace has read it
// (its stat, description, maps and files), converting its traces reads
// nothing more from it until a check is due: not for the same trace, new
// addresses in either copy of its library or in anonymous memory, a frame
// BPF resolved to its file, or kernel frames; whether the Handler's cache
// or the Manager converts them. The one read in between is its first
// check's, at its second sample: a process's first check is due at once
// (lastCheck starts at zero), and its maps re-read happens wherever the
// re-read rate limit allows it (5 ms after a newborn process's last read).
func TestKnownProcessReadsNothing(t *testing.T) {
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	first, fnFirst := lib.mapAt(0x7f0000000000)
	second, fnSecond := lib.mapAt(0x7e0000000000)
	jit := fakeMapping{start: 0x7d0000000000, end: 0x7d0000010000}
	fs.setProcess(100, 1, "/bin/app", first, second, jit)

	src := &countingSource{Source: proc.FS{Mount: fs.root}}
	m, err := New(Config{ProcessSource: src, SysFS: t.TempDir(), Logger: quietLogger(),
		CheckInterval: time.Hour, Unwinding: testUnwinding(unwindmapstest.NewMaps(), nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }
	h, err := NewHandler(m, &recordingReporter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	trace := func(hash uint64, frames ...support.Frame) *support.Trace {
		return &support.Trace{PID: 100, TID: 100, Comm: "app", Hash: hash, Frames: frames}
	}
	at := func(addr uint64) support.Frame { return support.Frame{Kind: libpf.FrameNative, Addr: addr} }

	h.handleNow(trace(1, at(fnFirst), at(fnSecond+1)))
	// The lines of its file and its deltas are read in the background.
	m.lines.wait()
	m.waitUnwind(context.Background())
	if got := src.take(); got["Maps"] != 1 || got["OpenMapping"] == 0 {
		t.Fatalf("first trace read %v, want its maps and files", got)
	}

	now = now.Add(time.Second)
	h.handleNow(trace(1, at(fnFirst), at(fnSecond+1)))
	if got := src.take(); !maps.Equal(got, map[string]int{"Maps": 1}) {
		t.Errorf("second sample read %v, want its first check's maps read", got)
	}

	// A frame whose file BPF resolved carries the file's id.
	resolved := support.Frame{Kind: libpf.FrameNative, Addr: 0x10,
		FileID: m.procs[100].findMapping(fnFirst).pf.FileID.Low64()}
	for _, tr := range []*support.Trace{
		trace(1, at(fnFirst), at(fnSecond+1)),
		trace(2, at(fnFirst+3), at(first.start+0x10)),
		trace(3, at(second.start+0x20), at(jit.start+8)),
		trace(4, resolved),
		{PID: 100, Hash: 5, KernelStack: []uint64{0xffffffff81000010}, Frames: []support.Frame{at(fnFirst)}},
	} {
		now = now.Add(time.Minute)
		h.handleNow(tr)
		h.handleNow(tr)
		if _, _, err := m.ConvertTrace(tr); err != nil {
			t.Fatal(err)
		}
	}
	if got := src.take(); len(got) != 0 {
		t.Errorf("converting traces of a known process read %v, want nothing", got)
	}
	// The frame in anonymous memory was converted twice, by the Handler
	// and by the Manager.
	if s := h.Stats(); s.ProcessesTracked != 1 || s.UnmappedFrames != 2 || s.ProcessChecks != 1 || s.TraceCacheHits == 0 {
		t.Errorf("stats %+v", s)
	}
}

package perfmap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/libpf"
)

// fakeHost is a process as the reader sees it: a root directory, a pid
// in its namespace and mappings.
type fakeHost struct {
	root     string
	nspid    uint32
	mappings []interpreter.Mapping
	// regions records every SetRegions call.
	regions [][]interpreter.Region
}

func (h *fakeHost) PID() libpf.PID                 { return 4242 }
func (h *fakeHost) Memory() (io.ReaderAt, error)   { return nil, errors.New("no memory") }
func (h *fakeHost) Bias() uint64                   { return 0 }
func (h *fakeHost) Libc() (*libc.TSDLayout, error) { return nil, errors.New("no libc") }
func (h *fakeHost) SetConfig(any) error            { return errors.New("no BPF unwinder") }
func (h *fakeHost) Mappings() []interpreter.Mapping {
	return h.mappings
}
func (h *fakeHost) Root() string                  { return h.root }
func (h *fakeHost) NamespacePID() (uint32, error) { return h.nspid, nil }
func (h *fakeHost) SetRegions(rs []interpreter.Region) error {
	h.regions = append(h.regions, rs)
	return nil
}

// newHost is a process with pid 7 in its namespace, a root with /tmp and
// one anonymous executable mapping at 0x10000.
func newHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	return &fakeHost{root: root, nspid: 7, mappings: []interpreter.Mapping{
		{Start: 0x400000, End: 0x401000, Path: "/usr/bin/app"},
		{Start: 0x10000, End: 0x20000},
	}}
}

func (h *fakeHost) mapPath() string {
	return filepath.Join(h.root, "tmp", fmt.Sprintf("perf-%d.map", h.nspid))
}

func (h *fakeHost) write(t *testing.T, s string, flag int) {
	t.Helper()
	f, err := os.OpenFile(h.mapPath(), os.O_WRONLY|os.O_CREATE|flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func attach(t *testing.T, h *fakeHost) *process {
	t.Helper()
	p, err := detect(h)
	if err != nil || p == nil {
		t.Fatalf("detect: %v, %v", p, err)
	}
	t.Cleanup(p.Detach)
	return p.(*process)
}

func name(p *process, addr uint64) string {
	f, ok := p.SymbolizeAddr(addr)
	if !ok {
		return ""
	}
	return f.FunctionName
}

func TestDetect(t *testing.T) {
	h := newHost(t)
	if p, err := detect(h); p != nil || err != nil {
		t.Errorf("without a perf map: %v, %v", p, err)
	}
	h.write(t, "10000 100 jitted\n", 0)
	noAnon := &fakeHost{root: h.root, nspid: 7, mappings: h.mappings[:1]}
	if p, err := detect(noAnon); p != nil || err != nil {
		t.Errorf("without anonymous executable memory: %v, %v", p, err)
	}
	p := attach(t, h)
	if want := []interpreter.Region{{Start: 0x10000, End: 0x20000}}; len(h.regions) != 1 || !slices.Equal(h.regions[0], want) {
		t.Errorf("claimed %v, want %v", h.regions, want)
	}
	if got := name(p, 0x10080); got != "jitted" {
		t.Errorf("name at 0x10080: %q", got)
	}
	if f, _ := p.SymbolizeAddr(0x10080); f.Kind != libpf.FrameNative || f.Address != 0x10080 {
		t.Errorf("frame %+v, want a native frame at its address", f)
	}
	if got := name(p, 0x10100); got != "" {
		t.Errorf("name past the entry: %q", got)
	}
}

// The file grows as the runtime compiles; each Update reads what it
// gained, completes a line written in two parts, and says whether the
// names changed.
func TestUpdateReadsAppended(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n10100 10 tw", 0)
	p := attach(t, h)
	if name(p, 0x10100) != "" {
		t.Fatal("a partial line was used")
	}
	if changed, err := p.Update(h); err != nil || changed {
		t.Errorf("update without news: %v %v", changed, err)
	}
	h.write(t, "o\n10200 10 three\n10000 100 one-again\n", os.O_APPEND)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after appending: %v %v", changed, err)
	}
	for addr, want := range map[uint64]string{0x10000: "one-again", 0x10105: "two", 0x10200: "three"} {
		if got := name(p, addr); got != want {
			t.Errorf("name at %#x: %q, want %q", addr, got, want)
		}
	}
	if len(h.regions) != 1 {
		t.Errorf("regions set %d times with no mapping change", len(h.regions))
	}
	// Truncated and written anew: the old names go.
	h.write(t, "10000 10 fresh\n", os.O_TRUNC)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after truncation: %v %v", changed, err)
	}
	if got, gone := name(p, 0x10000), name(p, 0x10200); got != "fresh" || gone != "" {
		t.Errorf("after truncation: %q and %q", got, gone)
	}
}

// Update claims anonymous code mapped or unmapped since.
func TestUpdateClaimsNewCode(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n", 0)
	p := attach(t, h)
	h.mappings = append(h.mappings, interpreter.Mapping{Start: 0x30000, End: 0x31000, Path: "[anon:v8]"})
	if changed, err := p.Update(h); err != nil || !changed {
		t.Fatalf("update after a new mapping: %v %v", changed, err)
	}
	want := []interpreter.Region{{Start: 0x10000, End: 0x20000}, {Start: 0x30000, End: 0x31000}}
	if got := h.regions[len(h.regions)-1]; !slices.Equal(got, want) {
		t.Errorf("claimed %v, want %v", got, want)
	}
	h.mappings = h.mappings[:1]
	if _, err := p.Update(h); err != nil {
		t.Fatal(err)
	}
	if got := h.regions[len(h.regions)-1]; len(got) != 0 {
		t.Errorf("claimed %v after the code was unmapped", got)
	}
}

// refused checks that err refuses the process for reason.
func refused(t *testing.T, err error, reason string, sentinel error) {
	t.Helper()
	var r *interpreter.RefusedError
	if !errors.As(err, &r) || r.Reason != reason || !errors.Is(err, sentinel) {
		t.Errorf("error %v, want a refusal for %q (%v)", err, reason, sentinel)
	}
}

// detectWithin runs detect and fails if it does not return promptly.
func detectWithin(t *testing.T, h *fakeHost) (interpreter.Process, error) {
	t.Helper()
	type result struct {
		p   interpreter.Process
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := detect(h)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		return r.p, r.err
	case <-time.After(5 * time.Second):
		t.Fatal("detect blocked")
		return nil, nil
	}
}

func TestHostileFiles(t *testing.T) {
	t.Run("symlink out", func(t *testing.T) {
		h := newHost(t)
		if err := os.Symlink("/etc/shadow", h.mapPath()); err != nil {
			t.Fatal(err)
		}
		p, err := detectWithin(t, h)
		refused(t, err, "symlink", ErrSymlink)
		if p != nil || len(h.regions) != 0 {
			t.Errorf("attached %v, claimed %v", p, h.regions)
		}
	})
	t.Run("symlink inside", func(t *testing.T) {
		h := newHost(t)
		h.write(t, "10000 100 one\n", 0)
		if err := os.Rename(h.mapPath(), filepath.Join(h.root, "tmp", "real.map")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("real.map", h.mapPath()); err != nil {
			t.Fatal(err)
		}
		_, err := detectWithin(t, h)
		refused(t, err, "symlink", ErrSymlink)
	})
	t.Run("directory symlink out of the root", func(t *testing.T) {
		// The process's /tmp is a symlink to a directory outside its
		// root holding a perf map: resolved inside the root, it is not
		// there.
		outside := t.TempDir()
		h := newHost(t)
		if err := os.WriteFile(filepath.Join(outside, "perf-7.map"), []byte("10000 100 outside\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(h.root, "tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(h.root, "tmp")); err != nil {
			t.Fatal(err)
		}
		// Resolved inside the root, the link's target leads back to the
		// link (ELOOP, refused as a symlink) or nowhere.
		p, err := detectWithin(t, h)
		var r *interpreter.RefusedError
		if p != nil || (err != nil && !errors.As(err, &r)) {
			t.Errorf("detect through a symlink out of the root: %v, %v", p, err)
		}
	})
	t.Run("fifo", func(t *testing.T) {
		h := newHost(t)
		if err := syscall.Mkfifo(h.mapPath(), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := detectWithin(t, h)
		refused(t, err, "not_regular", ErrNotRegular)
	})
	t.Run("directory", func(t *testing.T) {
		h := newHost(t)
		if err := os.Mkdir(h.mapPath(), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := detectWithin(t, h)
		refused(t, err, "not_regular", ErrNotRegular)
	})
	t.Run("1 GiB of garbage", func(t *testing.T) {
		h := newHost(t)
		f, err := os.Create(h.mapPath())
		if err != nil {
			t.Fatal(err)
		}
		garbage := make([]byte, 1<<16)
		for i := range garbage {
			garbage[i] = byte(i*7 + 3)
		}
		if _, err := f.Write(garbage); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(1 << 30); err != nil { // sparse: no disk used
			t.Fatal(err)
		}
		f.Close()
		start := time.Now()
		_, err = detectWithin(t, h)
		refused(t, err, "too_large", ErrTooLarge)
		t.Logf("refused in %v", time.Since(start))
	})
	t.Run("garbage under the bound", func(t *testing.T) {
		h := newHost(t)
		garbage := make([]byte, 1<<20)
		for i := range garbage {
			garbage[i] = byte(i*131 + i>>8)
		}
		h.write(t, string(garbage)+"\n10000 100 good\n", 0)
		p := attach(t, h)
		if got := name(p, 0x10000); got != "good" {
			t.Errorf("the good line after garbage: %q", got)
		}
		if p.table.badLines == 0 {
			t.Error("no bad lines counted")
		}
	})
}

func TestDetachedProcess(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n", 0)
	p := attach(t, h)
	p.Detach()
	if _, err := p.Update(h); !errors.Is(err, interpreter.ErrDetached) {
		t.Errorf("update after detach: %v", err)
	}
	if name(p, 0x10000) != "" {
		t.Error("named code after detach")
	}
}

// benchMap is a perf map of n entries named as Node names its functions.
func benchMap(n int) []byte {
	var b []byte
	for i := range n {
		b = fmt.Appendf(b, "%x %x JS:*handleRequest%d /srv/app/lib/server.js:%d:%d\n",
			0x7f0000000000+uint64(i)*0x200, 0x180, i, i%5000+1, i%80+1)
	}
	return b
}

// BenchmarkParse reads 100,000 entries: the throughput of the reader and
// what it holds for them.
func BenchmarkParse(b *testing.B) {
	const n = 100_000
	data := benchMap(n)
	var held int
	for b.Loop() {
		var tb table
		for off := 0; off < len(data); {
			consumed, _ := tb.parse(data[off:min(off+readChunk, len(data))], maxEntries, maxNameBytes)
			off += consumed
		}
		tb.sort()
		held = cap(tb.entries)*int(unsafe.Sizeof(entry{})) + cap(tb.names)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(held), "bytes/100k-entries")
	b.SetBytes(int64(len(data)))
}

func BenchmarkLookup(b *testing.B) {
	var tb table
	tb.parse(benchMap(100_000), maxEntries, maxNameBytes)
	tb.sort()
	i := uint64(0)
	for b.Loop() {
		i = (i + 7919) % 100_000
		if _, ok := tb.lookup(0x7f0000000000 + i*0x200 + 0x10); !ok {
			b.Fatal("miss")
		}
	}
}

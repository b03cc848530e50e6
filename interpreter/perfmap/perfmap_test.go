package perfmap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// fakeHost is a process as the reader sees it: a root directory, a pid
// in its namespace and mappings.
type fakeHost struct {
	root     string
	nspid    uint32
	nspidErr error
	mappings []interpreter.Mapping
	// regions records every SetRegions call; setRegionsErr fails them.
	regions       [][]interpreter.Region
	setRegionsErr error
}

func (h *fakeHost) PID() libpf.PID                               { return 4242 }
func (h *fakeHost) Memory() (io.ReaderAt, error)                 { return nil, errors.New("no memory") }
func (h *fakeHost) Bias() uint64                                 { return 0 }
func (h *fakeHost) Libc() (*libc.TSDLayout, error)               { return nil, errors.New("no libc") }
func (h *fakeHost) SetConfig(any) error                          { return errors.New("no BPF unwinder") }
func (h *fakeHost) Mappings() []interpreter.Mapping              { return h.mappings }
func (h *fakeHost) ReadMappings() ([]interpreter.Mapping, error) { return h.mappings, nil }
func (h *fakeHost) Root() string                                 { return h.root }
func (h *fakeHost) NamespacePID() (uint32, error)                { return h.nspid, h.nspidErr }
func (h *fakeHost) SetRegions(rs []interpreter.Region) error {
	if h.setRegionsErr != nil {
		return h.setRegionsErr
	}
	h.regions = append(h.regions, rs)
	return nil
}

var (
	binary = interpreter.Mapping{Start: 0x400000, End: 0x401000, Path: "/usr/bin/app"}
	jit    = interpreter.Mapping{Start: 0x10000, End: 0x20000}
)

// newHost is a process with pid 7 in its namespace, a root with /tmp,
// its binary and one anonymous executable mapping at 0x10000.
func newHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	return &fakeHost{root: root, nspid: 7, mappings: []interpreter.Mapping{binary, jit}}
}

func (h *fakeHost) mapPath() string {
	return filepath.Join(h.root, "tmp", fmt.Sprintf("perf-%d.map", h.nspid))
}

// write writes s to the perf map, opened with flag besides O_WRONLY and
// O_CREATE.
func (h *fakeHost) write(t *testing.T, s string, flag int) {
	t.Helper()
	f, err := os.OpenFile(h.mapPath(), os.O_WRONLY|os.O_CREATE|flag, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
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

// checkNames checks the names of addresses ("" for none).
func checkNames(t *testing.T, p *process, want map[uint64]string) {
	t.Helper()
	for addr, w := range want {
		if got := name(p, addr); got != w {
			t.Errorf("name at %#x: %q, want %q", addr, got, w)
		}
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

// within runs f and fails the test if it does not return promptly: a
// reader that blocks on a hostile file stalls the daemon.
func within[T any](t *testing.T, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("blocked")
		panic("unreachable")
	}
}

type detected struct {
	p   interpreter.Process
	err error
}

func detectWithin(t *testing.T, h *fakeHost) (interpreter.Process, error) {
	t.Helper()
	r := within(t, func() detected {
		p, err := detect(h)
		return detected{p, err}
	})
	return r.p, r.err
}

func TestAnonymousCode(t *testing.T) {
	ms := []interpreter.Mapping{
		{Start: 0x1000, End: 0x2000},
		{Start: 0x3000, End: 0x4000, Path: "[anon:v8 code]"},
		{Start: 0x5000, End: 0x6000, Path: "/usr/bin/node"},
		{Start: 0x7000, End: 0x8000, Path: "[heap]"},
		{Start: 0x9000, End: 0xa000, Path: "/memfd:doublemapper (deleted)"},
		{Start: 0xb000, End: 0xc000, Path: "[anon_shmem:x]"},
	}
	want := []interpreter.Region{{Start: 0x1000, End: 0x2000}, {Start: 0x3000, End: 0x4000}}
	if got := anonymousCode(ms); !slices.Equal(got, want) {
		t.Errorf("claimed %v, want %v", got, want)
	}
	if got := anonymousCode(nil); got != nil {
		t.Errorf("claimed %v of no mappings", got)
	}
}

func TestDetect(t *testing.T) {
	named := interpreter.Mapping{Start: 0x30000, End: 0x31000, Path: "[anon:v8]"}
	for _, c := range []struct {
		name     string
		mappings []interpreter.Mapping
		perfMap  *string // nil: none
		attach   bool
		regions  []interpreter.Region // Unwind false: walked with frame pointers
		names    map[uint64]string
	}{
		{"no anonymous code", []interpreter.Mapping{binary}, ptr("10000 100 jitted\n"), false, nil, nil},
		{"no perf map", []interpreter.Mapping{binary, jit}, nil, false, nil, nil},
		{"perf map", []interpreter.Mapping{binary, jit}, ptr("10000 100 jitted\n"), true,
			[]interpreter.Region{{Start: 0x10000, End: 0x20000}},
			map[uint64]string{0x10000: "jitted", 0x100ff: "jitted", 0x10100: "", 0x400100: ""}},
		{"named anonymous code", []interpreter.Mapping{binary, jit, named}, ptr("10000 100 a\n30000 10 b\n"), true,
			[]interpreter.Region{{Start: 0x10000, End: 0x20000}, {Start: 0x30000, End: 0x31000}},
			map[uint64]string{0x10000: "a", 0x30000: "b"}},
		// The runtime created its perf map and has not written yet.
		{"empty perf map", []interpreter.Mapping{binary, jit}, ptr(""), true,
			[]interpreter.Region{{Start: 0x10000, End: 0x20000}}, map[uint64]string{0x10000: ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			h.mappings = c.mappings
			if c.perfMap != nil {
				h.write(t, *c.perfMap, 0)
			}
			p, err := detectWithin(t, h)
			if err != nil || (p != nil) != c.attach {
				t.Fatalf("detect: %v, %v; want attached %v", p, err, c.attach)
			}
			if !c.attach {
				if len(h.regions) != 0 {
					t.Errorf("claimed %v without attaching", h.regions)
				}
				return
			}
			defer p.Detach()
			if len(h.regions) != 1 || !slices.Equal(h.regions[0], c.regions) {
				t.Errorf("claimed %v, want %v once", h.regions, c.regions)
			}
			checkNames(t, p.(*process), c.names)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestDetectErrors(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 jitted\n", 0)
	h.nspidErr = errors.New("no such process")
	if p, err := detect(h); p != nil || !errors.Is(err, h.nspidErr) {
		t.Errorf("detect without a namespace pid: %v, %v", p, err)
	}
	h.nspidErr = nil
	h.setRegionsErr = errors.New("map full")
	if p, err := detect(h); p != nil || !errors.Is(err, h.setRegionsErr) {
		t.Errorf("detect with SetRegions failing: %v, %v", p, err)
	}
}

func TestSymbolizeAddr(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 LazyCompile:*f /srv/a.js:1\n", 0)
	p := attach(t, h)
	f, ok := p.SymbolizeAddr(0x10080)
	want := libpf.Frame{Kind: libpf.FrameNative, Address: 0x10080, FunctionName: "LazyCompile:*f /srv/a.js:1"}
	if !ok || f != want {
		t.Errorf("SymbolizeAddr: %+v %v, want %+v", f, ok, want)
	}
	// The reader has no frames of its own.
	out := []libpf.Frame{want}
	if got, err := p.Symbolize(support.Frame{}, out); err == nil || len(got) != 1 {
		t.Errorf("Symbolize: %v, %v", got, err)
	}
}

// The file grows as the runtime compiles; each Update reads what it
// gained, completes a line written in two parts, and says whether the
// names changed.
func TestUpdateReadsAppended(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n10100 10 tw", 0)
	p := attach(t, h)
	checkNames(t, p, map[uint64]string{0x10000: "one", 0x10100: ""})
	if changed, err := p.Update(h); err != nil || changed {
		t.Errorf("update without news: %v %v", changed, err)
	}
	h.write(t, "o\n10200 10 three\n10000 100 one-again\n10300 1", os.O_APPEND)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after appending: %v %v", changed, err)
	}
	checkNames(t, p, map[uint64]string{0x10000: "one-again", 0x10105: "two", 0x10200: "three", 0x10300: ""})
	h.write(t, "0 four\n", os.O_APPEND)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after completing a line: %v %v", changed, err)
	}
	checkNames(t, p, map[uint64]string{0x10000: "one-again", 0x10300: "four"})
	if len(h.regions) != 1 {
		t.Errorf("regions set %d times with no mapping change", len(h.regions))
	}
}

// A perf map truncated and written anew is read from its start again: its
// old names go.
func TestUpdateRewritten(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 old\n10200 100 gone\n", 0)
	p := attach(t, h)
	h.write(t, "10000 10 fresh\n", os.O_TRUNC)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after truncation: %v %v", changed, err)
	}
	checkNames(t, p, map[uint64]string{0x10000: "fresh", 0x10050: "", 0x10200: ""})
	// Emptied: no names, and then new ones as it grows again.
	h.write(t, "", os.O_TRUNC)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Errorf("update after emptying: %v %v", changed, err)
	}
	checkNames(t, p, map[uint64]string{0x10000: ""})
	h.write(t, "10000 10 again\n", os.O_APPEND)
	if _, err := p.Update(h); err != nil {
		t.Fatal(err)
	}
	checkNames(t, p, map[uint64]string{0x10000: "again"})
}

// Update claims anonymous code mapped or unmapped since, and claims
// nothing anew when the mappings did not change.
func TestUpdateRegions(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n30000 100 two\n", 0)
	p := attach(t, h)
	steps := []struct {
		name     string
		mappings []interpreter.Mapping
		changed  bool
		claimed  []interpreter.Region // nil: no SetRegions call
	}{
		{"unchanged", []interpreter.Mapping{binary, jit}, false, nil},
		{"code mapped", []interpreter.Mapping{binary, jit, {Start: 0x30000, End: 0x31000, Path: "[anon:v8]"}}, true,
			[]interpreter.Region{{Start: 0x10000, End: 0x20000}, {Start: 0x30000, End: 0x31000}}},
		{"unchanged again", []interpreter.Mapping{binary, jit, {Start: 0x30000, End: 0x31000, Path: "[anon:v8]"}}, false, nil},
		{"code grown", []interpreter.Mapping{binary, {Start: 0x10000, End: 0x28000}, {Start: 0x30000, End: 0x31000}}, true,
			[]interpreter.Region{{Start: 0x10000, End: 0x28000}, {Start: 0x30000, End: 0x31000}}},
		{"code unmapped", []interpreter.Mapping{binary}, true, []interpreter.Region{}},
	}
	for _, s := range steps {
		h.mappings = s.mappings
		calls := len(h.regions)
		changed, err := p.Update(h)
		if err != nil || changed != s.changed {
			t.Errorf("%s: update %v %v, want changed %v", s.name, changed, err, s.changed)
		}
		switch {
		case s.claimed == nil && len(h.regions) != calls:
			t.Errorf("%s: claimed %v", s.name, h.regions[calls:])
		case s.claimed != nil && (len(h.regions) != calls+1 || !slices.Equal(h.regions[calls], s.claimed)):
			t.Errorf("%s: claimed %v, want %v", s.name, h.regions[calls:], s.claimed)
		}
	}
	// The names stay whatever the mappings do: code leaves the perf map
	// only when the runtime writes a new line for its address.
	checkNames(t, p, map[uint64]string{0x10000: "one", 0x30000: "two"})
}

// A failed SetRegions is tried again by the next Update.
func TestUpdateRegionsRetried(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n", 0)
	p := attach(t, h)
	h.mappings = append(h.mappings, interpreter.Mapping{Start: 0x30000, End: 0x31000})
	h.setRegionsErr = errors.New("map full")
	if _, err := p.Update(h); !errors.Is(err, h.setRegionsErr) {
		t.Errorf("update with SetRegions failing: %v", err)
	}
	h.setRegionsErr = nil
	if changed, err := p.Update(h); err != nil || !changed || len(h.regions) != 2 {
		t.Errorf("update after: %v %v, regions %v", changed, err, h.regions)
	}
}

// linesFor returns at most size bytes of perf map lines, naming
// 0x100000+i*0x10 "fI", and those names.
func linesFor(size int) (string, map[uint64]string) {
	var b strings.Builder
	names := map[uint64]string{}
	for i := 0; ; i++ {
		addr := 0x100000 + uint64(i)*0x10
		line := fmt.Sprintf("%x 10 f%d\n", addr, i)
		if b.Len()+len(line) > size {
			return b.String(), names
		}
		b.WriteString(line)
		names[addr] = fmt.Sprintf("f%d", i)
	}
}

// A perf map larger than one read chunk: lines across the chunk's end
// are read whole, and a line too long to keep across it is skipped to its
// end, its rest no line of its own.
func TestReadAcrossChunks(t *testing.T) {
	lines, names := linesFor(readChunk + readChunk/2)
	if len(lines) <= readChunk || lines[readChunk-1] == '\n' {
		t.Fatalf("%d bytes of lines: no line across the first chunk's end", len(lines))
	}
	h := newHost(t)
	h.write(t, lines, 0)
	p := attach(t, h)
	checkNames(t, p, names)

	// A long line from 6000 bytes before the chunk's end whose rest after
	// it is "2000 10 injected".
	lines, names = linesFor(readChunk - 6000)
	longLine := "3000 10 " + strings.Repeat("x", readChunk-len(lines)-8)
	h.write(t, lines+longLine+"2000 10 injected\n1000 10 good\n", os.O_TRUNC)
	if changed, err := p.Update(h); err != nil || !changed {
		t.Fatalf("update: %v %v", changed, err)
	}
	names[0x1000], names[0x2000], names[0x3000] = "good", "", ""
	checkNames(t, p, names)
	if p.table.badLines != 1 {
		t.Errorf("bad lines %d, want 1", p.table.badLines)
	}
}

// A long line written in parts as it is read is skipped to its end.
func TestReadGrowingLongLine(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 10 a\n3000 10 "+strings.Repeat("x", maxLineBytes), 0)
	p := attach(t, h)
	h.write(t, strings.Repeat("x", 100), os.O_APPEND)
	if _, err := p.Update(h); err != nil {
		t.Fatal(err)
	}
	h.write(t, "2000 10 injected\n1000 10 good\n", os.O_APPEND)
	if _, err := p.Update(h); err != nil {
		t.Fatal(err)
	}
	checkNames(t, p, map[uint64]string{0x10000: "a", 0x1000: "good", 0x2000: "", 0x3000: ""})
	if p.table.badLines != 1 {
		t.Errorf("bad lines %d, want 1", p.table.badLines)
	}
}

// Files that are no perf map are refused for good, at once, with their
// reason, and nothing is claimed.
func TestHostileFiles(t *testing.T) {
	symlink := func(target string) func(t *testing.T, h *fakeHost) {
		return func(t *testing.T, h *fakeHost) {
			if err := os.Symlink(target, h.mapPath()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name     string
		setup    func(t *testing.T, h *fakeHost)
		reason   string
		sentinel error
	}{
		{"symlink out of the root", symlink("/etc/shadow"), "symlink", ErrSymlink},
		{"symlink inside, relative", symlink("real.map"), "symlink", ErrSymlink},
		{"symlink inside, absolute", symlink("/tmp/real.map"), "symlink", ErrSymlink},
		{"dangling symlink", symlink("/nowhere"), "symlink", ErrSymlink},
		{"symlink to a magic link", symlink("/proc/self/root/etc/shadow"), "symlink", ErrSymlink},
		{"fifo", func(t *testing.T, h *fakeHost) {
			if err := syscall.Mkfifo(h.mapPath(), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "not_regular", ErrNotRegular},
		{"directory", func(t *testing.T, h *fakeHost) {
			if err := os.Mkdir(h.mapPath(), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "not_regular", ErrNotRegular},
		{"character device", func(t *testing.T, h *fakeHost) { mknodNull(t, h.mapPath()) }, "not_regular", ErrNotRegular},
		{"unix socket", func(t *testing.T, h *fakeHost) {
			l, err := net.Listen("unix", h.mapPath())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, "not_regular", ErrNotRegular},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			if err := os.WriteFile(filepath.Join(h.root, "tmp", "real.map"), []byte("10000 100 one\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			c.setup(t, h)
			p, err := detectWithin(t, h)
			refused(t, err, c.reason, c.sentinel)
			if p != nil || len(h.regions) != 0 {
				t.Errorf("attached %v, claimed %v", p, h.regions)
			}
		})
	}
}

// mknodNull makes a character device like /dev/null at path.
func mknodNull(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mknod(path, unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("mknod: %v", err)
	}
}

// Opening a device runs its driver, and opening a fifo makes the reader
// one of its readers: neither is opened to be looked at.
func TestSpecialFilesNotOpened(t *testing.T) {
	for _, c := range []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"character device", mknodNull},
		{"fifo", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			c.make(t, h.mapPath())
			// The watch sees opens for reading or writing, and on this
			// kernel none with O_PATH.
			if opened(t, h.mapPath(), func() { openClose(h.mapPath(), unix.O_PATH) }) ||
				!opened(t, h.mapPath(), func() { openClose(h.mapPath(), unix.O_RDONLY|unix.O_NONBLOCK) }) {
				t.Skip("inotify does not tell O_PATH opens from others on this kernel")
			}
			if opened(t, h.mapPath(), func() { detectWithin(t, h) }) {
				t.Error("detect opened it")
			}
		})
	}
}

func openClose(path string, flags int) {
	if fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0); err == nil {
		unix.Close(fd)
	}
}

// opened says whether f opened path (an inotify IN_OPEN).
func opened(t *testing.T, path string, f func()) bool {
	t.Helper()
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, path, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	f()
	n, err := unix.Read(in, make([]byte, 4096))
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		t.Fatal(err)
	}
	return n > 0
}

// A directory on the way that is a symlink resolves inside the process's
// root, whether absolute or climbing with "..": a file outside the root is
// never opened.
func TestDirectorySymlinkStaysInRoot(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		target string // what the root's /tmp links to
		inside string // a directory in the root holding "secret" with "inside"
		want   string // "" : not opened
	}{
		{"absolute, out of the root", outside, "", ""},
		{"climbing out", strings.Repeat("../", 20) + outside[1:], "", ""},
		{"to /etc", "/etc", "", ""},
		{"absolute, inside the root", "/srv/tmp", "srv/tmp", "inside"},
		{"to the root's /etc", "/etc", "etc", "inside"},
		{"climbing, inside the root", strings.Repeat("../", 20) + "etc", "etc", "inside"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if c.inside != "" {
				dir := filepath.Join(root, c.inside)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("inside"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(c.target, filepath.Join(root, "tmp")); err != nil {
				t.Fatal(err)
			}
			// /etc/shadow too: the host's is outside any root.
			for _, file := range []string{"tmp/secret", "tmp/shadow"} {
				f, err := open(root, file)
				if c.want == "" || file == "tmp/shadow" {
					var r *interpreter.RefusedError
					if f != nil || !(errors.Is(err, os.ErrNotExist) || errors.As(err, &r)) {
						t.Errorf("%s opened (%v), want not found or refused", file, err)
						if f != nil {
							f.Close()
						}
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				got, err := io.ReadAll(f)
				f.Close()
				if err != nil || string(got) != c.want {
					t.Errorf("%s read %q %v, want %q", file, got, err, c.want)
				}
			}
		})
	}
}

// A 1 GiB file is refused before any of it is read: quickly, with
// nothing allocated for it and nothing held.
func TestTooLarge(t *testing.T) {
	h := newHost(t)
	f, err := os.Create(h.mapPath())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("10000 100 one\n\x00\xff garbage\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()

	file, err := open(h.root, "tmp/perf-7.map")
	if err != nil {
		t.Fatal(err)
	}
	p := &process{f: file}
	defer p.Detach()
	type result struct {
		changed bool
		err     error
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := within(t, func() result {
		changed, err := p.read()
		return result{changed, err}
	})
	runtime.ReadMemStats(&after)
	refused(t, r.err, "too_large", ErrTooLarge)
	if r.changed || len(p.table.entries) != 0 || p.table.names != nil || p.offset != 0 {
		t.Errorf("read some: changed %v, %d entries, offset %d", r.changed, len(p.table.entries), p.offset)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > readChunk/4 {
		t.Errorf("allocated %d bytes to refuse it", alloc)
	}

	pr, err := detectWithin(t, h)
	refused(t, err, "too_large", ErrTooLarge)
	if pr != nil || len(h.regions) != 0 {
		t.Errorf("attached %v, claimed %v", pr, h.regions)
	}
}

// A perf map that grows past the bound is refused by the next Update.
func TestGrownTooLarge(t *testing.T) {
	h := newHost(t)
	h.write(t, "10000 100 one\n", 0)
	p := attach(t, h)
	if err := os.Truncate(h.mapPath(), maxFileBytes+1); err != nil {
		t.Fatal(err)
	}
	err := within(t, func() error {
		_, err := p.Update(h)
		return err
	})
	refused(t, err, "too_large", ErrTooLarge)
	checkNames(t, p, map[uint64]string{0x10000: "one"})
}

// Garbage reads without error: its lines are counted bad and name
// nothing; a good line after it still names its code.
func TestGarbage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 1<<20)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	noNewlines := bytes.ReplaceAll(random, []byte("\n"), []byte("\x00"))
	for _, c := range []struct {
		name  string
		data  []byte
		names map[uint64]string
	}{
		{"random bytes", random, nil},
		{"random bytes without newlines", noNewlines, nil},
		{"NULs", make([]byte, 1<<20), nil},
		{"over several chunks without a newline", bytes.Repeat([]byte("1000 10 "), 3*readChunk/8), nil},
		{"random bytes then a good line", append(append(slices.Clip(random), '\n'), "10000 100 good\n"...),
			map[uint64]string{0x10000: "good"}},
		{"no newlines then a good line", append(append(slices.Clip(noNewlines), '\n'), "10000 100 good\n"...),
			map[uint64]string{0x10000: "good"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			h.write(t, string(c.data), 0)
			p := attach(t, h)
			if p.table.badLines == 0 {
				t.Error("no bad lines counted")
			}
			if len(p.table.entries) != len(c.names) {
				t.Errorf("%d entries, want %d", len(p.table.entries), len(c.names))
			}
			checkNames(t, p, c.names)
			if changed, err := p.Update(h); changed || err != nil {
				t.Errorf("update without news: %v %v", changed, err)
			}
		})
	}
}

func TestDetach(t *testing.T) {
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
	p.Detach() // and again, by the test's cleanup
}

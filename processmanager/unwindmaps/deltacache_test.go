package unwindmaps

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

func testDeltas() nativeunwind.Deltas {
	sp := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}
	fp := nativeunwind.Rule{CFA: nativeunwind.CFAFP, CFAOffset: 16, FPOffset: -16, RAOffset: -8, StackSwitch: true}
	signed := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 32, RASigned: true}
	return nativeunwind.Deltas{
		{Address: 0x1000, Rule: sp}, {Address: 0x1004, Rule: fp}, {Address: 0x1010, Rule: sp},
		{Address: 0x7fff0000, Rule: signed}, {Address: 0x7fff0100, Rule: nativeunwind.Rule{}},
	}
}

// newTestCache returns a cache in a fresh directory and the log it writes.
func newTestCache(t *testing.T, maxBytes int64) (*DeltaCache, *test.Hook) {
	t.Helper()
	log, hook := test.NewNullLogger()
	c, err := OpenDeltaCache(filepath.Join(t.TempDir(), "deltas"), maxBytes, log)
	if err != nil {
		t.Fatal(err)
	}
	return c, hook
}

func lastLog(hook *test.Hook) string {
	if e := hook.LastEntry(); e != nil && e.Level <= logrus.WarnLevel {
		return e.Message
	}
	return ""
}

// TestDeltaCacheRoundTrip: what is stored loads back the same, runtime
// marks aside (they are applied after loading).
func TestDeltaCacheRoundTrip(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	id := libpf.FileID{1, 2, 3}
	if _, ok := c.Load(id); ok {
		t.Fatal("a hit in an empty cache")
	}
	d := testDeltas()
	marked := d.MarkRuntime(0x1004, 0x1010, 3)
	c.Store(id, marked)
	seq, ok := c.Load(id)
	if got := slices.Collect(seq.all); !ok || !slices.Equal(got, d) || seq.n != len(d) {
		t.Errorf("loaded %v, %v; want %v", got, ok, d)
	}
	if s := c.Stats(); s.Hits != 1 || s.Misses != 1 || s.Written != 1 || s.Rejected != 0 {
		t.Errorf("stats %+v", s)
	}
	if _, ok := c.Load(libpf.FileID{9}); ok {
		t.Error("a hit for another file")
	}
}

// TestDeltaCacheRejects: a corrupted file, one of another version or of
// another file, one another user owns, one others may write and a symbolic
// link are each ignored with a log line saying why, and removed.
func TestDeltaCacheRejects(t *testing.T) {
	id := libpf.FileID{7}
	tests := []struct {
		name   string
		spoil  func(t *testing.T, path string)
		reason string
	}{
		{"corrupted", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[len(b)-1] ^= 0xff
			os.WriteFile(path, b, 0o600)
		}, "checksum mismatch"},
		{"truncated", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			os.WriteFile(path, b[:deltaCacheHeader-1], 0o600)
		}, "bytes"},
		{"another version", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			binary.LittleEndian.PutUint32(b[12:], nativeunwind.ExtractVersion+1)
			os.WriteFile(path, b, 0o600)
		}, "another version"},
		{"another file", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[16] ^= 1
			os.WriteFile(path, b, 0o600)
		}, "another file"},
		{"foreign", func(t *testing.T, path string) {
			if err := os.Chown(path, 12345, 12345); err != nil {
				t.Fatalf("chown (the test runs as root): %v", err)
			}
		}, "owned by uid 12345"},
		{"writable by others", func(t *testing.T, path string) { os.Chmod(path, 0o666) }, "others may write"},
		{"symbolic link", func(t *testing.T, path string) {
			target := path + ".real"
			os.Rename(path, target)
			os.Symlink(target, path)
		}, "symbolic link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, hook := newTestCache(t, 1<<20)
			c.Store(id, testDeltas())
			path := c.path(id)
			tt.spoil(t, path)
			if d, ok := c.Load(id); ok {
				t.Fatalf("loaded %v", slices.Collect(d.all))
			}
			if msg := lastLog(hook); !strings.Contains(msg, tt.reason) || !strings.Contains(msg, path) {
				t.Errorf("log %q, want the file and %q", msg, tt.reason)
			}
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("rejected file kept: %v", err)
			}
			if c.Stats().Rejected != 1 {
				t.Errorf("stats %+v", c.Stats())
			}
			// The next store replaces it.
			c.Store(id, testDeltas())
			if _, ok := c.Load(id); !ok {
				t.Error("no hit after storing again")
			}
		})
	}
}

// TestDeltaCacheDirectory: a cache directory another user owns or others
// may write to is refused.
func TestDeltaCacheDirectory(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := OpenDeltaCache(open, 1<<20, logrus.New()); err == nil || !strings.Contains(err.Error(), "others may write") {
		t.Errorf("world-writable directory: %v", err)
	}
	foreign := filepath.Join(dir, "foreign")
	os.Mkdir(foreign, 0o700)
	if err := os.Chown(foreign, 12345, 12345); err != nil {
		t.Fatalf("chown (the test runs as root): %v", err)
	}
	if _, err := OpenDeltaCache(foreign, 1<<20, logrus.New()); err == nil || !strings.Contains(err.Error(), "another user") {
		t.Errorf("another user's directory: %v", err)
	}
}

// TestDeltaCacheFullDisk: a write that fails for lack of space is logged,
// leaves no partial file, and turns writing off for a while; loads go on.
func TestDeltaCacheFullDisk(t *testing.T) {
	dir := t.TempDir()
	// A file system with room for about one page of data.
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8k,mode=0700"); err != nil {
		t.Fatalf("mounting a small tmpfs (the test runs as root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	log, hook := test.NewNullLogger()
	c, err := OpenDeltaCache(filepath.Join(dir, "deltas"), 1<<30, log)
	if err != nil {
		t.Fatal(err)
	}
	small := libpf.FileID{1}
	c.Store(small, testDeltas())
	var big nativeunwind.Deltas
	for i := range 20000 {
		big = append(big, nativeunwind.Delta{Address: uint64(i) * 1000, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: int32(i % 50)}})
	}
	c.Store(libpf.FileID{2}, big)
	if msg := lastLog(hook); !strings.Contains(msg, "no space left") || !strings.Contains(msg, "not writing") {
		t.Errorf("log %q, want the write error and that writing stops", msg)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "deltas"))
	if len(entries) != 1 {
		t.Errorf("files after a failed write: %v, want the first only", entries)
	}
	if _, ok := c.Load(small); !ok {
		t.Error("the file written before the disk filled no longer loads")
	}
	// Writing is off: nothing is tried until the pause ends.
	hook.Reset()
	c.Store(libpf.FileID{3}, testDeltas())
	if s := c.Stats(); s.WriteErrors != 1 || s.Written != 1 || hook.LastEntry() != nil {
		t.Errorf("stats %+v, log %v: want writing paused", s, hook.LastEntry())
	}
	c.now = func() time.Time { return time.Now().Add(deltaCacheWriteOff + time.Second) }
	c.Store(libpf.FileID{3}, testDeltas())
	if s := c.Stats(); s.Written != 2 {
		t.Errorf("stats %+v: want writing on again after the pause", s)
	}
}

// TestDeltaCacheEvicts: beyond the size bound the least recently used
// files go.
func TestDeltaCacheEvicts(t *testing.T) {
	one := int64(len(encodeDeltaCache(libpf.FileID{1}, testDeltas())))
	c, _ := newTestCache(t, 2*one)
	clock := time.Now()
	c.now = func() time.Time { return clock }
	for i := range 3 {
		clock = clock.Add(time.Minute)
		if i == 2 {
			// File 1 was used since file 2 was written: 2 goes first.
			if _, ok := c.Load(libpf.FileID{1}); !ok {
				t.Fatal("file 1 missing")
			}
			clock = clock.Add(time.Minute)
		}
		c.Store(libpf.FileID{byte(i + 1)}, testDeltas())
	}
	for i, want := range []bool{true, false, true} {
		if _, err := os.Stat(c.path(libpf.FileID{byte(i + 1)})); (err == nil) != want {
			t.Errorf("file %d present %v, want %v", i+1, err == nil, want)
		}
	}
}

func FuzzDecodeDeltaCache(f *testing.F) {
	id := libpf.FileID{5}
	f.Add(encodeDeltaCache(id, testDeltas()))
	f.Add(encodeDeltaCache(id, nativeunwind.Deltas{{Address: 1}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDeltaCache(b, id)
		if err != nil {
			return
		}
		// What decodes is what it encodes to: the daemon writes one
		// encoding of each set of deltas, and reads any that is valid
		// (rule flags beyond those it writes, rules listed but unused,
		// longer varints) as that set.
		again, err := decodeDeltaCache(encodeDeltaCache(id, d), id)
		if err != nil || !slices.Equal(again, d) {
			t.Errorf("decoded %d deltas that encode to %d others (%v)", len(d), len(again), err)
		}
	})
}

// decodeDeltaCache checks and decodes a cache file's bytes into a slice,
// sized up front as loads once did.
func decodeDeltaCache(b []byte, id libpf.FileID) (nativeunwind.Deltas, error) {
	c, err := parseDeltaCache(b, id)
	if err != nil {
		return nil, err
	}
	return slices.AppendSeq(make(nativeunwind.Deltas, 0, c.n), c.seq().all), nil
}

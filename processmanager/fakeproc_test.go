package processmanager

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fakeProcFS is a procfs lookalike in a temporary directory, so tests
// control what a "process" maps and can make it exit or reuse its pid.
type fakeProcFS struct {
	t    testing.TB
	root string
}

// fakeMapping is one executable file mapping of a fake process.
type fakeMapping struct {
	start, end, offset uint64
	file               string // the real file map_files points to; "" for anonymous memory
	path               string // the path maps shows; file when empty
}

func newFakeProcFS(t testing.TB) *fakeProcFS {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	// No kernel: kernel frames stay unsymbolized.
	if err := os.WriteFile(filepath.Join(root, "kallsyms"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return &fakeProcFS{t: t, root: root}
}

// setProcess (re)creates /proc/pid for a process started at startTime.
func (f *fakeProcFS) setProcess(pid uint32, startTime uint64, exe string, mappings ...fakeMapping) {
	t := f.t
	t.Helper()
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "map_files"), 0o755); err != nil {
		t.Fatal(err)
	}
	var maps strings.Builder
	for _, m := range mappings {
		if m.file == "" { // anonymous memory
			fmt.Fprintf(&maps, "%x-%x r-xp 00000000 00:00 0 %s\n", m.start, m.end, m.path)
			continue
		}
		st, err := os.Stat(m.file)
		if err != nil {
			t.Fatal(err)
		}
		path := m.path
		if path == "" {
			path = m.file
		}
		ino := st.Sys().(*syscall.Stat_t).Ino
		fmt.Fprintf(&maps, "%x-%x r-xp %08x fe:00 %d    %s\n", m.start, m.end, m.offset, ino, path)
		if err := os.Symlink(m.file, filepath.Join(dir, "map_files", fmt.Sprintf("%x-%x", m.start, m.end))); err != nil {
			t.Fatal(err)
		}
	}
	stat := fmt.Sprintf("%d (fake) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, startTime)
	files := map[string]string{
		"maps":   maps.String(),
		"stat":   stat,
		"comm":   "fake\n",
		"cgroup": "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
		"mem":    "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if exe != "" {
		if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fakeProcFS) removeProcess(pid uint32) {
	if err := os.RemoveAll(filepath.Join(f.root, fmt.Sprint(pid))); err != nil {
		f.t.Fatal(err)
	}
}

// zombie makes a process a zombie: its stat says so and its maps are
// empty, as the kernel shows an exited process its parent has not reaped.
func (f *fakeProcFS) zombie(pid uint32, startTime uint64) {
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	stat := fmt.Sprintf("%d (fake) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, startTime)
	for name, content := range map[string]string{"stat": stat, "maps": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

// writeFile writes a file for fake processes to map.
func (f *fakeProcFS) writeFile(name string, data []byte) string {
	path := filepath.Join(f.root, "files", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o755); err != nil {
		f.t.Fatal(err)
	}
	return path
}

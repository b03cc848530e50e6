package processmanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOpenMapping covers the ways to the file behind a mapping: the
// process's map_files link, and its root directory where map_files cannot
// be opened (the mapped path need not exist in our mount namespace).
func TestOpenMapping(t *testing.T) {
	const pid = 42
	e := mapsEntry{start: 0x1000, end: 0x2000, path: "/lib/x.so", executable: true}
	tests := []struct {
		name     string
		mapFiles bool // map_files has the mapping's link
		inRoot   bool // root/<path> is the mapped file
		replaced bool // root/<path> is another file
		deleted  bool
		noProc   bool // the process is gone
		want     string
		exited   bool // the error is ErrProcessExited
	}{
		{name: "map_files", mapFiles: true, want: "mapped"},
		{name: "map_files of a deleted file", mapFiles: true, deleted: true, want: "mapped"},
		{name: "root when map_files fails", inRoot: true, want: "mapped"},
		{name: "root holds another file", replaced: true},
		{name: "deleted file not in map_files", inRoot: true, deleted: true},
		{name: "process gone", noProc: true, exited: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			procFS := t.TempDir()
			dir := filepath.Join(procFS, fmt.Sprint(pid))
			mapped := writeTestFile(t, filepath.Join(t.TempDir(), "mapped"), "mapped")
			if !tt.noProc {
				mustMkdir(t, filepath.Join(dir, "map_files"))
				mustMkdir(t, filepath.Join(dir, "root", "lib"))
			}
			if tt.mapFiles {
				if err := os.Symlink(mapped, filepath.Join(dir, "map_files", "1000-2000")); err != nil {
					t.Fatal(err)
				}
			}
			inRoot := filepath.Join(dir, "root", e.path)
			switch {
			case tt.inRoot:
				if err := os.Link(mapped, inRoot); err != nil {
					t.Fatal(err)
				}
			case tt.replaced:
				writeTestFile(t, inRoot, "other")
			}
			entry := e
			entry.inode = inode(t, mapped)
			entry.deleted = tt.deleted

			f, err := openMapping(procFS, pid, &entry)
			if tt.want == "" {
				if err == nil {
					f.Close()
					t.Fatal("opened a file, want an error")
				}
				if errors.Is(err, ErrProcessExited) != tt.exited {
					t.Errorf("error %v: ErrProcessExited %v, want %v", err, !tt.exited, tt.exited)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, 16)
			n, _ := f.Read(buf)
			if string(buf[:n]) != tt.want {
				t.Errorf("read %q, want %q", buf[:n], tt.want)
			}
		})
	}
}

func writeTestFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

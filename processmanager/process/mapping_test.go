package process

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
	e := MapsEntry{Start: 0x1000, End: 0x2000, Path: "/lib/x.so", Executable: true}
	tests := []struct {
		name     string
		mapFiles bool // map_files has the mapping's link
		inRoot   bool // root/<path> is the mapped file
		replaced bool // root/<path> is another file
		deleted  bool
		noProc   bool // the process is gone
		want     string
		exited   bool // the error is ErrExited
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
			inRoot := filepath.Join(dir, "root", e.Path)
			switch {
			case tt.inRoot:
				if err := os.Link(mapped, inRoot); err != nil {
					t.Fatal(err)
				}
			case tt.replaced:
				writeTestFile(t, inRoot, "other")
			}
			entry := e
			entry.Inode = inode(t, mapped)
			entry.Deleted = tt.deleted

			f, err := FS{Mount: procFS}.OpenMapping(pid, &entry)
			if tt.want == "" {
				if err == nil {
					f.Close()
					t.Fatal("opened a file, want an error")
				}
				if errors.Is(err, ErrExited) != tt.exited {
					t.Errorf("error %v: ErrExited %v, want %v", err, !tt.exited, tt.exited)
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

// TestMappingPath: the map_files link gives the path maps would show; a
// missing link is a mapping gone from a process that runs, or the process's
// exit.
func TestMappingPath(t *testing.T) {
	const pid = 42
	tests := []struct {
		name        string
		target      string // the link's target; "" for no link
		noProc      bool
		wantPath    string
		wantDeleted bool
		wantErr     error
	}{
		{name: "mapped file", target: "/lib/x.so", wantPath: "/lib/x.so"},
		{name: "deleted file", target: "/lib/x.so (deleted)", wantPath: "/lib/x.so", wantDeleted: true},
		{name: "mapping gone", wantErr: ErrMappingGone},
		{name: "process gone", noProc: true, wantErr: ErrExited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			procFS := t.TempDir()
			mapFiles := filepath.Join(procFS, fmt.Sprint(pid), "map_files")
			if !tt.noProc {
				mustMkdir(t, mapFiles)
			}
			if tt.target != "" {
				if err := os.Symlink(tt.target, filepath.Join(mapFiles, "1000-2000")); err != nil {
					t.Fatal(err)
				}
			}
			path, deleted, err := FS{Mount: procFS}.MappingPath(pid, 0x1000, 0x2000)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || path != tt.wantPath || deleted != tt.wantDeleted {
				t.Errorf("got %q, %v, %v; want %q, %v", path, deleted, err, tt.wantPath, tt.wantDeleted)
			}
		})
	}
}

package main

import (
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree lays out a fake include tree under root: each path is a file,
// with the contents given (or empty).
func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for path, body := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p, ".gz") {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			z := gzip.NewWriter(f)
			_, err = z.Write([]byte(body))
			if err := errors.Join(err, z.Close(), f.Close()); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTreeRelease(t *testing.T) {
	const patchlevel = "#define PY_VERSION              \"3.14.10\"\n"
	debian := map[string]string{
		"usr/include/python3.14/Python.h":                     "",
		"usr/include/python3.14/patchlevel.h":                 patchlevel,
		"usr/include/python3.14/pyconfig.h":                   "",
		"usr/include/x86_64-linux-gnu/python3.14/pyconfig.h":  "",
		"usr/include/python3.14t/Python.h":                    "", // free-threaded, not taken
		"usr/share/doc/libpython3.14-dev/changelog.Debian.gz": "python3.14 (3.14.10-1) unstable; urgency=medium\n",
	}
	plain := map[string]string{
		"include/python3.14/Python.h":     "",
		"include/python3.14/patchlevel.h": patchlevel,
		"include/python3.14/pyconfig.h":   "",
	}
	tests := []struct {
		name      string
		files     map[string]string
		dir       string // relative to the temporary root
		fetched   string
		arch      string
		includes  []string // relative to the temporary root
		origin    string
		errorText string
	}{
		{name: "debian amd64", files: debian, dir: "usr/include", arch: "amd64",
			includes: []string{"usr/include/x86_64-linux-gnu/python3.14", "usr/include/python3.14", "usr/include"},
			origin:   "headers of Debian unstable's libpython3.14-dev 3.14.10-1"},
		{name: "debian, other architecture only", files: debian, dir: "usr/include", arch: "arm64",
			errorText: "none for arm64"},
		{name: "fetched", files: debian, dir: "usr/include", fetched: "3.14", arch: "amd64",
			includes: []string{"usr/include/x86_64-linux-gnu/python3.14", "usr/include/python3.14", "usr/include"},
			origin:   "headers of Debian unstable's libpython3.14-dev 3.14.10-1, fetched by utils/pyfetch"},
		{name: "fetched, missing", dir: "nothing/{arch}/include", fetched: "3.14", arch: "arm64",
			errorText: "run utils/pyfetch/fetch-python.sh 3.14 arm64"},
		{name: "no multiarch", files: plain, dir: "include", arch: "arm64",
			includes: []string{"include/python3.14"}, origin: "headers in "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tt.files)
			r, err := tree{Dir: filepath.Join(root, tt.dir), Fetched: tt.fetched}.release(toolchain{Arch: tt.arch})
			if tt.errorText != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errorText) {
					t.Fatalf("error = %v, want one mentioning %q", err, tt.errorText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, inc := range tt.includes {
				want = append(want, filepath.Join(root, inc))
			}
			if r.Name != "3.14.10" || r.Minor != 14 || r.Patch != 10 || !slices.Equal(r.Includes, want) ||
				!strings.HasPrefix(r.Origin, tt.origin) {
				t.Errorf("release = %+v, want 3.14.10 with includes %q from %q", r, want, tt.origin)
			}
		})
	}
}

// TestSourcesReleases checks that a tree replaces pyenv's release of its
// minor version.
func TestSourcesReleases(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"pyenv/3.13.0/include/python3.13/Python.h":   "",
		"pyenv/3.14.0/include/python3.14/Python.h":   "",
		"pyenv/3.14.0t/include/python3.14t/Python.h": "",
		"tree/python3.14/Python.h":                   "",
		"tree/python3.14/patchlevel.h":               "#define PY_VERSION \"3.14.2\"\n",
	})
	s := sources{Pyenv: filepath.Join(root, "pyenv"), Trees: []tree{{Dir: filepath.Join(root, "tree")}}}
	rs, err := s.releases(toolchain{Arch: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{"3.13.0", "3.14.2"}) {
		t.Errorf("releases = %q, want 3.13.0 from pyenv and 3.14.2 from the tree", names)
	}
}

func TestReleasesByOrigin(t *testing.T) {
	ls := []layout{
		{Release: "3.12.1", Origin: "pyenv", Arch: "amd64"},
		{Release: "3.13.0", Origin: "pyenv", Arch: "amd64"},
		{Release: "3.14.10", Origin: "Debian", Arch: "amd64"},
		{Release: "3.12.1", Origin: "pyenv", Arch: "arm64"},
		{Release: "3.14.10", Origin: "Debian", Arch: "arm64"},
	}
	if got, want := releasesByOrigin(ls), "3.12.1, 3.13.0 (pyenv) and 3.14.10 (Debian)"; got != want {
		t.Errorf("releasesByOrigin = %q, want %q", got, want)
	}
}

package golabels

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/gofetch"
)

// program is a Go program that sets labels, as the workloads do.
const program = `package main

import (
	"context"
	"runtime/pprof"
)

func main() {
	pprof.Do(context.Background(), pprof.Labels("k", "v"), func(context.Context) {})
}
`

// build builds program with a tested Go release for goarch, with extra
// go build arguments and environment; it returns the file opened.
func build(t *testing.T, version, goarch string, env []string, args ...string) (*elf.File, *os.File) {
	t.Helper()
	goCmd, goEnv, err := gofetch.Command(version)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, text := range map[string]string{"main.go": program, "go.mod": "module p\n\ngo 1.19\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "p")
	cmd := exec.Command(goCmd, append(append([]string{"build", "-o", bin}, args...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(append(append(os.Environ(), goEnv...), "GOARCH="+goarch, "CGO_ENABLED=0"), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s build: %v\n%s", version, err, out)
	}
	r, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	f, err := elf.NewFile(r)
	if err != nil {
		t.Fatal(err)
	}
	return f, r
}

func symbols(f *elf.File) []elf.Symbol {
	syms, _ := f.Symbols()
	return syms
}

// TestOffsetTable builds a program with every tested Go release for amd64
// and arm64 and checks the table's offsets against the runtime's DWARF,
// and that Read finds them: the table is what stripped programs get.
func TestOffsetTable(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]bool{}
	for _, v := range gofetch.Versions {
		for _, goarch := range []string{"amd64", "arm64"} {
			t.Run(v+"/"+goarch, func(t *testing.T) {
				t.Parallel()
				f, r := build(t, v, goarch, nil)
				fromDWARF, err := offsetsFromDWARF(f)
				if err != nil {
					t.Fatal(err)
				}
				minor, _ := releaseMinor("go" + v)
				mu.Lock()
				seen[minor] = true
				mu.Unlock()
				if got := releaseOffsets[minor]; got != fromDWARF {
					t.Errorf("table: %+v, DWARF: %+v", got, fromDWARF)
				}
				l, err := Read(f, r, symbols(f))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(l.Version, "go"+v) || l.LabelsMap != (minor < firstSliceLabels) ||
					[3]int64{int64(l.GM), int64(l.MCurg), int64(l.GLabels)} != [3]int64{fromDWARF.gM, fromDWARF.mCurg, fromDWARF.gLabels} {
					t.Errorf("Read: %+v", l)
				}
				// Without cgo: no TLS segment; g at -8 from the fs base,
				// in x28 on arm64.
				if want := (goarch == "arm64"); l.GInRegister != want || (!want && l.TLSOffset != -8) {
					t.Errorf("g: in register %v, TLS offset %d", l.GInRegister, l.TLSOffset)
				}
			})
		}
	}
	t.Cleanup(func() {
		for minor := range releaseOffsets {
			if !seen[minor] && !t.Failed() {
				t.Errorf("the table's Go 1.%d is built by no tested toolchain", minor)
			}
		}
	})
}

// TestTLS: programs linked by the C linker (cgo) keep g in a TLS variable
// whose offset comes from the symbol table, or, stripped, from the TLS
// segment alone.
func TestTLS(t *testing.T) {
	cases := []struct {
		goarch, cc string
		want       int64
	}{
		// x86_64: the segment (8 bytes, runtime.tlsg at 0) ends at the
		// thread pointer.
		{"amd64", "gcc", -8},
		// arm64: it starts 16 bytes past the thread pointer, with
		// runtime.tls_g at 0; stripped, g is read from x28.
		{"arm64", "aarch64-linux-gnu-gcc", 16},
	}
	for _, c := range cases {
		for _, stripped := range []bool{false, true} {
			name := c.goarch
			ldflags := "-linkmode=external"
			if stripped {
				name += "_stripped"
				ldflags += " -s -w"
			}
			t.Run(name, func(t *testing.T) {
				if _, err := exec.LookPath(c.cc); err != nil {
					t.Fatalf("%s: %v (make test-deps installs it)", c.cc, err)
				}
				f, r := build(t, gofetch.System, c.goarch, []string{"CGO_ENABLED=1", "CC=" + c.cc}, "-ldflags="+ldflags)
				l, err := Read(f, r, symbols(f))
				if err != nil {
					t.Fatal(err)
				}
				inRegister := stripped && c.goarch == "arm64"
				if l.GInRegister != inRegister || (!inRegister && l.TLSOffset != c.want) {
					t.Errorf("g: in register %v, TLS offset %d; want %v, %d", l.GInRegister, l.TLSOffset, inRegister, c.want)
				}
			})
		}
	}
}

func TestReadRefuses(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	notGo := "/bin/sh"
	for name, c := range map[string]struct {
		path string
		want error
	}{
		"C program":   {notGo, ErrNotGo},
		"test binary": {self, nil}, // a Go program: this test's own
	} {
		t.Run(name, func(t *testing.T) {
			r, err := os.Open(c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			f, err := elf.NewFile(r)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Read(f, r, symbols(f)); !errors.Is(err, c.want) {
				t.Errorf("Read: %v, want %v", err, c.want)
			}
		})
	}
	t.Run("c-shared", func(t *testing.T) {
		f, r := build(t, gofetch.System, "amd64", []string{"CGO_ENABLED=1"}, "-buildmode=c-shared")
		if _, err := Read(f, r, symbols(f)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Read: %v, want ErrUnsupported", err)
		}
	})
}

func TestReleaseMinor(t *testing.T) {
	for v, want := range map[string]int{"go1.24.4": 24, "go1.22rc1": 22, "go1.26.8 X:boringcrypto": 26, "go1.9": 9,
		"devel go1.27-abc": -1, "go2.0": -1, "go1.": -1} {
		got, ok := releaseMinor(v)
		if (want < 0) == ok || (ok && got != want) {
			t.Errorf("releaseMinor(%q) = %d, %v", v, got, ok)
		}
	}
}

package perl

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
)

// detectFile runs Detect on a file as the process manager would.
func detectFile(t testing.TB, path string) (*Binary, error) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// A file without .dynsym (the static test binary) has no symbols to
	// detect by.
	dyn, _ := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	return Detect(f, dyn)
}

// TestDetectNotPerl: other files are not taken for Perl, Debian's
// launcher (which imports the interpreter from libperl) among them.
func TestDetectNotPerl(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	files := []string{exe}
	for _, v := range perlfetch.Versions {
		_, launcher, err := perlfetch.Libperl(v)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, launcher)
	}
	for _, f := range files {
		if _, err := detectFile(t, f); !errors.Is(err, ErrNotPerl) {
			t.Errorf("%s: %v, want ErrNotPerl", f, err)
		}
	}
}

// perlFile is a file with a tested interpreter in it and the command that
// runs it here (none for another architecture's).
type perlFile struct{ name, version, arch, file, perl string }

func perlFiles(t testing.TB) []perlFile {
	var out []perlFile
	for _, v := range perlfetch.Versions {
		pl, err := perlfetch.Perl(v)
		if err != nil {
			t.Fatal(err)
		}
		exe, err := perlfetch.Executable(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, perlFile{v, v, runtime.GOARCH, exe, pl})
	}
	for _, v := range perlfetch.Versions {
		lib, _, err := perlfetch.Libperl(v)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := perlfetch.LibperlPerl(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, perlFile{v + " libperl", v, runtime.GOARCH, lib, pl})
	}
	return out
}

// arm64Files are the arm64 builds of the tested versions (the kernel
// matrix runs them), read here as files.
func arm64Files(t testing.TB) []perlFile {
	var out []perlFile
	for _, v := range perlfetch.Versions {
		exe, err := perlfetch.ExecutableFor(v, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		lib, _, err := perlfetch.LibperlFor(v, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, perlFile{v + " arm64", v, "arm64", exe, ""}, perlFile{v + " arm64 libperl", v, "arm64", lib, ""})
	}
	return out
}

// TestDetect checks what Detect reads from Debian's builds: version,
// runops loops, the pthread key and the interpreter's size, which must be
// the layout's.
func TestDetect(t *testing.T) {
	for _, pf := range append(perlFiles(t), arm64Files(t)...) {
		t.Run(pf.name, func(t *testing.T) {
			b, err := detectFile(t, pf.file)
			if err != nil {
				t.Fatalf("%s: %v", pf.file, err)
			}
			t.Logf("%v: runops %#x, PL_thr_key %#x, interpreter of %d bytes", b.Version, b.Runops, b.ThrKey, b.InterpSize)
			if got := b.Version.MajorMinor(); got != pf.version {
				t.Errorf("version %v, want %s", b.Version, pf.version)
			}
			if len(b.Runops) != 2 {
				t.Errorf("%d runops loops, want 2 (standard and debug)", len(b.Runops))
			}
			for _, r := range b.Runops {
				if n := r[1] - r[0]; n == 0 || n > 4096 {
					t.Errorf("runops loop %#x of %d bytes", r, n)
				}
			}
			if b.ThrKey == 0 {
				t.Error("no PL_thr_key: Debian's perls are threaded")
			}
			if err := b.checkFor(pf.arch); err != nil {
				t.Error(err)
			}
		})
	}
}

// stopped stops pid with ptrace until the test's end and returns its main
// thread's fs base: what the process holds stays put while it is read.
func stopped(t testing.TB, pid int) uint64 {
	t.Helper()
	runtime.LockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		t.Fatalf("PTRACE_SEIZE: %v", err)
	}
	t.Cleanup(func() { unix.PtraceDetach(pid); runtime.UnlockOSThread() })
	if err := unix.PtraceInterrupt(pid); err != nil {
		t.Fatalf("PTRACE_INTERRUPT: %v", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		t.Fatalf("PTRACE_GETREGS: %v", err)
	}
	return regs.Fs_base
}

// mapped returns where the file whose base name is name is loaded in pid
// (the start of its mapping at file offset 0: the first segments of
// Debian's perl, libperl and libc have virtual address 0) and its path.
func mapped(t testing.TB, pid int, name string) (uint64, string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && (f[5] == name || strings.HasSuffix(f[5], "/"+name)) && f[2] == "00000000" {
			lo, _, _ := strings.Cut(f[0], "-")
			v, err := strconv.ParseUint(lo, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v, f[5]
		}
	}
	t.Fatalf("%s is not mapped in %d", name, pid)
	return 0, ""
}

// TestArm64ThreadData: the unwinder finds a thread's interpreter through
// PL_thr_key and the C library's thread-specific data (internals.md §1.4,
// §11): the pthread_getspecific of each arm64 build's own C library
// (libpthread's before glibc 2.34) decodes to glibc's layout, its key
// blocks below the thread pointer (TLS variant I).
func TestArm64ThreadData(t *testing.T) {
	for _, v := range perlfetch.Versions {
		t.Run(v, func(t *testing.T) {
			tree, err := perlfetch.Tree(v, "arm64")
			if err != nil {
				t.Fatal(err)
			}
			var found []string
			for _, dir := range []string{"usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu"} {
				for _, name := range []string{"libc.so.6", "libpthread.so.0"} {
					path := filepath.Join(tree[0], dir, name)
					f, err := elf.Open(path)
					if err != nil {
						continue
					}
					defer f.Close()
					l, err := libc.TSDLayoutFromLibc(f)
					if err != nil {
						continue // the other library has pthread_getspecific
					}
					found = append(found, path)
					t.Logf("%s: %+v", path, l)
					if l.Libc != libc.LibcGlibc || l.SelfDeref || l.BlockDeref || l.EntrySize != 16 || l.DataOffset != 8 ||
						l.MaxFastKey != 32 || l.FirstBlockOffset >= 0 || l.FirstBlockOffset < -4096 {
						t.Errorf("%s: %+v, want glibc's key blocks below the thread pointer", path, l)
					}
				}
			}
			if len(found) != 1 {
				t.Errorf("%d C libraries in %s with a pthread_getspecific decoded (%q), want 1", len(found), tree[0], found)
			}
		})
	}
}

package debuginfo

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/llvmsym"
)

// cppChain is the C++ workload of the symbolizer's tests: a namespace, a
// template, a lambda, an operator and a static inline helper that GCC
// inlines at -O2.
var cppChain = filepath.Join("..", "..", "utils", "workloads", "cppchain.cpp")

// build compiles cppchain.cpp with flags into dir.
func build(t *testing.T, dir, name string, flags ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args := append([]string{"-O2", "-o", out}, flags...)
	if b, err := exec.Command("g++", append(args, cppChain)...).CombinedOutput(); err != nil {
		t.Fatalf("g++ %v: %v\n%s", flags, err, b)
	}
	return out
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if b, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, b)
	}
}

func open(t *testing.T, path string, opts Options) (*File, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if opts.MaxDecompressed == 0 {
		opts.MaxDecompressed = 1 << 28
	}
	d, err := Open(Executable{File: f, Root: "/", Path: path}, opts)
	if d != nil {
		t.Cleanup(func() { d.Close() })
	}
	return d, err
}

// splitDebug moves bin's DWARF into debug, as Debian's -dbgsym packages
// do, leaving bin with its symbol table.
func splitDebug(t *testing.T, bin, debug string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(debug), 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "objcopy", "--only-keep-debug", bin, debug)
	run(t, "strip", "--strip-debug", bin)
}

func copyFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := path + ".oracle"
	if err := os.WriteFile(out, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

func buildIDPath(t *testing.T, dir, bin string) string {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id := fmt.Sprintf("%x", gnuBuildID(f))
	if id == "" {
		t.Fatal("no build id")
	}
	return filepath.Join(dir, ".build-id", id[:2], id[2:]+".debug")
}

// TestDWARFAgainstSymbolizer: at every address of the workload's
// functions, in every way of shipping its debug information, the frames
// (inlined ones first), their functions, files and lines are those
// llvm-symbolizer gives.
func TestDWARFAgainstSymbolizer(t *testing.T) {
	if _, err := exec.LookPath(llvmsym.Command); err != nil {
		t.Fatalf("%s: %v (make test-deps installs it)", llvmsym.Command, err)
	}
	cases := []struct {
		name   string
		source string
		// prepare builds the binary and returns it, the debug dirs and
		// the file the oracle reads (a copy with its DWARF in place).
		prepare func(t *testing.T, dir string) (bin string, dirs []string, oracle string)
		// inflate is where compressed sections go: "" the heap, "dir"
		// files of a directory, "full" a directory without room (the
		// heap again).
		inflate string
	}{
		{"in the file", "file", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g")
			return bin, nil, bin
		}, ""},
		{"DWARF 4, compressed", "file", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-gdwarf-4", "-gz")
			return bin, nil, bin
		}, ""},
		{"DWARF 4, compressed, inflated into files", "file", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-gdwarf-4", "-gz")
			return bin, nil, bin
		}, "dir"},
		{"DWARF 5, compressed, no room to inflate into files", "file", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g", "-gz")
			return bin, nil, bin
		}, "full"},
		{"LTO, units refer into each other", "file", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g", "-flto")
			return bin, nil, bin
		}, ""},
		{"by build id", "build-id", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g")
			oracle := copyFile(t, bin)
			debugDir := filepath.Join(dir, "debug")
			splitDebug(t, bin, buildIDPath(t, debugDir, bin))
			return bin, []string{debugDir}, oracle
		}, ""},
		{"by debug link beside it, no build id", "debuglink", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g", "-Wl,--build-id=none")
			oracle := copyFile(t, bin)
			splitDebug(t, bin, filepath.Join(dir, "bin.debug"))
			run(t, "objcopy", "--add-gnu-debuglink="+filepath.Join(dir, "bin.debug"), bin)
			return bin, nil, oracle
		}, ""},
		{"by debug link under the debug dir", "debuglink", func(t *testing.T, dir string) (string, []string, string) {
			bin := build(t, dir, "bin", "-g")
			oracle := copyFile(t, bin)
			debugDir := filepath.Join(dir, "debug")
			debug := filepath.Join(debugDir, dir, "bin.debug")
			splitDebug(t, bin, debug)
			run(t, "objcopy", "--add-gnu-debuglink="+debug, bin)
			return bin, []string{debugDir}, oracle
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin, dirs, oracle := c.prepare(t, dir)
			opts := Options{DebugDirs: dirs, MaxDecompressed: 1 << 30}
			switch c.inflate {
			case "dir":
				opts.InflateDir = t.TempDir()
			case "full":
				opts.InflateDir = smallTmpfs(t)
			}
			d, err := open(t, bin, opts)
			if err != nil {
				t.Fatal(err)
			}
			// The file and a debug file are mapped, and so is each
			// section inflated into a file: in "full", those that fit
			// (not .debug_info, nor .debug_line).
			spilled := len(d.maps) - 1
			if d.Source != "file" {
				spilled--
			}
			if c.inflate == "" && spilled != 0 || c.inflate == "dir" && spilled < 3 || c.inflate == "full" && spilled > 2 {
				t.Errorf("inflate %q: %d sections inflated into files", c.inflate, spilled)
			}
			if d.Source != c.source {
				t.Errorf("found in %q, want %q", d.Source, c.source)
			}
			// Units are read one by one unless they refer into each
			// other (DW_FORM_ref_addr, which LTO's DWARF uses).
			if whole := d.lines.(*dwarfLines).d != nil; whole != strings.HasPrefix(c.name, "LTO") {
				t.Errorf("all units parsed at once: %v", whole)
			}
			addrs := functionAddrs(t, bin)
			want := symbolize(t, oracle, addrs)
			inlined := 0
			for i, addr := range addrs {
				frames, err := d.Lookup(addr)
				if err != nil {
					t.Fatalf("%#x: %v", addr, err)
				}
				got := positions(frames)
				if !slices.Equal(got, want[i]) {
					t.Fatalf("%#x:\n got  %v\n want %v", addr, got, want[i])
				}
				if len(frames) > 1 {
					inlined++
				}
			}
			t.Logf("%d addresses, %d in inlined code", len(addrs), inlined)
			if inlined == 0 {
				t.Error("no inlined frames")
			}
		})
	}
}

// smallTmpfs mounts a tmpfs of 8 KiB, too small for any section.
func smallTmpfs(t *testing.T) string {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8k,mode=0700"); err != nil {
		t.Fatalf("mounting a small tmpfs (the test runs as root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	return dir
}

// TestNoDebugInfo: a file built without -g, and one whose debug link
// leads nowhere or to a file of another build, have none.
func TestNoDebugInfo(t *testing.T) {
	dir := t.TempDir()
	bin := build(t, dir, "nog")
	if _, err := open(t, bin, Options{DebugDirs: []string{dir}}); !errors.Is(err, ErrNoDebugInfo) {
		t.Errorf("without -g: %v, want ErrNoDebugInfo", err)
	}
	other := build(t, dir, "other", "-g", "-DOTHER", "-Wl,--build-id=none")
	linked := build(t, dir, "linked", "-Wl,--build-id=none")
	run(t, "objcopy", "--only-keep-debug", other, filepath.Join(dir, "other.debug"))
	run(t, "objcopy", "--add-gnu-debuglink="+filepath.Join(dir, "other.debug"), linked)
	// The link's CRC is of other.debug; now it is replaced by a file of
	// other content.
	if err := os.WriteFile(filepath.Join(dir, "other.debug"), []byte("\x7fELF not this one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, linked, Options{}); !errors.Is(err, ErrNoDebugInfo) {
		t.Errorf("debug link to a changed file: %v, want ErrNoDebugInfo", err)
	}
}

// TestTooLarge: compressed sections that inflate beyond the limit are
// refused before they are inflated.
func TestTooLarge(t *testing.T) {
	bin := build(t, t.TempDir(), "bin", "-g", "-gz")
	if _, err := open(t, bin, Options{MaxDecompressed: 1024}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("got %v, want ErrTooLarge", err)
	}
}

type position struct {
	function, file string
	line           uint32
}

func positions(frames []Frame) []position {
	var out []position
	for _, f := range frames {
		out = append(out, position{f.Function, f.File, f.Line})
	}
	return out
}

// functionAddrs returns every address of the workload's own functions.
func functionAddrs(t *testing.T, bin string) []uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	var addrs []uint64
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 && (strings.Contains(s.Name, "geo") || s.Name == "main") {
			for a := s.Value; a < s.Value+s.Size; a++ {
				addrs = append(addrs, a)
			}
		}
	}
	if len(addrs) < 100 {
		t.Fatalf("only %d addresses in the workload's functions", len(addrs))
	}
	return addrs
}

// cloneSuffix is what GCC appends to a specialised copy's symbol; DWARF
// names the function it was made from.
var cloneSuffix = regexp.MustCompile(`\.(isra|constprop|part|cold)\.[0-9].*$`)

// symbolize asks llvm-symbolizer for the frames at addrs, without the
// suffix of a clone's symbol and with cleaned paths.
func symbolize(t *testing.T, bin string, addrs []uint64) [][]position {
	t.Helper()
	frames, err := llvmsym.Symbolize(bin, addrs)
	if err != nil {
		t.Fatal(err)
	}
	res := make([][]position, len(frames))
	for i, fs := range frames {
		for _, f := range fs {
			p := position{function: cloneSuffix.ReplaceAllString(f.Function, ""), line: uint32(f.Line)}
			if f.File != "" {
				p.file = filepath.Clean(f.File)
			}
			res[i] = append(res[i], p)
		}
	}
	return res
}

// libc is Debian's C library; libc6-dbg puts its DWARF under
// /usr/lib/debug/.build-id (.ci/install-test-deps.sh installs it).
const libc = "/lib/x86_64-linux-gnu/libc.so.6"

// TestLibcAgainstSymbolizer: on a large real library with its DWARF in a
// -dbgsym-style build-id file (compressed, DWARF 5, many units), the frames
// at addresses spread over all its functions are llvm-symbolizer's.
func TestLibcAgainstSymbolizer(t *testing.T) {
	if _, err := exec.LookPath(llvmsym.Command); err != nil {
		t.Fatalf("%s: %v (make test-deps installs it)", llvmsym.Command, err)
	}
	d, err := open(t, libc, Options{DebugDirs: []string{"/usr/lib/debug"}, MaxDecompressed: 1 << 30, InflateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("%s: %v (make test-deps installs libc6-dbg)", libc, err)
	}
	if d.Source != "build-id" {
		t.Errorf("found in %q, want build-id", d.Source)
	}
	f, err := elf.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var addrs []uint64
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			addrs = append(addrs, s.Value, s.Value+s.Size/2, s.Value+s.Size-1)
		}
	}
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	want := symbolize(t, libc, addrs)
	same, withLine, inlined := 0, 0, 0
	var diffs []string
	for i, addr := range addrs {
		frames, err := d.Lookup(addr)
		if err != nil {
			t.Fatalf("%#x: %v", addr, err)
		}
		got := positions(frames)
		// llvm-symbolizer names the function holding the address by
		// the symbol table (abort where DWARF says __GI_abort), as
		// processmanager does: only inlined frames' names are compared.
		if n := len(got); n > 0 && n == len(want[i]) {
			got[n-1].function = want[i][n-1].function
		}
		if slices.Equal(got, want[i]) {
			same++
		} else if len(diffs) < 5 {
			diffs = append(diffs, fmt.Sprintf("%#x:\n got  %v\n want %v", addr, got, want[i]))
		}
		if len(frames) > 0 && frames[0].Line > 0 {
			withLine++
		}
		if len(frames) > 1 {
			inlined++
		}
	}
	t.Logf("%d addresses: %d as llvm-symbolizer gives them, %d with a line, %d in inlined code",
		len(addrs), same, withLine, inlined)
	for _, d := range diffs {
		t.Log(d)
	}
	if same < len(addrs)*99/100 || inlined == 0 {
		t.Errorf("%d of %d addresses agree, want >= 99%%", same, len(addrs))
	}
}

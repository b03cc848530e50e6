package integration

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// Workloads are normally built here and run here. The kernel matrix
// (utils/kernelmatrix) runs this package in VMs that have no compiler, so it
// splits the two:
//   - EBPF_PROFILER_TEST_PREPARE=DIR (with EBPF_PROFILER_TEST_GOARCH for
//     the VM's architecture) builds each selected test's workloads into DIR
//     on the host, then skips the test where it would start profiling;
//   - EBPF_PROFILER_TEST_WORKLOADS=DIR, in the VM, runs the tests with the
//     workloads found there instead of building them.
//
// A workload's directory under DIR is named by a hash of how it is built,
// so the same test finds the same binary on both sides. Scripts are copied
// to DIR/scripts, and the runtimes that run them (trees fetched for the
// VM's architecture) are listed in DIR/trees for the VM to hold at the
// same paths.
const (
	prepareEnv   = "EBPF_PROFILER_TEST_PREPARE"
	prepareArch  = "EBPF_PROFILER_TEST_GOARCH"
	prebuiltEnv  = "EBPF_PROFILER_TEST_WORKLOADS"
	symbolSuffix = ".symbols"
	scriptsDir   = "scripts"
	treesFile    = "trees"
)

// inVM says whether the tests run in a kernel-matrix VM, on the workloads
// built ahead for it.
func inVM() bool { return os.Getenv(prebuiltEnv) != "" }

// preparing reports whether this run only builds workloads.
func preparing() bool { return os.Getenv(prepareEnv) != "" }

// skipIfPreparing ends a test where it would start profiling when the run
// only builds workloads.
func skipIfPreparing(t *testing.T) {
	t.Helper()
	if preparing() {
		t.Skip("workloads prepared in " + os.Getenv(prepareEnv))
	}
}

// toolchain is the compilers and strip for the architecture the workloads
// run on.
type toolchain struct{ goarch, cc, cxx, strip string }

// targetArch is the GOARCH the workloads run on.
func targetArch() string {
	if preparing() && os.Getenv(prepareArch) != "" {
		return os.Getenv(prepareArch)
	}
	return runtime.GOARCH
}

func targetToolchain(t *testing.T) toolchain {
	t.Helper()
	goarch := targetArch()
	if goarch == runtime.GOARCH {
		return toolchain{goarch, "gcc", "g++", "strip"}
	}
	switch goarch {
	case "arm64":
		return toolchain{goarch, "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", "aarch64-linux-gnu-strip"}
	case "amd64":
		return toolchain{goarch, "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++", "x86_64-linux-gnu-strip"}
	}
	t.Fatalf("no cross toolchain for %s", goarch)
	return toolchain{}
}

// workloadPath is where the workload binName built by recipe goes, and
// whether it must be built: in a fresh temporary directory here, under
// the prepare directory, or already built under the prebuilt one.
func workloadPath(t *testing.T, binName string, recipe ...string) (path string, build bool) {
	t.Helper()
	key := fmt.Sprintf("%s-%016x", binName, xxh3.HashString(strings.Join(recipe, "\x00")))
	switch {
	case preparing():
		dir := filepath.Join(os.Getenv(prepareEnv), key)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(dir, binName), true
	case inVM():
		path = filepath.Join(os.Getenv(prebuiltEnv), key, binName)
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("workload %s %q was not prepared for this run: %v", binName, recipe, err)
		}
		return path, false
	}
	return filepath.Join(t.TempDir(), binName), true
}

// buildWorkload compiles utils/workloads/<name>.c.
func buildWorkload(t *testing.T, name string, flags ...string) string {
	t.Helper()
	return buildWorkloadAs(t, name, name, flags...)
}

// buildWorkloadAs compiles utils/workloads/<name>.c into a binary named bin.
func buildWorkloadAs(t *testing.T, name, binName string, flags ...string) string {
	t.Helper()
	bin, build := workloadPath(t, binName, append([]string{"c", name}, flags...)...)
	if build {
		src := filepath.Join(workloadDir(""), name+".c")
		run(t, "", nil, targetToolchain(t).cc, append(append([]string{}, flags...), "-o", bin, src)...)
	}
	return bin
}

// buildGo builds a Go workload and strips it, so Go function names can
// only come from .gopclntab; the test names its C functions from the
// symbols it had.
func buildGo(t *testing.T, name string) (string, *symbolTable) {
	t.Helper()
	bin, build := workloadPath(t, name, "go", name)
	if build {
		tc := targetToolchain(t)
		// cgo needs the target's C compiler when cross-compiling.
		run(t, workloadDir(name), []string{"GOARCH=" + tc.goarch, "CC=" + tc.cc, "CGO_ENABLED=1"},
			"go", "build", "-o", bin, ".")
	}
	return bin, stripCopy(t, bin)
}

// buildRecursion builds the C++ recursion workload and its library with
// -O2 -fomit-frame-pointer.
func buildRecursion(t *testing.T) (string, *symbolTable) {
	t.Helper()
	flags := []string{"-O2", "-fomit-frame-pointer"}
	bin, build := workloadPath(t, "recursion", append([]string{"c++", "recursion"}, flags...)...)
	if build {
		src, out, cxx := workloadDir("recursion"), filepath.Dir(bin), targetToolchain(t).cxx
		run(t, src, nil, cxx, append(flags, "-shared", "-fPIC", "-o", filepath.Join(out, "librec.so"), "librec.cpp")...)
		run(t, src, nil, cxx, append(flags, "-o", bin, "main.cpp", "-L"+out, "-lrec", "-Wl,-rpath,$ORIGIN")...)
	}
	return bin, nil
}

// buildRust builds the Rust workload with cargo, offline (it has no
// dependencies), for this machine only.
func buildRust(t *testing.T) (string, *symbolTable) {
	t.Helper()
	if preparing() || inVM() {
		t.Fatal("the Rust workload is built only where it runs (no cross build)")
	}
	if _, err := exec.LookPath("cargo"); err != nil {
		home, _ := os.UserHomeDir()
		if _, err := os.Stat(filepath.Join(home, ".cargo", "bin", "cargo")); err != nil {
			t.Fatal("cargo not found in PATH or ~/.cargo/bin")
		}
		t.Setenv("PATH", filepath.Join(home, ".cargo", "bin")+":"+os.Getenv("PATH"))
	}
	target := t.TempDir()
	run(t, workloadDir("rustchain"), nil, "cargo", "build", "--release", "--offline", "--target-dir", target)
	return filepath.Join(target, "release", "rustchain"), nil
}

// buildDlopen builds utils/workloads/dlopen and its library with -O2
// -fomit-frame-pointer and strips the executable; the library keeps its
// symbols.
func buildDlopen(t *testing.T) (bin, lib string, syms *symbolTable) {
	t.Helper()
	flags := []string{"-O2", "-fomit-frame-pointer"}
	bin, build := workloadPath(t, "dlopen", append([]string{"c", "dlopen"}, flags...)...)
	lib = filepath.Join(filepath.Dir(bin), "libdlhot.so")
	if build {
		src, cc := workloadDir("dlopen"), targetToolchain(t).cc
		run(t, src, nil, cc, append(flags, "-shared", "-fPIC", "-o", lib, "libdlhot.c")...)
		run(t, src, nil, cc, append(flags, "-o", bin, "main.c", "-ldl")...)
	}
	return bin, lib, stripCopy(t, bin)
}

// buildTestAgent builds utils/testagent, the test APM agent library and
// the application that loads it, and returns their paths.
func buildTestAgent(t *testing.T) (agent, app string) {
	t.Helper()
	tc := targetToolchain(t)
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[tc.goarch]
	app, build := workloadPath(t, "app", "testagent", arch)
	dir, err := filepath.Abs(filepath.Dir(app)) // make runs elsewhere
	if err != nil {
		t.Fatal(err)
	}
	if build {
		run(t, filepath.Join(workloadDir(""), "..", "testagent"), nil,
			"make", "-s", "OUT="+dir, "ARCH="+arch, "CC="+tc.cc)
	}
	return filepath.Join(dir, "elastic-jvmti-linux-"+arch+".so"), filepath.Join(dir, "app")
}

// workloadDir is utils/workloads/<name>.
func workloadDir(name string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", name)
}

// scriptPath returns the path of a script under utils/workloads: in a VM,
// its copy under the prebuilt directory, which the prepare step makes.
func scriptPath(t *testing.T, elem ...string) string {
	t.Helper()
	rel := filepath.Join(elem...)
	src := filepath.Join(workloadDir(""), rel)
	switch {
	case preparing():
		dst := filepath.Join(os.Getenv(prepareEnv), scriptsDir, rel)
		b, err := os.ReadFile(src)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(dst), 0o755)
		}
		if err == nil {
			err = os.WriteFile(dst, b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	case inVM():
		return filepath.Join(os.Getenv(prebuiltEnv), scriptsDir, rel)
	}
	return src
}

// vmTrees lists files and directories (absolute paths) that the VM must
// hold at the same paths for t, when the run prepares one: a runtime
// fetched for its architecture, whose executable names its loader and
// libraries by absolute path. A VM gets the trees of the tests it runs.
func vmTrees(t *testing.T, paths ...string) {
	t.Helper()
	if !preparing() {
		return
	}
	f, err := os.OpenFile(filepath.Join(os.Getenv(prepareEnv), treesFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		for _, p := range paths {
			if err == nil {
				_, err = fmt.Fprintf(f, "%s\t%s\n", t.Name(), p)
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// requireRuntime fails t when a fetched runtime is not there for the
// workloads' architecture: here, checked by here; for a VM being
// prepared, its tree (tree for the VM's GOARCH) is listed for it.
func requireRuntime(t *testing.T, tree func(arch string) ([]string, error), here func() error) {
	t.Helper()
	var err error
	if arch := targetArch(); arch != runtime.GOARCH {
		var paths []string
		if paths, err = tree(arch); err == nil {
			vmTrees(t, paths...)
		}
	} else {
		err = here()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// run runs a build step in dir with env added to the environment.
func run(t *testing.T, dir string, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// symbolTable is a binary's function symbols, to name the frames of a
// stripped copy of it.
type symbolTable struct {
	addrs []uint64
	names []string
}

func (s *symbolTable) lookup(addr uint64) string {
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > addr }) - 1
	if i < 0 {
		return ""
	}
	return s.names[i]
}

// readSymbols reads the symbols that name code in bin's .symtab, sorted by
// address.
func readSymbols(t *testing.T, bin string) *symbolTable {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	sort.SliceStable(syms, func(i, j int) bool { return syms[i].Value < syms[j].Value })
	s := &symbolTable{}
	for _, sym := range syms {
		typ := elf.ST_TYPE(sym.Info)
		// "$x" and "$d" are arm64 mapping symbols (code or data starts
		// here), not names.
		if sym.Name == "" || strings.HasPrefix(sym.Name, "$") || (typ != elf.STT_FUNC && typ != elf.STT_NOTYPE) ||
			sym.Section >= elf.SHN_LORESERVE || int(sym.Section) >= len(f.Sections) ||
			f.Sections[sym.Section].Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		s.addrs = append(s.addrs, sym.Value)
		s.names = append(s.names, sym.Name)
	}
	return s
}

// stripCopy strips bin in place after reading its symbols, which name the
// stripped binary's frames in the test (the profiler sees none). Prepared
// workloads keep the symbols beside them.
func stripCopy(t *testing.T, bin string) *symbolTable {
	t.Helper()
	if inVM() && !preparing() {
		return loadSymbols(t, bin+symbolSuffix)
	}
	syms := readSymbols(t, bin)
	if preparing() {
		saveSymbols(t, syms, bin+symbolSuffix)
	}
	run(t, "", nil, targetToolchain(t).strip, "--strip-all", bin)
	return syms
}

// saveSymbols writes syms as lines "ADDRESS NAME" (hexadecimal address).
func saveSymbols(t *testing.T, syms *symbolTable, path string) {
	t.Helper()
	var b strings.Builder
	for i, a := range syms.addrs {
		fmt.Fprintf(&b, "%x %s\n", a, syms.names[i])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadSymbols(t *testing.T, path string) *symbolTable {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("symbols of a prepared workload: %v", err)
	}
	defer f.Close()
	s := &symbolTable{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		addr, name, ok := strings.Cut(sc.Text(), " ")
		a, err := strconv.ParseUint(addr, 16, 64)
		if !ok || err != nil {
			t.Fatalf("%s: bad line %q", path, sc.Text())
		}
		s.addrs = append(s.addrs, a)
		s.names = append(s.names, name)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

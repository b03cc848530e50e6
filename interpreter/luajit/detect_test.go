package luajit

import (
	"debug/elf"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/utils/luajitfetch"
)

// openFile opens path as the process manager hands files to runtimes.
func openFile(t testing.TB, path string) *interpreter.File {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// A static executable (the test binary) has no .dynsym.
	dyn, _ := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	return &interpreter.File{
		Path: path, ELF: f, DynamicSymbols: dyn,
		FunctionRanges: func() ([][2]uint64, error) { return nativeunwind.FunctionRanges(f) },
	}
}

// TestDetectNotLuaJIT: other files are not taken for LuaJIT.
func TestDetectNotLuaJIT(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Detect(openFile(t, exe)); !errors.Is(err, ErrNotLuaJIT) {
		t.Errorf("test binary: %v, want ErrNotLuaJIT", err)
	}
}

// jitVersion is what a fetched version's luajit states as jit.version
// ("LuaJIT 2.1.N") when run here.
func jitVersion(t *testing.T, version string) string {
	t.Helper()
	cmd, err := luajitfetch.Command(version, "-e", "io.write(jit.version)")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("luajit %s: %v", version, err)
	}
	return strings.TrimPrefix(string(out), "LuaJIT ")
}

// TestDetect reads Debian's builds, executable and library, for both
// architectures: each must state the version the running luajit of the
// same source states, its VM must make every access of the known layout
// (internals.md §2.1, §3.3, §4.1), its unwind entry must be the one rule
// buildvm emits for the whole VM (§6.1: CFA = rsp+80 on x86_64, x29+16 on
// arm64) with lj_vm_ffi_call's frame-pointer rule after it, and the
// executable and the library must hold the same VM.
func TestDetect(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the expected versions come from running the amd64 builds")
	}
	for _, v := range luajitfetch.Versions {
		want := jitVersion(t, v)
		for _, arch := range luajitfetch.Arches {
			exe, err := luajitfetch.Executable(v, arch)
			if err != nil {
				t.Fatal(err)
			}
			lib, err := luajitfetch.Library(v, arch)
			if err != nil {
				t.Fatal(err)
			}
			var sizes []uint64
			for _, path := range []string{exe, lib} {
				f := openFile(t, path)
				b, err := Detect(f)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if err := b.Unsupported(); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if b.Version() != want {
					t.Errorf("%s: version %s, the luajit of %s states %s", path, b.Version(), v, want)
				}
				if !b.OpenResty {
					t.Errorf("%s: not recognised as OpenResty's fork", path)
				}
				t.Logf("%s %s %s: VM %#x-%#x, ffi call %#x-%#x, accesses %v", v, arch, path[strings.LastIndex(path, "/")+1:],
					b.VM[0], b.VM[1], b.FFICall[0], b.FFICall[1], b.Matches)
				checkVMRules(t, path, f.ELF, b)
				sizes = append(sizes, b.VM[1]-b.VM[0])
			}
			if sizes[0] != sizes[1] {
				t.Errorf("%s %s: VM of %d bytes in the executable, %d in the library", v, arch, sizes[0], sizes[1])
			}
		}
	}
}

// checkVMRules checks the stack deltas over the VM and lj_vm_ffi_call.
func checkVMRules(t *testing.T, path string, f *elf.File, b *Binary) {
	t.Helper()
	deltas, err := nativeunwind.Extract(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	vmRule := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 80, FPOffset: -16, RAOffset: -8}
	if f.Machine == elf.EM_AARCH64 {
		vmRule = nativeunwind.Rule{CFA: nativeunwind.CFAFP, CFAOffset: 16, FPOffset: -16, RAOffset: -8}
	}
	// ruleAt is the rule in effect at addr; n counts the deltas in
	// (start, end), where one rule must hold.
	ruleAt := func(addr uint64) (r nativeunwind.Rule) {
		for _, d := range deltas {
			if d.Address > addr {
				break
			}
			r = d.Rule
		}
		return r
	}
	n := 0
	for _, d := range deltas {
		if d.Address > b.VM[0] && d.Address < b.VM[1] {
			n++
		}
	}
	if r := ruleAt(b.VM[0]); r != vmRule || n != 0 {
		t.Errorf("%s: the VM starts with %v and has %d more rules, want one: %v", path, r, n, vmRule)
	}
	// On arm64 lj_vm_ffi_call's rule is the VM's, so no delta starts it.
	if r := ruleAt(b.FFICall[0]); r.CFA != nativeunwind.CFAFP || r.CFAOffset != 16 {
		t.Errorf("%s: lj_vm_ffi_call starts with %v, want cfa=fp+16", path, r)
	}
}

// TestLayoutChecked: the code check fails for a layout that differs from
// the build's in one field, for each field it checks (moved far enough not
// to land on another field the VM reads).
func TestLayoutChecked(t *testing.T) {
	v := luajitfetch.Versions[len(luajitfetch.Versions)-1]
	for _, arch := range luajitfetch.Arches {
		lib, err := luajitfetch.Library(v, arch)
		if err != nil {
			t.Fatal(err)
		}
		f := openFile(t, lib)
		b, err := Detect(f)
		if err != nil || b.Layout == nil {
			t.Fatalf("%s: %v, %v", lib, err, b.Unsupported())
		}
		code, err := interpreter.ReadELF(f.ELF, b.VM[0], b.VM[1]-b.VM[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			access string
			change func(l *Layout)
		}{
			{"load cur_L", func(l *Layout) { l.Global.CurL += 0x400 }},
			{"jit_base=BASE", func(l *Layout) { l.Global.JITBase += 0x400 }},
			{"load J->trace", func(l *Layout) { l.JIT.Trace += 0x400 }},
			{"SAVE_PC=PC", func(l *Layout) { l.CFrame.PC += 0x400 }},
			{"load proto k", func(l *Layout) { l.Proto.Size += 0x400 }},
		} {
			l := *b.Layout
			c.change(&l)
			if n := l.accesses(f.ELF.Machine, code)[c.access]; n != 0 {
				t.Errorf("%s: %s found %d times with a changed layout", lib, c.access, n)
			}
		}
	}
}

// TestUnknownLayouts: builds we have not checked get no layout.
func TestUnknownLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		m         elf.Machine
		release   uint64
		openResty bool
	}{
		{"unknown release", elf.EM_X86_64, 1700000000, true},
		{"upstream LuaJIT", elf.EM_X86_64, knownReleases[0], false},
		{"other architecture", elf.EM_RISCV, knownReleases[0], true},
	} {
		if l := knownLayouts(c.m, c.release, c.openResty); l != nil {
			t.Errorf("%s: layout %+v", c.name, l)
		}
	}
	b := &Binary{Release: 1700000000, OpenResty: true}
	if err := b.Unsupported(); err == nil || !strings.Contains(err.Error(), "2.1.1700000000") {
		t.Errorf("Unsupported() = %v, want an error naming 2.1.1700000000", err)
	}
}

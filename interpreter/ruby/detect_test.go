package ruby

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter/libc/libctest"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// detectFile runs Detect on a file as the process manager would.
func detectFile(t testing.TB, path string) *Binary {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	dyn, err := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Detect(f, dyn, func() ([][2]uint64, error) { return nativeunwind.FunctionRanges(f) })
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

// TestDetectNotRuby: other files are not taken for Ruby.
func TestDetectNotRuby(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dyn, _ := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	if _, err := Detect(f, dyn, func() ([][2]uint64, error) { return nil, nil }); err != ErrNotRuby {
		t.Errorf("test binary: %v, want ErrNotRuby", err)
	}
}

// TestDetect checks what Detect reads from Debian's libruby builds against
// a running interpreter of each: from the main thread's fs base, through
// the GOT pair's module id and the thread's DTV, to its execution context,
// whose current frame's instructions are addresses in the instruction loop
// Detect found (direct threading); and the symbol table's last_id counts
// the symbols a Ruby has at start.
func TestDetect(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to trace the interpreter")
	}
	type build struct{ name, version, lib, ruby string }
	var builds []build
	for _, v := range rubyfetch.Versions {
		lib, err := rubyfetch.Libruby(v)
		if err != nil {
			t.Fatal(err)
		}
		ruby, _ := rubyfetch.Ruby(v)
		builds = append(builds, build{v, v, lib, ruby})
	}
	// The interpreter linked into the executable: local-exec TLS.
	sv, static, err := rubyfetch.Static()
	if err != nil {
		t.Fatal(err)
	}
	builds = append(builds, build{sv + " static", sv, static, static})
	for _, bd := range builds {
		v, lib, ruby := bd.version, bd.lib, bd.ruby
		t.Run(bd.name, func(t *testing.T) {
			b := detectFile(t, lib)
			t.Logf("%v: eval loop %#x-%#x, TLS pair %#x offset %#x, symbols %#x", b.Version, b.EvalLoop[0], b.EvalLoop[1],
				b.TLSIndex, b.TLSOffset, b.GlobalSymbols)
			if got := b.Version.MajorMinor(); got != v {
				t.Errorf("version %v, want %s", b.Version, v)
			}
			if n := b.EvalLoop[1] - b.EvalLoop[0]; n < 8<<10 || n > 256<<10 {
				t.Errorf("eval loop of %d bytes", n)
			}
			// 3.1 exports vm_exec as rb_vm_exec: the one caller found.
			t.Logf("callers of the eval loop: %#x", b.Exec)
			if len(b.Exec) != 1 {
				t.Errorf("%d callers of the eval loop, want 1 (vm_exec)", len(b.Exec))
			} else if exec := dynamicSymbol(t, lib, "rb_vm_exec"); exec != 0 && b.Exec[0][0] != exec {
				t.Errorf("the eval loop's caller is at %#x, rb_vm_exec at %#x", b.Exec[0][0], exec)
			}

			pid, _ := libctest.StartSpinning(t, exec.Command(ruby, "-e", "STDOUT.puts 1; STDOUT.flush; x = 0; while true; x += 1; end"))
			fsBase := mainThreadFSBase(t, pid)
			bias := mappingBias(t, pid, lib)
			mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			word := func(addr uint64) uint64 {
				var buf [8]byte
				if _, err := mem.ReadAt(buf[:], int64(addr)); err != nil {
					t.Fatalf("reading %#x: %v", addr, err)
				}
				return binary.LittleEndian.Uint64(buf[:])
			}
			var module uint64
			block := fsBase // local-exec: the variable is at its offset from the thread pointer
			if b.TLSIndex != 0 {
				module = word(bias + b.TLSIndex)
				dtv := word(fsBase + 8) // tcbhead_t.dtv
				block = word(dtv + 16*module)
			}
			ec := word(block + b.TLSOffset)
			stack, size, cfp := word(ec), word(ec+8), word(ec+16)
			t.Logf("module %d, ec %#x: vm_stack %#x, %d words, cfp %#x", module, ec, stack, size, cfp)
			if (module == 0) != (b.TLSIndex == 0) || size == 0 || size > 1<<24 || cfp < stack || cfp >= stack+8*size {
				t.Fatalf("no execution context: module %d, vm_stack %#x, %d words, cfp %#x", module, stack, size, cfp)
			}
			iseq := word(cfp + 16)
			encoded := word(word(iseq+16) + 8) // iseq->body->iseq_encoded
			if insn := word(encoded) - bias; insn < b.EvalLoop[0] || insn >= b.EvalLoop[1] {
				t.Errorf("the running frame's first instruction is at %#x, outside the eval loop", insn)
			}
			if lastID := uint32(word(bias + b.GlobalSymbols)); lastID < 1000 || lastID > 1<<24 {
				t.Errorf("the symbol table's last_id is %d", lastID)
			}
		})
	}
}

// mainThreadFSBase stops pid with ptrace long enough to read its fs base.
func mainThreadFSBase(t testing.TB, pid int) uint64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(pid); err != nil {
		t.Fatalf("PTRACE_SEIZE: %v", err)
	}
	defer unix.PtraceDetach(pid)
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

// mappingBias is where path is loaded in pid: the start of its mapping at
// file offset 0 (libruby's first segment has virtual address 0).
func mappingBias(t testing.TB, pid int, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && f[5] == path && f[2] == "00000000" {
			lo, _, _ := strings.Cut(f[0], "-")
			v, err := strconv.ParseUint(lo, 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("%s is not mapped in %d", path, pid)
	return 0
}

// dynamicSymbol is the value of an exported symbol of the file at path, 0
// if it exports none of that name.
func dynamicSymbol(t testing.TB, path, name string) uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name && s.Section != elf.SHN_UNDEF {
			return s.Value
		}
	}
	return 0
}

// TestDetectARM64 reads Debian's arm64 libruby builds (fetched, not run
// here): the instruction loop and its caller, the TLS descriptor of
// ruby_current_ec with the variable's offset 8 in libruby's block, and the
// symbol table, where internals.md §12.3-12.5 found them by hand (its
// tables name the builds by Debian version).
func TestDetectARM64(t *testing.T) {
	type want struct {
		loopStart, exec, desc, globals uint64
	}
	known := map[string]want{
		"3.1.7+really3.1.2-0+deb12u1": {0x23f9e0, 0x244220, 0x37f3e8, 0x380180},
		"3.1.2-7+deb12u1":             {0x23b6c0, 0x23ff00, 0x37f3e8, 0x380180},
		"3.3.8-2":                     {0x26f9c8, 0x274c50, 0x44f2d8, 0x450148},
		"3.3.8-2.2":                   {0x2726ac, 0x2779c8, 0x45f2d8, 0x460148},
		"3.4.11-1~exp1":               {0x299bd0, 0x29fb20, 0x4cf2f0, 0x4d0150},
	}
	for _, v := range rubyfetch.Versions {
		lib, err := rubyfetch.LibrubyFor(v, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		deb, err := rubyfetch.DebianVersion(v, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		b := detectFile(t, lib)
		t.Logf("%s (%s): loop %#x, exec %#x, TLS descriptor %#x offset %d, symbols %#x", v, deb, b.EvalLoop, b.Exec,
			b.TLSIndex, b.TLSOffset, b.GlobalSymbols)
		if b.Version.String()[:3] != v || len(b.Exec) != 1 || b.TLSOffset != 8 {
			t.Errorf("%s: version %v, %d callers of the loop, TLS offset %d; want %s.x, 1, 8", lib, b.Version, len(b.Exec), b.TLSOffset, v)
		}
		w, ok := known[deb]
		if !ok {
			t.Logf("%s: Debian %s has no addresses checked by hand", lib, deb)
			continue
		}
		if b.EvalLoop[0] != w.loopStart || b.Exec[0][0] != w.exec || b.TLSIndex != w.desc || b.GlobalSymbols != w.globals {
			t.Errorf("%s: loop %#x, exec %#x, descriptor %#x, symbols %#x; want %#x, %#x, %#x, %#x", lib, b.EvalLoop[0],
				b.Exec[0][0], b.TLSIndex, b.GlobalSymbols, w.loopStart, w.exec, w.desc, w.globals)
		}
	}
}

package processmanager

import (
	"bufio"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/python"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps/unwindmapstest"
	"github.com/hostprof/ebpf-profiler/support"
)

// testProgram has global functions (in .symtab and, with -rdynamic, in
// .dynsym) and a static one (in .symtab only).
const testProgram = `
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int leaf_fn(volatile int *x) { return *x * 3 + 1; }
__attribute__((noinline)) static int hidden_fn(volatile int *x) { return leaf_fn(x) + 5; }
__attribute__((noinline)) int middle_fn(volatile int *x) { return hidden_fn(x) + leaf_fn(x); }
__attribute__((noinline)) int outer_fn(volatile int *x) { return middle_fn(x) * 2; }

int main(void) {
	volatile int v = 1;
	puts("ready");
	fflush(stdout);
	for (;;) {
		v = outer_fn(&v) & 0xff;
		sleep(1);
	}
}
`

// buildTestProgram compiles testProgram and returns its path.
func buildTestProgram(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"gcc", "nm", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(src, []byte(testProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	out, err := exec.Command("gcc", "-O1", "-rdynamic", "-Wl,--build-id", "-o", bin, src).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// readelfBuildID returns the GNU build id readelf reports.
func readelfBuildID(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command("readelf", "-n", bin).Output()
	if err != nil {
		t.Skipf("readelf: %v", err)
	}
	m := regexp.MustCompile(`Build ID: ([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no build id in readelf -n output:\n%s", out)
	}
	return string(m[1])
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

func fileIDOf(t *testing.T, path string) libpf.FileID {
	t.Helper()
	id, err := libpf.FileIDFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// startProgram runs bin until the test ends and waits until it is running.
func startProgram(t testing.TB, bin string) int {
	t.Helper()
	cmd := exec.Command(bin)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("program said %q: %v", line, err)
	}
	return cmd.Process.Pid
}

// loadBase returns where the first mapping of path (from file offset 0)
// starts in the process, and the vDSO's start.
func loadBase(t testing.TB, pid int, path string) (base, vdso uint64) {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 6 {
			continue
		}
		start, _ := strconv.ParseUint(strings.Split(fields[0], "-")[0], 16, 64)
		p := strings.Join(fields[5:], " ")
		switch {
		case fields[5] == "[vdso]":
			vdso = start
		case base == 0 && fields[2] == "00000000" && (p == path || p == path+" (deleted)"):
			base = start
		}
	}
	if base == 0 {
		t.Fatalf("%s not mapped by %d", path, pid)
	}
	return base, vdso
}

func TestSymbolizeRealBinary(t *testing.T) {
	bin := buildTestProgram(t)
	syms := filetest.NMFunctions(t, bin)
	for _, name := range []string{"leaf_fn", "hidden_fn", "middle_fn", "outer_fn"} {
		if syms[name] == 0 {
			t.Fatalf("nm found no %s in %v", name, syms)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	pie := f.Type == elf.ET_DYN
	f.Close()
	buildID := readelfBuildID(t, bin)

	dir := t.TempDir()
	stripped := filepath.Join(dir, "prog-stripped")
	copyFile(t, bin, stripped)
	if out, err := exec.Command("strip", "--strip-all", stripped).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	deleted := filepath.Join(dir, "prog-deleted")
	copyFile(t, bin, deleted)

	tests := []struct {
		name string
		path string
		// hidden is the name expected for the static function: stripping
		// removes .symtab, and .dynsym only holds exported functions.
		hidden string
		delete bool
	}{
		{name: "symtab", path: bin, hidden: "hidden_fn"},
		{name: "stripped", path: stripped},
		{name: "deleted", path: deleted, hidden: "hidden_fn", delete: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantID := fileIDOf(t, tt.path)
			pid := startProgram(t, tt.path)
			if tt.delete {
				if err := os.Remove(tt.path); err != nil {
					t.Fatal(err)
				}
			}
			base, vdso := loadBase(t, pid, tt.path)
			if !pie {
				base = 0
			}
			m, err := New(Config{})
			if err != nil {
				t.Fatal(err)
			}
			frames := []struct {
				fn     string
				off    uint64
				ret    bool
				wantFn string
			}{
				{"leaf_fn", 1, false, "leaf_fn"},
				{"hidden_fn", 4, true, tt.hidden},
				{"middle_fn", 4, true, "middle_fn"},
				{"outer_fn", 4, true, "outer_fn"},
			}
			raw := &support.Trace{PID: uint32(pid)}
			for _, fr := range frames {
				raw.Frames = append(raw.Frames, support.Frame{
					Kind: libpf.FrameNative, Addr: base + syms[fr.fn] + fr.off, ReturnAddress: fr.ret,
				})
			}
			raw.Frames = append(raw.Frames, support.Frame{Kind: libpf.FrameNative, Addr: 0x10, ReturnAddress: true})
			vdsoFn, vdsoAddr, vdsoNames := vdsoFunction(t, pid, vdso)
			if vdsoFn != "" {
				raw.Frames = append(raw.Frames, support.Frame{Kind: libpf.FrameNative, Addr: vdsoAddr + 1})
			}

			tr, info, err := m.ConvertTrace(raw)
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Frames) != len(raw.Frames) {
				t.Fatalf("%d frames, want %d", len(tr.Frames), len(raw.Frames))
			}
			for i, fr := range frames {
				got := tr.Frames[i]
				wantAddr := syms[fr.fn] + fr.off
				if fr.ret {
					wantAddr--
				}
				if got.FunctionName != fr.wantFn && !(fr.wantFn == "" && got.FunctionName != fr.fn) {
					t.Errorf("frame %d: function %q, want %q", i, got.FunctionName, fr.wantFn)
				}
				if got.Kind != libpf.FrameNative || got.Address != wantAddr || got.Mapping == nil {
					t.Fatalf("frame %d = %+v, want address %#x", i, got, wantAddr)
				}
				if mp := got.Mapping; mp.FileID != wantID || mp.Path != tt.path || mp.GNUBuildID != buildID ||
					got.AbsAddress() != raw.Frames[i].Addr-boolToUint(fr.ret) {
					t.Errorf("frame %d mapping %+v; want id %s path %s build id %s", i, *mp, wantID, tt.path, buildID)
				}
				if got.Mapping != tr.Frames[0].Mapping {
					t.Errorf("frame %d does not share the mapping", i)
				}
			}
			t.Logf("hidden_fn -> %q; vdso %q", tr.Frames[1].FunctionName, vdsoFn)
			unmapped := tr.Frames[len(frames)]
			if unmapped.Mapping != nil || unmapped.Address != 0xf || unmapped.FunctionName != "" {
				t.Errorf("unmapped frame %+v", unmapped)
			}
			if vdsoFn != "" {
				f := tr.Frames[len(frames)+1]
				if f.Mapping == nil || f.Mapping.Path != "[vdso]" || f.Mapping.FileID.IsZero() || !vdsoNames[f.FunctionName] {
					t.Errorf("vdso frame %+v, want one of %v", f, vdsoNames)
				}
			}
			wantInfo := libpf.ProcessInfo{PID: libpf.PID(pid), ExecutablePath: tt.path, ExecutableName: filepath.Base(tt.path)}
			info.ContainerID = "" // depends on where the test runs
			if *info != wantInfo {
				t.Errorf("process info %+v, want %+v", *info, wantInfo)
			}
			if s := m.Stats(); s.UnmappedFrames != 1 || s.ProcessesTracked != 1 || s.FileErrors != 0 || s.ELFErrors != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func boolToUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// vdsoFunction finds a function in the process's vDSO with debug/elf and
// returns its name, its address in the process and all names at that
// address.
func vdsoFunction(t *testing.T, pid int, start uint64) (string, uint64, map[string]bool) {
	t.Helper()
	if start == 0 {
		return "", 0, nil
	}
	mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	f, err := elf.NewFile(io.NewSectionReader(mem, int64(start), 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	var loadVaddr uint64
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Off == 0 {
			loadVaddr = p.Vaddr
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var value uint64
	names := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 1 && (name == "" || s.Value == value) {
			name, value = s.Name, s.Value
			names[s.Name] = true
		}
	}
	return name, start + value - loadVaddr, names
}

// textMapping maps the executable segment of file at base.
func textMapping(t *testing.T, file string, base uint64) fakeMapping {
	f, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			start := base + p.Vaddr&^0xfff
			return fakeMapping{start: start, end: start + 0x1000, offset: p.Off &^ 0xfff, file: file}
		}
	}
	t.Fatalf("%s has no executable segment", file)
	return fakeMapping{}
}

// TestPythonProcess: a process that maps libpython is known to run
// CPython, with its version from the library, and its resource says so;
// the Python unwinder's map describes it until it exits. A native process
// costs nothing more.
func TestPythonProcess(t *testing.T) {
	libs, _ := filepath.Glob("/root/.pyenv/versions/3.12*/lib/libpython3.12.so.1.0")
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); len(libs) == 0 || err != nil {
		t.Skip("no pyenv CPython 3.12 and x86_64 glibc here")
	}
	fs := newFakeProcFS(t)
	const base = 0x7f0000000000
	lib := textMapping(t, libs[0], base)
	fs.setProcess(100, 1, "/usr/bin/python3.12", lib, textMapping(t, libc, base+0x10000000))
	fs.setProcess(101, 1, "/bin/true")
	maps := unwindmapstest.NewMaps()
	m := newUnwindingManager(t, fs, maps, nil, python.Runtime)
	start := lib.start
	_, info, err := m.ConvertTrace(&support.Trace{PID: 100, Frames: []support.Frame{{Addr: start + 0x10}}})
	if err != nil {
		t.Fatal(err)
	}
	if info.RuntimeName != "CPython" || !strings.HasPrefix(info.RuntimeVersion, "3.12.") {
		t.Errorf("runtime %q %q, want CPython 3.12.x", info.RuntimeName, info.RuntimeVersion)
	}
	_, native, err := m.ConvertTrace(&support.Trace{PID: 101, Frames: []support.Frame{{Addr: 0x401000}}})
	if err != nil {
		t.Fatal(err)
	}
	if native.RuntimeName != "" {
		t.Errorf("native process has runtime %q", native.RuntimeName)
	}
	if s := m.Stats(); s.RuntimeProcesses["cpython"] != 1 || s.InterpreterErrors != 0 || s.RuntimeAttached["cpython"] != 1 {
		t.Errorf("%d Python processes, %d errors, %d described to BPF; want 1, 0 and 1",
			s.RuntimeProcesses["cpython"], s.InterpreterErrors, s.RuntimeAttached["cpython"])
	}
	entry, ok := maps.Runtimes[support.RuntimeProcKey{PID: 100, Runtime: uint32(python.ID)}]
	if !ok || len(maps.Runtimes) != 1 {
		t.Fatalf("runtime configuration map %+v, want CPython of process 100 only", maps.Runtimes)
	}
	// _PyRuntime lies in the library's data, above where it is loaded.
	p := entry.(python.UnwinderProc)
	if p.FrameLayout != python.Frames312 || p.KeyAddr < base || p.KeyReadyAddr < base ||
		p.TSDMaxKey != 32 || p.TSDEntrySize != 16 {
		t.Errorf("Python unwinder entry %+v", p)
	}
	m.ProcessExited(100)
	if len(maps.Runtimes) != 0 {
		t.Errorf("runtime configuration map %+v after the exit", maps.Runtimes)
	}
}

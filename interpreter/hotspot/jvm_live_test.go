package hotspot

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/utils/jdkfetch"
)

// liveJVM is a running JVM of the workload in utils/workloads/java.
type liveJVM struct {
	pid int
	// libjvm is the path of its libjvm.so and bias its load bias.
	libjvm string
	bias   uint64
	mem    *os.File
}

// workloadClasses is where TestMain compiled JWorkload.java.
var workloadClasses string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jworkload")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workloadClasses = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// compileWorkload compiles JWorkload.java once per test binary, for JDK 8
// and later.
var compileOnce sync.Once

func compileWorkload(t testing.TB) string {
	t.Helper()
	var out []byte
	var err error
	compileOnce.Do(func() {
		_, here, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", "java", "JWorkload.java")
		javac := filepath.Join(filepath.Dir(jdkfetch.SystemJava), "javac")
		out, err = exec.Command(javac, "--release", "8", "-d", workloadClasses, src).CombinedOutput()
	})
	if err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(workloadClasses, "JWorkload.class")); err != nil {
		t.Fatalf("JWorkload was not compiled: %v", err)
	}
	return workloadClasses
}

// startJVM runs the workload in mode for seconds with java and waits until
// it is in its hot phase.
func startJVM(t testing.TB, java, mode string, seconds int, flags ...string) *liveJVM {
	t.Helper()
	if _, err := os.Stat(java); err != nil {
		t.Fatalf("%s: %v (make test-deps installs it)", java, err)
	}
	args := append(append([]string{}, flags...), "-cp", compileWorkload(t), "JWorkload", mode, strconv.Itoa(seconds))
	cmd := exec.Command(java, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "hot phase from ") {
		t.Fatalf("%s printed %q: %v", java, line, err)
	}
	j := &liveJVM{pid: cmd.Process.Pid}
	j.libjvm, j.bias = findLibjvm(t, j.pid)
	if j.mem, err = os.Open(fmt.Sprintf("/proc/%d/mem", j.pid)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.mem.Close() })
	return j
}

// findLibjvm finds libjvm.so in a process's mappings and its load bias.
func findLibjvm(t testing.TB, pid int) (string, uint64) {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 6 || !strings.HasSuffix(fields[5], "/libjvm.so") || fields[2] != "00000000" {
			continue
		}
		start, _ := strconv.ParseUint(strings.Split(fields[0], "-")[0], 16, 64)
		f, err := elf.Open(fields[5])
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD {
				return fields[5], start - (p.Vaddr &^ 0xfff)
			}
		}
	}
	t.Fatalf("process %d maps no libjvm.so", pid)
	return "", 0
}

// readLive reads the vmStructs tables of a live JVM.
func readLive(t testing.TB, j *liveJVM) *VMStructs {
	t.Helper()
	f, err := elf.Open(j.libjvm)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := findTableSymbols(f)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := readVMStructs(procmem.New(j.mem), syms, j.bias)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// testJDKs maps each tested JDK version to its java executable.
func testJDKs(t *testing.T) map[string]string {
	t.Helper()
	jdks := map[string]string{}
	for _, v := range jdkfetch.Versions() {
		java, err := jdkfetch.Java(v)
		if err != nil {
			t.Fatal(err)
		}
		jdks[v] = java
	}
	return jdks
}

// TestLayoutLive: every tested JDK's own tables describe what profiling
// it takes.
func TestLayoutLive(t *testing.T) {
	for v, java := range testJDKs(t) {
		t.Run(v, func(t *testing.T) {
			j := startJVM(t, java, "chain", 2)
			vs := readLive(t, j)
			version, err := readVersion(procmem.New(j.mem), vs)
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(version[0]); got != v {
				t.Errorf("version %v, want major %s", version, v)
			}
			l, err := NewLayout(vs, version)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("JDK %v: %d fields; blob code relative %v, kind %v, scopes in blob %v, HeapBlock %d, UNSIGNED5 bias %d",
				version, len(vs.Fields), l.Blob.CodeRelative, l.Blob.HasKind, l.NM.ScopesInBlob, l.HeapBlockSize, l.Unsigned5Bias)
		})
	}
}

func TestVMStructsLive(t *testing.T) {
	j := startJVM(t, jdkfetch.SystemJava, "chain", 3)
	vs := readLive(t, j)
	t.Logf("%d fields, %d types, %d int and %d long constants", len(vs.Fields), len(vs.Types), len(vs.IntConstants), len(vs.LongConstants))
	for _, name := range []string{"CodeCache::_heaps", "Method::_constMethod", "ConstMethod::_constants", "Symbol::_length", "Klass::_name", "CodeBlob::_frame_size"} {
		if _, ok := vs.Fields[name]; !ok {
			t.Errorf("no field %s", name)
		}
	}
	if vs.Types["Method"] == 0 || vs.Types["ConstantPool"] == 0 {
		t.Errorf("types Method %d, ConstantPool %d", vs.Types["Method"], vs.Types["ConstantPool"])
	}
}

// TestCodeCacheLive: the code heaps and the interpreter are found in every
// tested JDK, the interpreter inside a heap, and the unwinder's
// configuration is made from them.
func TestCodeCacheLive(t *testing.T) {
	for v, java := range testJDKs(t) {
		t.Run(v, func(t *testing.T) {
			j := startJVM(t, java, "chain", 2)
			vs := readLive(t, j)
			r := procmem.New(j.mem)
			version, err := readVersion(r, vs)
			if err != nil {
				t.Fatal(err)
			}
			l, err := NewLayout(vs, version)
			if err != nil {
				t.Fatal(err)
			}
			cc, err := readCodeCache(r, l)
			if err != nil {
				t.Fatal(err)
			}
			inHeap := false
			for _, h := range cc.Heaps {
				inHeap = inHeap || (cc.InterpLow >= h.Low && cc.InterpHigh <= h.High)
			}
			if !inHeap || cc.InterpHigh <= cc.InterpLow {
				t.Errorf("interpreter [%#x, %#x) in no heap of %+v", cc.InterpLow, cc.InterpHigh, cc.Heaps)
			}
			u, err := unwinderProc(l, cc, contStatics{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d heaps, segments of 2^%d bytes, interpreter %d KiB; %+v", len(cc.Heaps), cc.Heaps[0].Log2Segment,
				(cc.InterpHigh-cc.InterpLow)>>10, u)
		})
	}
}

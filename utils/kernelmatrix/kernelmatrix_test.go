package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// cpioEntry is one entry read back from a "newc" archive.
type cpioEntry struct {
	name string
	mode uint32
	rdev uint64
	data string
}

func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	for off := 0; ; {
		if len(b)-off < 110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("no header at offset %d", off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(v)
		}
		size, nameSize := int(field(6)), int(field(11))
		name := string(b[off+110 : off+110+nameSize-1])
		dataOff := off + 110 + nameSize
		dataOff += (4 - dataOff%4) % 4
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, cpioEntry{name, field(1), unix.Mkdev(field(9), field(10)), string(b[dataOff : dataOff+size])})
		off = dataOff + size
		off += (4 - off%4) % 4
	}
}

func TestWriteInitramfs(t *testing.T) {
	root := t.TempDir()
	for path, data := range map[string]string{"init": "#!binary", "a/b/c.so": "lib", "vmtest.args": "x\n"} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("b/c.so", filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initramfs.cpio.gz")
	if err := writeInitramfs(root, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range readCPIO(t, b) {
		got = append(got, e.name+" "+strconv.FormatUint(uint64(e.mode), 8)+" "+
			strconv.FormatUint(e.rdev, 16)+" "+e.data)
	}
	want := []string{
		"a 40755 0 ",
		"a/b 40755 0 ",
		"a/b/c.so 100755 0 lib",
		"a/link 120777 0 b/c.so",
		"init 100755 0 #!binary",
		"vmtest.args 100755 0 x\n",
		"dev 40755 0 ",
		"dev/console 20600 501 ",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("archive holds\n%q\nwant\n%q", got, want)
	}
}

// serialLog is a VM's console as the runner reads it, kernel noise
// included.
const serialLog = `[    0.000000] Linux version 5.10.0-32-cloud-arm64
kernel-matrix init: kernel=5.10.0-32-cloud-arm64 machine=aarch64 cpus=2 uptime=1.52s
=== RUN   TestProgramsLoad
    programs_test.go:49: kernel matrix: kernel=5.10.0-32-cloud-arm64 programs=7/8 largest=unwind_native=301234 perf_attach="ioctl" map_watch="kprobe on perf_event_mmap"
--- PASS: TestProgramsLoad (3.34s)
=== RUN   TestUnwindWithoutFramePointers
    --- PASS: TestUnwindWithoutFramePointers/Go,_stripped (6.60s)
    --- FAIL: TestUnwindWithoutFramePointers/cgo,_stripped (6.81s)
--- FAIL: TestUnwindWithoutFramePointers (13.4s)
kernel-matrix init: exit=1 test_wall=55.1s uptime=57.05s
`

func TestParseSerialLog(t *testing.T) {
	var r result
	r.parse([]byte(serialLog), []string{"TestProgramsLoad", "TestUnwindWithoutFramePointers/Go,_stripped",
		"TestUnwindWithoutFramePointers/cgo,_stripped", "TestFramePointerChain"})
	if r.kernel != "5.10.0-32-cloud-arm64" || r.exit != 1 || r.programs != "7/8" ||
		r.largest != "unwind_native=301234" || r.perfAttach != "ioctl" || r.mapWatch != "kprobe on perf_event_mmap" {
		t.Errorf("parsed %+v", r)
	}
	if strings.Join(r.passed, ",") != "TestProgramsLoad,TestUnwindWithoutFramePointers/Go,_stripped" ||
		strings.Join(r.missing, ",") != "TestUnwindWithoutFramePointers/cgo,_stripped,TestFramePointerChain" ||
		len(r.failed) != 2 {
		t.Errorf("passed %q, missing %q, failed %q", r.passed, r.missing, r.failed)
	}
	if r.ok() {
		t.Error("a kernel with a failed test is ok")
	}

	// All expected tests passed, but the binary never finished (the VM
	// timed out): not ok.
	r = result{}
	r.parse([]byte(strings.Split(serialLog, "=== RUN   TestUnwind")[0]), []string{"TestProgramsLoad"})
	if r.exit != -2 || r.ok() {
		t.Errorf("a VM that never finished: exit %d, ok %v", r.exit, r.ok())
	}
	r = result{}
	r.parse([]byte(strings.Replace(serialLog, "exit=1", "exit=0", 1)), []string{"TestProgramsLoad"})
	if r.ok() {
		t.Error("ok although a test failed")
	}
	// An initramfs the kernel could not unpack whole: its tests fail for
	// missing files, the error says why.
	r = result{}
	r.parse([]byte("[   45.747517] Initramfs unpacking failed: write error\n"+serialLog), []string{"TestProgramsLoad"})
	if r.err == nil || !strings.Contains(r.err.Error(), "qemu -m") {
		t.Errorf("an initramfs that did not unpack: error %v, want one naming the VM's memory", r.err)
	}
}

// A failed subtest's messages come where it ran, above the other subtests'
// output: the failure report shows them, not its neighbours'.
func TestFailedOutput(t *testing.T) {
	log := `=== RUN   TestUnwind
=== RUN   TestUnwind/vDSO
    deltas_test.go:225: accuracy: vDSO: 12.0% with the full stack
    deltas_test.go:230: 12.0% of 100 samples match, want >= 95%
=== RUN   TestUnwind/Go
    deltas_test.go:225: accuracy: Go: 99.0% with the full stack
=== NAME  TestUnwind
    harness_test.go:194: lifecycle: {}
--- FAIL: TestUnwind (3.00s)
    --- FAIL: TestUnwind/vDSO (1.00s)
    --- PASS: TestUnwind/Go (1.00s)
`
	var r result
	r.parse([]byte(log), nil)
	got := strings.Join(failedOutput(strings.Split(log, "\n"), r.failed), "\n")
	want := `    harness_test.go:194: lifecycle: {}
--- FAIL: TestUnwind (3.00s)
    deltas_test.go:225: accuracy: vDSO: 12.0% with the full stack
    deltas_test.go:230: 12.0% of 100 samples match, want >= 95%
    --- FAIL: TestUnwind/vDSO (1.00s)`
	if got != want {
		t.Errorf("failure report:\n%s\nwant\n%s", got, want)
	}
}

// TestSelections: each VM's selection picks its tests, and the union the
// prepare step runs picks all of them.
func TestSelections(t *testing.T) {
	one, full, amd := runFor("arm64", runtimeOneKernel), runFor("arm64", fullRuntimesKernel), runFor("amd64", fullRuntimesKernel)
	base := runFor("arm64", "6.1")
	all := union([]string{one, full, amd, base})
	for _, c := range []struct {
		run, name string
		want      bool
	}{
		{one, "TestProgramsLoad", true},
		{base, "TestProgramsLoad", true},
		{base, "TestUnwindWithoutFramePointers/C_stripped", true},
		{base, "TestGoLabels/builds/go1.26_cgo", true},
		{base, "TestThreadContext/library_initial_exec", true},
		{one, "TestThreadContext/executable", true},
		{base, "TestGoLabels/builds/go1.23", true},
		{base, "TestGoLabels/builds/go1.22", false},
		{base, "TestGoLabels/builds/go1.26_cgo_stripped", false},
		{base, "TestPerlStacks/perl_5.40", false},
		{base, "TestLuaJITStacks/2.1-20250117/chain_-joff", false},
		{one, "TestUnwindWithoutFramePointers/C_stripped", true},
		{one, "TestUnwindWithoutFramePointers/Rust", false},
		{one, "TestPerlStacks/perl_5.40", true},
		{one, "TestPerlStacks/perl_5.32", false},
		{one, "TestPerlStartedBeforeProfiler", true},
		{one, "TestPythonStacks/3.11", false},
		{full, "TestPerlStacks/perl_5.32", true},
		{amd, "TestPerlStacks/perl_5.40", false},
		{amd, "TestFramePointerChain", true},
		{all, "TestPerlStacks/perl_5.32", true},
		{all, "TestUnwindWithoutFramePointers/cgo", true},
		{all, "TestPythonStacks", false},
		{one, "TestNodeStacks/Node_22/chain,_--no-turbo-inlining", true},
		{one, "TestNodeStacks/Node_22/chain,_--jitless", false},
		{one, "TestNodeStacks/Node_22/chain", false},
		{one, "TestNodeStacks/Node_18/chain,_--jitless", false},
		{one, "TestNodeProcesses/started_before_the_daemon", false},
		{one, "TestNodeStacks/Node_22/chain,_Sparkplug_only", false},
		{full, "TestNodeProcesses/started_before_the_daemon", true},
		{one, "TestNodeProcesses/Node_18_and_24_at_once", false},
		{full, "TestNodeProcesses/own_pid_and_mount_namespace", true},
		{full, "TestJavaProcesses/own_pid_and_mount_namespace", true},
		{full, "TestJavaProcesses/started_before_the_daemon", false},
		{one, "TestJavaProcesses/own_pid_and_mount_namespace", false},
		{full, "TestNodeProcesses/Node_18_and_24_at_once", false},
		{full, "TestNodeStacks/Node_18/chain,_Sparkplug_only", true},
		{full, "TestNodeStacks/Node_24/shapes", false},
		{amd, "TestNodeStacks/Node_22/chain,_--jitless", false},
		{one, "TestJavaStacks/JDK_21/chain,_mid_interpreted", true},
		{one, "TestJavaStacks/JDK_21/4_threads", false},
		{one, "TestJavaStacks/JDK_25/chain,_mid_interpreted", false},
		{full, "TestJavaStacks/JDK_11/chain,_mid_interpreted", true},
		{full, "TestJavaStacks/JDK_11/4_threads", false},
		{full, "TestJavaStacks/JDK_25/4_threads", true},
		{full, "TestJavaStacks/JDK_25/chain,_pac-ret", true},
		{full, "TestJavaStacks/JDK_25/recursion_40", false},
		{full, "TestNodeStacks/Node_22/chain,_--jitless", true},
		{full, "TestNodeStacks/Node_20/chain,_--jitless", false},
		{full, "TestNodeStacks/Node_24/chain,_--no-turbofan", true},
		{full, "TestNodeProcesses/BPF_entries_freed_at_exit", false},
		{full, "TestPerlThreads/perl_5.36", false},
		{full, "TestPerlThreads/perl_5.40", true},
		{full, "TestRubyThreads/Ruby_3.4", true},
		{full, "TestRubyThreads/Ruby_3.1", false},
		{full, "TestRubyForkingServer", true},
		{full, "TestRubyStartedBeforeProfiler", true},
		{full, "TestRubyGC", false},
		{one, "TestRubyThreads/Ruby_3.4", false},
		{all, "TestUnwindWithoutFramePointers/Rust", false},
		{"^A$/^x|^B$", "B/y", true},
		{"^A$/^x|^B$", "A/y", false},
	} {
		if got := selects(c.run, c.name); got != c.want {
			t.Errorf("selects(%q, %q) = %v, want %v", c.run, c.name, got, c.want)
		}
	}
	if got := splitTop(`^(a|b/c)$/^[x/y]/z`, '/'); len(got) != 3 || got[0] != `^(a|b/c)$` || got[1] != `^[x/y]` {
		t.Errorf("splitTop: %q", got)
	}
}

// TestRunVMs: a VM that runs alone has no other beside it, the others run
// at most parallel at a time, the one with the most tests first, and the
// results keep the jobs' order.
func TestRunVMs(t *testing.T) {
	small := &vm{prepared: []string{"A"}}
	big := &vm{prepared: []string{"A", "B", "C"}}
	jobs := []vmJob{{vm: small, series: "s1", run: "A"}, {vm: big, series: "b", run: "A|B|C"},
		{vm: big, series: "full", run: "A", alone: true}, {vm: small, series: "s2", run: "A"}}
	var mu sync.Mutex
	var running, most int
	var started []string
	release := make(chan struct{})
	results := runVMs(jobs, 2, func(j vmJob) result {
		mu.Lock()
		running++
		most = max(most, running)
		started = append(started, j.series)
		n := len(started)
		if j.alone && running > 1 {
			t.Errorf("%s ran beside another VM", j.series)
		}
		if n == 3 {
			close(release) // the first two after full have both started
		}
		mu.Unlock()
		if n == 2 {
			<-release
		}
		mu.Lock()
		running--
		mu.Unlock()
		return result{series: j.series}
	})
	if started[0] != "full" || started[1] != "b" {
		t.Errorf("started %v, want full alone, then b (most tests)", started)
	}
	if most != 2 {
		t.Errorf("at most %d VMs at once, want 2", most)
	}
	for i, r := range results {
		if r.series != jobs[i].series {
			t.Errorf("result %d is %s's, want %s's", i, r.series, jobs[i].series)
		}
	}
}

package tracecorr

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
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// buildAgent builds utils/testagent for arch ("x86_64" or "aarch64") into
// dir and returns the library's path.
func buildAgent(t *testing.T, dir, arch string) string {
	t.Helper()
	cc := map[string]string{"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}[arch]
	out, err := exec.Command("make", "-s", "-C", "../utils/testagent", "OUT="+dir, "ARCH="+arch, "CC="+cc,
		dir+"/elastic-jvmti-linux-"+arch+".so").CombinedOutput()
	if err != nil {
		t.Fatalf("building the test agent for %s: %v\n%s", arch, err, out)
	}
	return filepath.Join(dir, "elastic-jvmti-linux-"+arch+".so")
}

func TestIsAgentLibrary(t *testing.T) {
	for path, want := range map[string]bool{
		"/opt/agent/elastic-jvmti-linux-x64.so":           true,
		"/tmp/elastic-jvmti-linux-arm64.so":               true,
		"/a/b/../elastic-jvmti-linux-x86_64-musl.so":      true,
		"/lib/libc.so.6":                                  false,
		"/tmp/elastic-jvmti-linux-x64.so.bak":             false,
		"elastic-jvmti-linux-x64.so":                      false,
		"/tmp/elastic-jvmti-linux-x64.so/../libevil.so":   false,
		"/tmp/not-elastic-jvmti-linux-x64.so.d/libfoo.so": false,
	} {
		if got := IsAgentLibrary(path); got != want {
			t.Errorf("IsAgentLibrary(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestReadLibrary reads the test agent built for both architectures and
// checks the descriptor against what readelf says of the relocation.
func TestReadLibrary(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"x86_64", "aarch64"} {
		path := buildAgent(t, dir, arch)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		lib, err := ReadLibrary(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		out, err := exec.Command("readelf", "-rW", "--dyn-syms", path).Output()
		if err != nil {
			t.Fatal(err)
		}
		var desc, storage uint64
		for l := range strings.Lines(string(out)) {
			fields := strings.Fields(l)
			switch {
			case len(fields) >= 5 && strings.HasSuffix(fields[2], "_TLSDESC") && fields[4] == TLSSymbol:
				desc, _ = strconv.ParseUint(fields[0], 16, 64)
			case len(fields) == 8 && fields[7] == ProcessStorageSymbol:
				storage, _ = strconv.ParseUint(fields[1], 16, 64)
			}
		}
		if desc == 0 || lib.TLSDescriptor != desc || lib.ProcessStorage != storage {
			t.Errorf("%s: %+v, readelf says descriptor %#x, storage %#x", arch, lib, desc, storage)
		}
	}
	f, err := elf.Open("/lib/x86_64-linux-gnu/libc.so.6")
	if err == nil {
		defer f.Close()
		if _, err := ReadLibrary(f); err == nil {
			t.Errorf("libc taken for an agent library")
		}
	}
}

// TestLiveAgent runs the test application and reads, from its memory, the
// process storage and, through the resolved TLS descriptor and a worker
// thread's fs base (ptrace), that thread's correlation record.
func TestLiveAgent(t *testing.T) {
	if runtime.GOARCH != "amd64" || os.Geteuid() != 0 {
		t.Skip("needs root (ptrace of another process) on amd64; CI runs it so")
	}
	dir := t.TempDir()
	lib := buildAgent(t, dir, "x86_64")
	out, err := exec.Command("make", "-s", "-C", "../utils/testagent", "OUT="+dir, dir+"/app").CombinedOutput()
	if err != nil {
		t.Fatalf("building the test application: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.Command(filepath.Join(dir, "app"), lib, sock, "3")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// Once the storage is published and a worker's first round printed,
	// that worker has its record.
	var tid int
	published := false
	for r := bufio.NewReader(stdout); tid == 0 || !published; {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		published = published || strings.HasPrefix(line, "published ")
		if tid == 0 {
			fmt.Sscanf(line, "idle %d", &tid)
		}
	}
	pid := cmd.Process.Pid

	bias := mappedBias(t, pid, lib)
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ReadLibrary(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	st, err := ReadProcessStorage(mem, l.ProcessStorage+bias)
	if err != nil {
		t.Fatal(err)
	}
	if st.Addr == 0 || *st != (ProcessStorage{Addr: st.Addr, MinorVersion: 1, ServiceName: "testagent-svc",
		Environment: "test-env", SocketPath: sock}) {
		t.Errorf("process storage %+v", *st)
	}
	off, err := TLSOffset(mem, l.TLSDescriptor+bias)
	if err != nil {
		t.Fatal(err)
	}
	fsBase := threadFSBase(t, tid)
	var ptr [8]byte
	if _, err := mem.ReadAt(ptr[:], int64(fsBase+uint64(off))); err != nil {
		t.Fatal(err)
	}
	record := make([]byte, 36)
	if _, err := mem.ReadAt(record, int64(le64(ptr[:]))); err != nil {
		t.Fatalf("thread %d's record at %#x: %v", tid, le64(ptr[:]), err)
	}
	if record[0] != 1 || record[1] != 0 || (record[2] != 1 && record[2] != 0) {
		t.Errorf("thread %d's record %x: want layout 1 and a valid byte", tid, record)
	}
	t.Logf("TLS offset %d; thread %d fs base %#x; record %x", off, tid, fsBase, record)
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// mappedBias is the load bias of file in process pid: the start of its
// mapping at file offset 0 (the test agent's first segment is at vaddr 0).
func mappedBias(t *testing.T, pid int, file string) uint64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(maps)) {
			fields := strings.Fields(l)
			if len(fields) == 6 && fields[5] == file && fields[2] == "00000000" {
				start, _ := strconv.ParseUint(strings.Split(fields[0], "-")[0], 16, 64)
				return start
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s is not mapped in process %d", file, pid)
	return 0
}

// threadFSBase stops thread tid with ptrace and reads its fs base.
func threadFSBase(t *testing.T, tid int) uint64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		t.Fatalf("ptrace seize %d: %v", tid, err)
	}
	defer unix.PtraceDetach(tid)
	if err := unix.PtraceInterrupt(tid); err != nil {
		t.Fatal(err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		t.Fatal(err)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		t.Fatal(err)
	}
	return regs.Fs_base
}

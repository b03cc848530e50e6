package goheap

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// symbols returns the values of the named symbols of an executable (not
// position-independent: they are its addresses).
func symbols(t *testing.T, path string, names ...string) map[string]elf.Symbol {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC {
		t.Fatalf("%s is position-independent", path)
	}
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]elf.Symbol{}
	for _, s := range syms {
		out[s.Name] = s
	}
	for _, n := range names {
		if out[n].Value == 0 {
			t.Fatalf("no symbol %s", n)
		}
	}
	return out
}

func goMinor(t *testing.T) int {
	v := strings.TrimPrefix(runtime.Version(), "go1.")
	minor, err := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if err != nil {
		t.Skipf("toolchain %s: not a release", runtime.Version())
	}
	return minor
}

// TestReadBuckets reads a running Go program's memory-profile buckets from
// its memory (testdata/heapprog, built by the machine's toolchain) and
// checks the bucket of its 200 retained 64 KiB allocations against what
// its own runtime.MemProfile said.
func TestReadBuckets(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "heapprog")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/heapprog").CombinedOutput(); err != nil {
		t.Fatalf("building heapprog: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("heapprog: %v", err)
	}
	var wantObjects, wantInUse, wantAlloc uint64
	if _, err := fmt.Sscanf(line, "want %d %d %d", &wantObjects, &wantInUse, &wantAlloc); err != nil {
		t.Fatalf("heapprog printed %q", line)
	}

	syms := symbols(t, bin, "runtime.mbuckets", "runtime.mProfCycle", "main.retainLeaf")
	l, err := LayoutFor(goMinor(t))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	r := procmem.New(mem)
	cyc, err := r.U32(syms["runtime.mProfCycle"].Value)
	if err != nil {
		t.Fatal(err)
	}
	buckets, skipped, err := Read(r, l, syms["runtime.mbuckets"].Value, cyc>>1, cyc&1 != 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := syms["main.retainLeaf"]
	var ours *Bucket
	for i, b := range buckets {
		for _, pc := range b.Stack {
			if pc-1 >= leaf.Value && pc-1 < leaf.Value+leaf.Size && b.Size >= 64<<10 {
				ours = &buckets[i]
			}
		}
	}
	t.Logf("%d buckets read, %d skipped as torn", len(buckets), skipped)
	if ours == nil {
		t.Fatal("no bucket under main.retainLeaf")
	}
	objects, bytes := ours.InUse()
	t.Logf("main.retainLeaf's bucket: %d objects, %d bytes in use, %d allocated; runtime.MemProfile: %d, %d, %d",
		objects, bytes, ours.AllocBytes, wantObjects, wantInUse, wantAlloc)
	if objects != wantObjects || bytes != wantInUse || ours.AllocBytes != wantAlloc || objects != 200 {
		t.Error("want the same counts, and the 200 objects retained")
	}
}

var le = binary.LittleEndian

// fakeMem is memory at base, for hostile bucket lists.
type fakeMem struct {
	base uint64
	b    []byte
}

func (m *fakeMem) ReadAt(p []byte, off int64) (int, error) {
	i := uint64(off) - m.base
	if uint64(off) < m.base || i >= uint64(len(m.b)) {
		return 0, fmt.Errorf("unmapped %#x", off)
	}
	n := copy(p, m.b[i:])
	if n < len(p) {
		return n, fmt.Errorf("unmapped %#x", uint64(off)+uint64(n))
	}
	return n, nil
}

func (m *fakeMem) put(addr uint64, words ...uint64) {
	for i, w := range words {
		le.PutUint64(m.b[addr-m.base+8*uint64(i):], w)
	}
}

// TestHostileLists: a list that cycles, a bucket claiming a huge stack, a
// bucket that is not a memory bucket and a list leading out of memory are
// errors, not hangs or huge allocations; torn counts are skipped.
func TestHostileLists(t *testing.T) {
	const base, head = 0x10000, 0x10000
	l, _ := LayoutFor(26)
	bucket := func(m *fakeMem, at, next, typ, nstk uint64, counts ...uint64) {
		m.put(at, 0, next, typ, 0, 16, nstk)
		for i := range nstk {
			m.put(at+headerSize+8*i, 0x401000+i)
		}
		m.put(at+headerSize+8*nstk, counts...)
	}
	for name, build := range map[string]func(m *fakeMem){
		"cycle": func(m *fakeMem) {
			m.put(head, 0x10100)
			bucket(m, 0x10100, 0x10400, 1, 2)
			bucket(m, 0x10400, 0x10100, 1, 2)
		},
		"huge stack": func(m *fakeMem) {
			m.put(head, 0x10100)
			bucket(m, 0x10100, 0, 1, 0)
			m.put(0x10100+40, 1<<40)
		},
		"not memory":    func(m *fakeMem) { m.put(head, 0x10100); bucket(m, 0x10100, 0, 2, 2) },
		"out of memory": func(m *fakeMem) { m.put(head, 0x10100); bucket(m, 0x10100, 0x7fff0000, 1, 2) },
	} {
		m := &fakeMem{base: base, b: make([]byte, 64<<10)}
		build(m)
		if _, _, err := Read(procmem.New(m), l, head, 0, true); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// Torn: bytes that are not counts times the size (16).
	m := &fakeMem{base: base, b: make([]byte, 64<<10)}
	m.put(head, 0x10100)
	bucket(m, 0x10100, 0x10400, 1, 2, 3, 1, 48, 16)
	bucket(m, 0x10400, 0, 1, 2, 3, 1, 47, 16)
	got, skipped, err := Read(procmem.New(m), l, head, 0, true)
	if err != nil || len(got) != 1 || skipped != 1 {
		t.Errorf("torn counts: %d buckets, %d skipped, %v; want 1 and 1", len(got), skipped, err)
	}
}

package goheap

import (
	"bufio"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
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

func toolchainMinor(t *testing.T) int {
	minor, err := goMinor(runtime.Version())
	if err != nil {
		t.Skipf("toolchain %s: not a release", runtime.Version())
	}
	return minor
}

// buildHeapprog builds testdata/heapprog with the machine's toolchain for
// goarch, with extra go build flags.
func buildHeapprog(t testing.TB, goarch string, flags ...string) string {
	return buildHeapprogWith(t, gofetch.System, goarch, flags...)
}

// buildHeapprogWith builds testdata/heapprog with a Go release of
// utils/gofetch.
func buildHeapprogWith(t testing.TB, version, goarch string, flags ...string) string {
	t.Helper()
	goCmd, env, err := gofetch.Command(version)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "heapprog")
	args := append(append([]string{"build", "-o", bin}, flags...), ".")
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = "testdata/heapprog"
	cmd.Env = append(append(os.Environ(), env...), "GOARCH="+goarch, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building heapprog: %v\n%s", err, out)
	}
	return bin
}

// TestLocate finds the globals from the runtime's code, x86_64 and arm64,
// where the symbol table has them, and in a stripped build, where the rate
// it finds holds the runtime's default (512 KiB).
func TestLocate(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		full, stripped := buildHeapprog(t, goarch), buildHeapprog(t, goarch, "-ldflags=-s -w")
		syms := symbols(t, full, "runtime.mbuckets", "runtime.mProfCycle", "runtime.MemProfileRate")
		want := Program{Minor: toolchainMinor(t), Buckets: syms["runtime.mbuckets"].Value,
			Cycle: syms["runtime.mProfCycle"].Value, Rate: syms["runtime.MemProfileRate"].Value}
		f, err := elf.Open(full)
		if err != nil {
			t.Fatal(err)
		}
		got := Program{Minor: want.Minor}
		err = locateInCode(f, &got)
		f.Close()
		if err != nil || got != want {
			t.Errorf("%s, from the code: %+v, %v; want %+v", goarch, got, err, want)
		}
		sf, err := os.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Locate(sf)
		sf.Close()
		if err != nil {
			t.Fatalf("%s, stripped: %v", goarch, err)
		}
		ef, _ := elf.Open(stripped)
		rate, err := interpreter.ReadELF(ef, p.Rate, 8)
		ef.Close()
		if err != nil || len(rate) != 8 || le.Uint64(rate) != 512<<10 {
			t.Errorf("%s, stripped: the rate at %#x reads %x, %v; want 512 KiB", goarch, p.Rate, rate, err)
		}
	}
}

// startHeapprog runs bin with args until it is ready, and returns its pid
// and what it printed before; it ends with the test.
func startHeapprog(t testing.TB, bin string, args ...string) (int, []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	var lines []string
	r := bufio.NewReader(stdout)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("heapprog: %v (printed %q)", err, lines)
		}
		if line == "ready\n" {
			return cmd.Process.Pid, lines
		}
		lines = append(lines, line)
	}
}

// TestReadBuckets reads a running Go program's memory-profile buckets from
// its memory (testdata/heapprog, built by the machine's toolchain) and
// checks the bucket of its 200 retained 64 KiB allocations against what
// its own runtime.MemProfile said.
func TestReadBuckets(t *testing.T) {
	bin := buildHeapprog(t, runtime.GOARCH)
	pid, lines := startHeapprog(t, bin, "all")
	var wantObjects, wantInUse, wantAlloc uint64
	if _, err := fmt.Sscanf(lines[0], "want %d %d %d", &wantObjects, &wantInUse, &wantAlloc); err != nil {
		t.Fatalf("heapprog printed %q", lines)
	}

	syms := symbols(t, bin, "runtime.mbuckets", "runtime.mProfCycle", "main.retainLeaf")
	l, err := LayoutFor(toolchainMinor(t))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
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

// topByLeaf returns the n largest of values (by function), leaving out
// zeros (whose order is arbitrary).
func topByLeaf(values map[string]int64, n int) map[string]int64 {
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(values[b], values[a]) })
	out := map[string]int64{}
	for _, k := range names[:min(n, len(names))] {
		if values[k] > 0 {
			out[k] = values[k]
		}
	}
	return out
}

// TestAgainstOwnProfile: what Reader makes of a program's buckets, read
// from outside at the default sampling rate, and the heap profile the
// program writes itself (runtime/pprof) agree: the same top 3 functions by
// in-use and by allocated bytes, each within 10% (they are equal when
// nothing allocates between the two). Built plain, stripped, and
// position-independent by the machine's Go, and by every other release
// from 1.19 on (each bucket layout of LAYOUT.md).
func TestAgainstOwnProfile(t *testing.T) {
	r := NewReader()
	defer r.Close()
	builds := map[string][]string{"plain": nil, "stripped": {"-ldflags=-s -w"}, "pie": {"-buildmode=pie"}}
	for _, v := range gofetch.Versions {
		if v != gofetch.System {
			builds["go"+v] = nil
			builds["go"+v+"-stripped"] = []string{"-ldflags=-s -w"}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(builds)) {
		flags := builds[name]
		t.Run(name, func(t *testing.T) {
			version, _, _ := strings.Cut(strings.TrimPrefix(name, "go"), "-")
			if !strings.HasPrefix(name, "go") {
				version = gofetch.System
			}
			bin := buildHeapprogWith(t, version, runtime.GOARCH, flags...)
			own := filepath.Join(t.TempDir(), "heap.pb.gz")
			pid, _ := startHeapprog(t, bin, "sampled", own)
			prof, err := r.Read(pid)
			if err != nil {
				t.Fatal(err)
			}
			ours := map[string]map[string]int64{"inuse_space": {}, "alloc_space": {}}
			for _, s := range prof.Samples {
				if len(s.Stack) > 0 {
					ours["inuse_space"][prof.Resolve(s.Stack[0]).Function] += s.InUseBytes
					ours["alloc_space"][prof.Resolve(s.Stack[0]).Function] += s.AllocBytes
				}
			}
			pf, err := os.Open(own)
			if err != nil {
				t.Fatal(err)
			}
			defer pf.Close()
			p, err := profile.Parse(pf)
			if err != nil {
				t.Fatal(err)
			}
			theirs := map[string]map[string]int64{"inuse_space": {}, "alloc_space": {}}
			for i, st := range p.SampleType {
				if theirs[st.Type] == nil {
					continue
				}
				for _, s := range p.Sample {
					if len(s.Location) > 0 && len(s.Location[0].Line) > 0 {
						theirs[st.Type][s.Location[0].Line[0].Function.Name] += s.Value[i]
					}
				}
			}
			t.Logf("MemProfileRate %d, %d samples, %d skipped", prof.Rate, len(prof.Samples), prof.Skipped)
			for _, kind := range []string{"inuse_space", "alloc_space"} {
				o, w := topByLeaf(ours[kind], 3), topByLeaf(theirs[kind], 3)
				t.Logf("%s: ours %v; the program's own %v", kind, o, w)
				for name, v := range w {
					got, ok := o[name]
					if !ok || math.Abs(float64(got-v)) > 0.1*float64(v) {
						t.Errorf("%s of %s: %d, the program's own profile says %d", kind, name, got, v)
					}
				}
			}
		})
	}
}

// TestProfilingOff: a Go program that cannot read its memory profile has
// none (the linker turned it off), which Read says.
func TestProfilingOff(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	os.WriteFile(src, []byte("package main\n\nimport \"os\"\n\nfunc main() { os.Stdin.Read(make([]byte, 1)) }\n"), 0o644)
	bin := filepath.Join(dir, "noprof")
	if out, err := exec.Command("go", "build", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	r := NewReader()
	defer r.Close()
	for range 50 {
		if _, err := r.Read(cmd.Process.Pid); errors.Is(err, ErrProfilingOff) {
			return
		} else if err != nil {
			t.Logf("%v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Error("a program without pprof read as having a profile")
}

// BenchmarkReadProcess reads a process with thousands of buckets (one per
// size class and recursion depth, every allocation sampled): the cost of
// one read, per process and per bucket.
func BenchmarkReadProcess(b *testing.B) {
	pid, _ := startHeapprog(b, buildHeapprog(b, runtime.GOARCH), "many")
	r := NewReader()
	defer r.Close()
	prof, err := r.Read(pid)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := r.Read(pid); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(prof.Samples)), "buckets")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(prof.Samples)), "ns/bucket")
}

// TestLayoutForReleases: the record layout of each release, from its
// runtime/mprof.go (memRecordCycle): allocs, frees, alloc_bytes and
// free_bytes, uintptrs, in go1.19.8, go1.21.13-go1.25.12 and go1.26.8;
// allocs and frees only in go1.27.3 (LAYOUT.md, section 2). Go 1.18's and
// 1.20's trees were not read: 1.18's from golang/go#45894 and a copy of
// its mprof.go, 1.20's the same as the releases on both sides of it.
// TestAgainstOwnProfile reads the builds of every release here but 1.18
// and 1.20.
func TestLayoutForReleases(t *testing.T) {
	for minor := 17; minor <= 28; minor++ {
		l, err := LayoutFor(minor)
		want := 32
		switch {
		case minor < 18:
			if err == nil {
				t.Errorf("Go 1.%d: no error", minor)
			}
			continue
		case minor >= 27:
			want = 16
		}
		if err != nil || l.CycleBytes != want {
			t.Errorf("Go 1.%d: %+v, %v; want %d-byte cycles", minor, l, err, want)
		}
	}
}

package tracer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

func TestMapScaleFactorRange(t *testing.T) {
	_, err := New(Config{SamplesPerSecond: 20, MapScaleFactor: MaxMapScaleFactor + 1})
	if err == nil || !strings.Contains(err.Error(), "map scale factor must be 0 to 8, got 9") {
		t.Errorf("error %v, want one naming the range 0 to 8", err)
	}
}

func TestScaleMaps(t *testing.T) {
	tests := []struct {
		factor uint
		// slots holds two deltas each.
		slots, pages, mappings, rules uint32
	}{
		{0, 1 << 21, 1 << 16, 1 << 16, 1 << 14},
		{1, 1 << 22, 1 << 17, 1 << 17, 1 << 15},
		{2, 1 << 23, 1 << 18, 1 << 18, 1 << 16},
		// stack_delta.rule is a u16: the rule table stops at 1<<16.
		{3, 1 << 24, 1 << 19, 1 << 19, 1 << 16},
		{MaxMapScaleFactor, 1 << 29, 1 << 24, 1 << 24, 1 << 16},
	}
	for _, tt := range tests {
		spec, err := support.LoadSpec()
		if err != nil {
			t.Fatal(err)
		}
		if err := scaleMaps(spec, tt.factor); err != nil {
			t.Fatal(err)
		}
		got := [4]uint32{spec.Maps["stack_deltas"].MaxEntries, spec.Maps["delta_pages"].MaxEntries,
			spec.Maps["pid_mappings"].MaxEntries, spec.Maps["unwind_rules"].MaxEntries}
		if want := [4]uint32{tt.slots, tt.pages, tt.mappings, tt.rules}; got != want {
			t.Errorf("factor %d: delta slots, pages, mappings, rules = %v, want %v", tt.factor, got, want)
		}
		if n := spec.Maps["unknown_pc_reports"].MaxEntries; n != 4096 {
			t.Errorf("factor %d: unknown_pc_reports scaled to %d", tt.factor, n)
		}
	}
}

func newTestTracer(t *testing.T, factor uint) *Tracer {
	t.Helper()
	tr, err := New(Config{SamplesPerSecond: 20, MapScaleFactor: factor})
	if err != nil {
		t.Fatalf("loading with map scale factor %d: %v", factor, err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestMapScaleFactorLoads(t *testing.T) {
	testenv.RequireBPF(t)
	base, scaled := newTestTracer(t, 0), newTestTracer(t, 2)
	bc, sc := base.DeltaCapacity(), scaled.DeltaCapacity()
	if sc.Deltas != 4*bc.Deltas || sc.Rules != 4*bc.Rules {
		t.Errorf("capacity at factor 2 is %+v, at 0 %+v: want 4 times", sc, bc)
	}
	for _, name := range []string{"stack_deltas", "delta_pages", "pid_mappings", "unwind_rules"} {
		b, s := base.coll.Maps[name].MaxEntries(), scaled.coll.Maps[name].MaxEntries()
		if s != 4*b {
			t.Errorf("%s has %d entries at factor 2, %d at 0: want 4 times", name, s, b)
		}
	}
	// The scaled maps are the ones the programs use: the last slot of the
	// larger pool is writable. Three deltas fill one slot and half of the
	// next, whose second half is padding.
	deltas := []support.StackDelta{{AddrLow: 1, Rule: 1}, {AddrLow: 2, Rule: 2}, {AddrLow: 3, Rule: 3}}
	if err := scaled.SetStackDeltas(sc.Deltas-4, deltas); err != nil {
		t.Fatalf("writing the last stack deltas at factor 2: %v", err)
	}
	var last support.DeltaSlot
	if err := scaled.objs.StackDeltas.Lookup(sc.Deltas/2-1, &last); err != nil {
		t.Fatal(err)
	}
	if last != (support.DeltaSlot{deltas[2], {}}) {
		t.Errorf("last slot %v, want %v and padding", last, deltas[2])
	}
	if err := scaled.SetStackDeltas(1, deltas); err == nil {
		t.Error("deltas written from the middle of a slot")
	}
	if err := scaled.SetStackDeltas(sc.Deltas-2, deltas); err == nil {
		t.Error("deltas written past the end of the pool")
	}
	// Where the pool is not mapped into memory, deltas are map updates.
	if !scaled.deltasMappable {
		t.Fatal("the stack delta pool cannot be mapped into memory")
	}
	scaled.deltasMappable = false
	err := scaled.SetStackDeltas(0, deltas[:2])
	scaled.deltasMappable = true
	var first support.DeltaSlot
	if err != nil || scaled.objs.StackDeltas.Lookup(uint32(0), &first) != nil ||
		first != (support.DeltaSlot{deltas[0], deltas[1]}) {
		t.Errorf("deltas written as map updates: %v, first slot %v", err, first)
	}
}

// TestMaxMapScaleFactor loads the largest factor: it needs about 4.3 GiB of
// kernel memory. Where the host or cgroup has less, the error must say
// which map did not fit and how big it was.
func TestMaxMapScaleFactor(t *testing.T) {
	testenv.RequireBPF(t)
	tr, err := New(Config{SamplesPerSecond: 20, MapScaleFactor: MaxMapScaleFactor})
	if err != nil {
		if !strings.Contains(err.Error(), "creating BPF map ") || !strings.Contains(err.Error(), " entries") {
			t.Fatalf("error %v does not name the map and its size", err)
		}
		t.Logf("factor %d does not fit here: %v", MaxMapScaleFactor, err)
		return
	}
	defer tr.Close()
	if c := tr.DeltaCapacity(); c.Deltas != 1<<30 || c.Rules != 1<<16 {
		t.Errorf("capacity at factor %d: %+v", MaxMapScaleFactor, c)
	}
	logMapMemory(t, tr, MaxMapScaleFactor)
}

// TestMapCreateError makes the kernel refuse a map: more memory than the
// machine has fails at once, without allocating any.
func TestMapCreateError(t *testing.T) {
	testenv.RequireBPF(t)
	spec, err := support.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := scaleMaps(spec, MaxMapScaleFactor); err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps["stack_deltas"]
	ms.Key, ms.Value, ms.ValueSize = nil, nil, 1<<12 // 1<<29 of them: 2 TiB
	maps, err := createScaledMaps(spec, MaxMapScaleFactor)
	if err == nil {
		closeMaps(maps)
		t.Fatal("a 1 TiB map was created")
	}
	want := "creating BPF map stack_deltas of 536870912 entries (2097152 MiB) (map scale factor 8)"
	if !strings.Contains(err.Error(), want) || !errors.Is(err, unix.ENOMEM) ||
		!strings.Contains(err.Error(), "lower the map scale factor") {
		t.Errorf("error %v, want ENOMEM containing %q and advice", err, want)
	}
}

// TestMapMemory measures what the scaled maps cost in kernel memory, as
// the kernel accounts it (memlock in fdinfo). Run it with -v to read the
// figures:
//
//	sudo EBPF_PROFILER_TEST_INTEGRATION=1 go test -count=1 -v -run 'TestMapMemory|TestMaxMapScaleFactor' ./tracer
func TestMapMemory(t *testing.T) {
	testenv.RequireBPF(t)
	for _, factor := range []uint{0, 1, 2, 4} {
		tr, err := New(Config{SamplesPerSecond: 20, MapScaleFactor: factor})
		if err != nil {
			t.Fatalf("loading with map scale factor %d: %v", factor, err)
		}
		logMapMemory(t, tr, factor)
		tr.Close()
	}

	// What filling the maps adds: the array is allocated whole, the hash
	// and the trie grow by entry.
	tr := newTestTracer(t, 0)
	deltas := tr.objs.StackDeltas
	perDelta := float64(mapMemlock(t, deltas)) / float64(tr.DeltaCapacity().Deltas)
	const n = 1 << 15
	perPage := growth(t, tr.objs.DeltaPages, n, func(i uint64) error {
		return tr.SetDeltaPage(support.DeltaPageKey{FileID: 1, Page: i}, support.DeltaPage{})
	})
	perPrefix := growth(t, tr.objs.PidMappings, n, func(i uint64) error {
		return tr.SetPidMapping(support.NewPidMappingKey(1, i<<12, 52), support.PidMapping{})
	})
	t.Logf("per entry: stack delta %.2f B, delta page %.1f B, mapping prefix %.1f B", perDelta, perPage, perPrefix)

	for _, path := range []string{"/proc/self/exe", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"} {
		nd, np, err := pagesOfDeltas(path, tr.shared.DeltaPageBits)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		perMillion := 1e6 * (perDelta + perPage*float64(np)/float64(nd))
		t.Logf("%s: %d deltas on %d pages (%.0f per page): %.2f MiB per million deltas",
			path, nd, np, float64(nd)/float64(np), perMillion/(1<<20))
	}
}

func logMapMemory(t *testing.T, tr *Tracer, factor uint) {
	t.Helper()
	var total uint64
	var b strings.Builder
	for _, m := range tr.coll.Maps {
		total += mapMemlock(t, m)
	}
	for _, sm := range scaledMaps() {
		m := tr.coll.Maps[sm.name]
		fmt.Fprintf(&b, ", %s %d entries %.2f MiB", sm.name, m.MaxEntries(), float64(mapMemlock(t, m))/(1<<20))
	}
	t.Logf("factor %d: all maps %.2f MiB%s", factor, float64(total)/(1<<20), b.String())
}

// growth is a map's memlock added per entry by n calls of put.
func growth(t *testing.T, m *ebpf.Map, n uint64, put func(i uint64) error) float64 {
	t.Helper()
	before := mapMemlock(t, m)
	for i := range n {
		if err := put(i); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	return float64(mapMemlock(t, m)-before) / float64(n)
}

// mapMemlock is the kernel's account of a map's memory.
func mapMemlock(t *testing.T, m *ebpf.Map) uint64 {
	t.Helper()
	info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "memlock:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no memlock in the fdinfo of map %v", m)
	return 0
}

// pagesOfDeltas counts a file's deltas with a rule and the pages that hold
// them. The process manager's layout adds at most one delta per page (where
// a rule runs on from the page before); this ignores it.
func pagesOfDeltas(path string, pageBits uint) (deltas, pages int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	d, err := nativeunwind.ExtractReader(f)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	seen := map[uint64]bool{}
	for _, delta := range d {
		if delta.Rule.CFA != nativeunwind.CFAUnknown {
			deltas++
			seen[delta.Address>>pageBits] = true
		}
	}
	return deltas, len(seen), nil
}

package tracer

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/support"
)

// MaxMapScaleFactor is the largest Config.MapScaleFactor. At 8 the stack
// delta pool holds 1<<30 deltas, which the kernel stores in 4 GiB.
const MaxMapScaleFactor = 8

// scaledMap is a map that fills with the host's executables and processes,
// so that Config.MapScaleFactor sizes it.
type scaledMap struct {
	name string
	// limit is the most entries BPF can address.
	limit uint64
}

// scaledMaps are the maps the scale factor multiplies. Neither BPF nor Go
// compiles in their sizes: user space reads them back from the loaded maps
// (DeltaCapacity). unknown_pc_reports is left alone: it is an LRU that
// evicts instead of failing.
func scaledMaps() []scaledMap {
	return []scaledMap{
		// Delta indexes (delta_page.first plus an offset) are u32; an
		// element holds DELTAS_PER_SLOT of them.
		{"stack_deltas", math.MaxUint32 / uint64(len(support.DeltaSlot{}))},
		// Hash and trie: keyed, not indexed.
		{"delta_pages", math.MaxUint32},
		{"pid_mappings", math.MaxUint32},
		// Indexed by stack_delta.rule, a u16: rules past 1<<16 could never
		// be referenced.
		{"unwind_rules", 1 << (8 * unsafe.Sizeof(support.StackDelta{}.Rule))},
	}
}

// scaleMaps multiplies the compiled sizes of the scaled maps by
// 2^factor, each up to what BPF can address.
func scaleMaps(spec *ebpf.CollectionSpec, factor uint) error {
	for _, sm := range scaledMaps() {
		ms, ok := spec.Maps[sm.name]
		if !ok {
			return fmt.Errorf("BPF object lacks map %s", sm.name)
		}
		ms.MaxEntries = uint32(min(uint64(ms.MaxEntries)<<factor, sm.limit))
	}
	return nil
}

// createScaledMaps creates the scaled maps ahead of the collection, so that
// when the kernel refuses one (usually: the cgroup has too little memory
// for a large factor) the error names the map and its size. The collection
// takes its own references: the caller closes these after loading it.
func createScaledMaps(spec *ebpf.CollectionSpec, factor uint) (map[string]*ebpf.Map, error) {
	maps := make(map[string]*ebpf.Map)
	for _, sm := range scaledMaps() {
		ms := spec.Maps[sm.name]
		m, err := ebpf.NewMap(ms)
		if err != nil {
			closeMaps(maps)
			err = fmt.Errorf("creating BPF map %s of %s (map scale factor %d): %w",
				sm.name, mapSize(ms), factor, err)
			if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.E2BIG) {
				err = fmt.Errorf("%w: lower the map scale factor or raise the memory limit of the daemon's cgroup", err)
			}
			return nil, err
		}
		maps[sm.name] = m
	}
	return maps, nil
}

func closeMaps(maps map[string]*ebpf.Map) {
	for _, m := range maps {
		m.Close()
	}
}

// mapSize describes a map's size for errors. Arrays are allocated whole at
// creation, each value rounded up to 8 bytes; hash maps and tries without
// preallocation grow as they fill.
func mapSize(ms *ebpf.MapSpec) string {
	if ms.Type != ebpf.Array {
		return fmt.Sprintf("%d entries", ms.MaxEntries)
	}
	bytes := uint64(ms.MaxEntries) * ((uint64(ms.ValueSize) + 7) &^ 7)
	return fmt.Sprintf("%d entries (%d MiB)", ms.MaxEntries, bytes>>20)
}

package tracer

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// mapObjects and programObjects are the loaded maps and programs the
// tracer itself uses. They are assigned from the collections by their
// tags, so a map or program the C side renamed or dropped fails with its
// name instead of leaving a nil handle to fail at first use. The maps are
// created first, the programs loaded while user space already fills the
// maps (New).
type mapObjects struct {
	Events         *ebpf.Map `ebpf:"events"`
	Progs          *ebpf.Map `ebpf:"progs"`
	Metrics        *ebpf.Map `ebpf:"metrics"`
	RuntimeMetrics *ebpf.Map `ebpf:"runtime_metrics"`
	StackDeltas    *ebpf.Map `ebpf:"stack_deltas"`
	UnwindRules    *ebpf.Map `ebpf:"unwind_rules"`
	DeltaPages     *ebpf.Map `ebpf:"delta_pages"`
	KnownFiles     *ebpf.Map `ebpf:"known_files"`
	PidMappings    *ebpf.Map `ebpf:"pid_mappings"`
	RuntimeProcs   *ebpf.Map `ebpf:"runtime_procs"`
	APMProcs       *ebpf.Map `ebpf:"apm_procs"`
	GoProcs        *ebpf.Map `ebpf:"go_procs"`
	ThreadCtxProcs *ebpf.Map `ebpf:"thread_ctx_procs"`
	TrackedPIDs    *ebpf.Map `ebpf:"tracked_pids"`
}

type programObjects struct {
	SampleEntry    *ebpf.Program `ebpf:"sample_entry"`
	ProcessExit    *ebpf.Program `ebpf:"process_exit"`
	ProcessExec    *ebpf.Program `ebpf:"process_exec"`
	MapWatchKprobe *ebpf.Program `ebpf:"exec_mapped_kprobe"`
}

// assignObjects fills objs (a *mapObjects or *programObjects) from coll
// without taking anything out of it. Collection.Assign moves what it
// assigns out of the collection, so it runs on a copy of coll's index: coll
// keeps every object, to close them, to report every program's verifier
// statistics and to find the tail-call targets by the names enum prog_id
// and the registry give. LoadAndAssign is no fit either: it loads only what
// objs names and what that needs, and nothing but the tail-call table
// reaches the unwinders.
func assignObjects(coll *ebpf.Collection, objs any) error {
	view := &ebpf.Collection{Maps: maps.Clone(coll.Maps), Programs: maps.Clone(coll.Programs)}
	if err := view.Assign(objs); err != nil {
		return fmt.Errorf("BPF object does not have what the tracer uses: %w", err)
	}
	return nil
}

// preparedSpec is what prepareSpec read from the BPF object and took out of
// it.
type preparedSpec struct {
	shared *support.Shared
	// runtimes are the runtimes whose unwinders stay in spec, by id.
	runtimes map[interpreter.ID]*interpreter.Runtime
	// mapWatch and readContext are loaded on their own, after the
	// collection (loadAlone).
	mapWatch    *ebpf.ProgramSpec
	readContext *ebpf.ProgramSpec
	// offCPU is the sched_switch program, nil when off-CPU profiling is off
	// (offcpu.go).
	offCPU      *ebpf.ProgramSpec
	eventsBytes uint32
	feats       kernelFeatures
}

// prepareSpec is the one place spec is edited by name before it is loaded
// with cfg on a kernel with feats: sizes, constants, and the programs left
// out. After loading, the tracer goes through objects.
func prepareSpec(spec *ebpf.CollectionSpec, cfg Config, feats kernelFeatures, cpus int) (*preparedSpec, error) {
	shared, err := support.ReadShared(spec)
	if err != nil {
		return nil, err
	}
	events, ok := spec.Maps["events"]
	if !ok {
		return nil, errors.New("BPF object lacks map events")
	}
	ls := &preparedSpec{shared: shared, eventsBytes: eventBufferBytes(cpus, cfg.tracesPerSecond()), feats: feats}
	events.MaxEntries = ls.eventsBytes
	if err := scaleMaps(spec, cfg.MapScaleFactor); err != nil {
		return nil, err
	}
	if !feats.onDemandHash {
		preallocateHashMaps(spec)
	}
	if err := setConstants(spec, map[string]any{
		"have_task_pt_regs":   boolToU32(feats.taskPtRegs),
		"page_shift":          uint32(bits.TrailingZeros(uint(os.Getpagesize()))),
		"events_wakeup_bytes": uint64(ls.eventsBytes / 2),
		// Five times as often as the process manager re-reads a process's
		// maps (once a second): with equal periods the two limits alias,
		// and a library dlopen()ed just after a read waited up to two
		// seconds to be noticed instead of one.
		"unknown_pc_report_interval": uint64(200 * time.Millisecond),
		// Runtime frames are symbolized from the process's memory: a
		// process's last samples must be read before it exits.
		"trace_wakeup_latency": uint64(TraceWakeupLatency),
	}); err != nil {
		return nil, err
	}
	if !feats.findVMA {
		delete(spec.Programs, ResolveVMA)
	}
	if ls.runtimes, err = selectRuntimes(spec, shared, cfg.Runtimes); err != nil {
		return nil, err
	}
	ls.mapWatch = splitProgram(spec, MapWatchFexit)
	ls.readContext = splitProgram(spec, ReadContext)
	if ls.offCPU, err = prepareOffCPU(spec, cfg.OffCPU); err != nil {
		return nil, err
	}
	return ls, nil
}

// splitProgram removes program name from spec, to be loaded with
// loadAlone, and returns it (nil if the object lacks it).
func splitProgram(spec *ebpf.CollectionSpec, name string) *ebpf.ProgramSpec {
	ps := spec.Programs[name]
	delete(spec.Programs, name)
	return ps
}

// loadAlone loads one program split from spec against the loaded
// collection's maps: one that a kernel may refuse without the rest failing
// with it.
func loadAlone(spec *ebpf.CollectionSpec, name string, ps *ebpf.ProgramSpec, coll *ebpf.Collection,
	opts ebpf.ProgramOptions, cache *btf.Cache) (*ebpf.Program, error) {
	if ps == nil {
		return nil, errors.New("BPF object lacks " + name)
	}
	one := spec.Copy()
	one.Programs = map[string]*ebpf.ProgramSpec{name: ps.Copy()}
	c, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
		MapReplacements: coll.Maps, Programs: opts, Cache: cache})
	if err != nil {
		return nil, err
	}
	p := c.Programs[name]
	delete(c.Programs, name)
	c.Close()
	return p, nil
}

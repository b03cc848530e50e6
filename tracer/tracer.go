// Package tracer loads the BPF programs and maps into the kernel, owns the
// sampling perf events and the process-exit probe, and pumps the events BPF
// emits into Go. It holds no policy: what to do with a trace is the
// handler's business.
package tracer

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// Config says how to load and attach the programs.
type Config struct {
	// SamplesPerSecond is the sampling frequency per CPU.
	SamplesPerSecond int
	// OffCPU says which context switches are traced (offcpu.go).
	OffCPU OffCPUConfig
	// BPFLogLevel is passed to the verifier (0 = only on failure).
	BPFLogLevel uint32
	// MapScaleFactor doubles the maps that hold stack deltas and process
	// mappings once per step, from 0 (the compiled sizes) to
	// MaxMapScaleFactor.
	MapScaleFactor uint
	// Runtimes are the language runtimes whose unwinders are loaded; the
	// programs of the others are not.
	Runtimes []*interpreter.Runtime
}

// tracesPerSecond is how many traces a CPU may send a second: its samples
// and, with off-CPU profiling, its traced switches.
func (c Config) tracesPerSecond() int {
	if !c.OffCPU.Enabled() {
		return c.SamplesPerSecond
	}
	return c.SamplesPerSecond + int(c.OffCPU.perSecond())
}

// Bounds of the events ring buffer: it holds about half a second of traces
// at the configured rate.
const (
	minEventBufferBytes = 256 << 10
	maxEventBufferBytes = 64 << 20
	bytesPerTrace       = 1 << 10
)

// Tracer is the loaded BPF object with its attachments.
type Tracer struct {
	cfg    Config
	shared *support.Shared
	// coll owns every map, progColl every program (with copies of the
	// maps' handles); objs and progs are typed handles on the ones the
	// tracer uses. The programs are loaded in the background: loaded is
	// closed when they are, or failed to (loadErr).
	coll     *ebpf.Collection
	objs     mapObjects
	progColl *ebpf.Collection
	progs    programObjects
	loaded   chan struct{}
	loadErr  error
	loadTime time.Duration
	reader   *ringbuf.Reader
	wake     *ringWaiter
	// queue holds the records read and not yet handled (eventqueue.go).
	queue *eventQueue
	// mu guards perfEvents and samplingOff: SetSampling may come from
	// another goroutine than Attach and Detach.
	mu         sync.Mutex
	perfEvents []*perfEvent
	// samplingOff holds the perf events disabled (SetSampling).
	samplingOff bool
	// procLinks attach the process exit, exec and mapping probes.
	procLinks []link.Link
	// mapWatch is the fexit program that reports new executable mappings,
	// nil with mapWatchErr where it did not load; mapWatchMode says which
	// watch Attach attached.
	mapWatch     *ebpf.Program
	mapWatchErr  error
	mapWatchMode string
	cpus         []int
	// runtimes are the loaded runtimes' unwinders, by id.
	runtimes map[interpreter.ID]*interpreter.Runtime
	// malformed counts ring buffer records that did not decode.
	malformed atomic.Uint64
	// warnUntracked warns once that tracked_pids is full (TrackProcess).
	warnUntracked sync.Once
	// deltasMappable says the stack delta pool can be mapped into
	// memory: a file's deltas are written through a mapping of their
	// span, not as map updates.
	deltasMappable bool
	// readContext is ReadContext, nil where the kernel refused it (then
	// samples carry no goroutine labels or thread contexts).
	readContext *ebpf.Program
	// offCPU holds the off-CPU programs, nil when off (offcpu.go);
	// offCPUPending the traces of the waits that have not ended.
	offCPU        *ebpf.Collection
	offCPUPending *offCPUPending
	// resolvesUnread says ResolveVMA is loaded: the kernel has
	// bpf_find_vma.
	resolvesUnread bool
}

// New checks privileges and kernel features, creates the maps and starts
// loading the programs (WaitLoaded). Nothing is attached yet.
func New(cfg Config) (*Tracer, error) {
	if cfg.SamplesPerSecond <= 0 {
		return nil, fmt.Errorf("samples per second must be positive, got %d", cfg.SamplesPerSecond)
	}
	if cfg.MapScaleFactor > MaxMapScaleFactor {
		return nil, fmt.Errorf("map scale factor must be 0 to %d, got %d", MaxMapScaleFactor, cfg.MapScaleFactor)
	}
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	cpus, err := onlineCPUs()
	if err != nil {
		return nil, err
	}
	feats, err := probeFeatures()
	if err != nil {
		return nil, err
	}
	// Kernels >= 5.11 charge BPF memory to the cgroup and need no memlock
	// limit; RemoveMemlock only raises it on older kernels. Where raising it
	// fails we go on: loading reports the real problem if there is one.
	if err := rlimit.RemoveMemlock(); err != nil {
		log.Warnf("Could not raise RLIMIT_MEMLOCK (%v); continuing, loading may fail on kernels before 5.11", err)
	}

	spec, err := support.LoadSpec()
	if err != nil {
		return nil, err
	}
	ls, err := prepareSpec(spec, cfg, feats, len(cpus))
	if err != nil {
		return nil, err
	}
	scaled, err := createScaledMaps(spec, cfg.MapScaleFactor)
	if err != nil {
		return nil, err
	}
	// The maps first: user space may fill them while the kernel verifies
	// the programs, which takes about a second.
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	coll, err := ebpf.NewCollectionWithOptions(mapsOnly, ebpf.CollectionOptions{MapReplacements: scaled})
	closeMaps(scaled)
	if err != nil {
		return nil, loadError(err)
	}
	t := &Tracer{cfg: cfg, shared: ls.shared, coll: coll, cpus: cpus, runtimes: ls.runtimes,
		resolvesUnread: feats.findVMA, loaded: make(chan struct{})}
	if err := assignObjects(coll, &t.objs); err != nil {
		coll.Close()
		return nil, err
	}
	t.deltasMappable = t.objs.StackDeltas.Flags()&unix.BPF_F_MMAPABLE != 0
	if t.reader, err = ringbuf.NewReader(t.objs.Events); err != nil {
		close(t.loaded)
		t.Close()
		return nil, fmt.Errorf("opening the events ring buffer: %w", err)
	}
	if t.wake, err = newRingWaiter(t.objs.Events.FD()); err != nil {
		close(t.loaded)
		t.Close()
		return nil, err
	}
	t.queue = newEventQueue(eventQueueBytes(len(cpus), cfg.tracesPerSecond()))
	log.Debugf("Created BPF maps for %d CPUs (events buffer %d KiB, stack delta pool %d entries, map scale factor %d)",
		len(cpus), ls.eventsBytes>>10, t.objs.StackDeltas.MaxEntries(), cfg.MapScaleFactor)
	go func() {
		defer close(t.loaded)
		t.loadErr = t.loadPrograms(spec, ls)
	}()
	return t, nil
}

// loadPrograms loads and verifies the programs into the maps New created
// and registers the tail-call targets.
func (t *Tracer) loadPrograms(spec *ebpf.CollectionSpec, ls *preparedSpec) error {
	start := time.Now()
	defer func() { t.loadTime = time.Since(start) }()
	// Both loads relocate against the kernel's BTF: parse it once.
	btfCache := btf.NewCache()
	opts := ebpf.CollectionOptions{
		MapReplacements: t.coll.Maps,
		// The statistics are a few lines; VerifiedInstructions reads
		// them on kernels whose program info lacks the count.
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevel(t.cfg.BPFLogLevel) | ebpf.LogLevelStats},
		Cache:    btfCache,
	}
	progs, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		return loadError(err)
	}
	t.progColl = progs
	if err := assignObjects(progs, &t.progs); err != nil {
		return err
	}
	t.mapWatch, t.mapWatchErr = loadAlone(spec, MapWatchFexit, ls.mapWatch, t.coll,
		ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}, btfCache)
	if t.readContext, err = loadAlone(spec, ReadContext, ls.readContext, t.coll, opts.Programs, btfCache); err != nil {
		// The unwind then ends in unwind_stop directly (tail_call_stop).
		log.Warnf("Not reading goroutine labels and OpenTelemetry thread contexts: %v", loadError(err))
	}
	if t.cfg.BPFLogLevel != 0 {
		for name, p := range progs.Programs {
			log.Debugf("Verifier log of %s:\n%s", name, p.VerifierLog)
		}
	}
	targets := maps.Clone(t.progColl.Programs)
	if t.readContext != nil {
		targets[ReadContext] = t.readContext
	}
	if err := t.fillProgArray(t.objs.Progs, targets); err != nil {
		return err
	}
	if t.offCPU, err = t.loadOffCPU(spec, ls, opts.Programs, btfCache); err != nil {
		return err
	}
	log.Debugf("Loaded BPF programs (bpf_task_pt_regs %v, bpf_find_vma %v); instructions the verifier processed: %v",
		ls.feats.taskPtRegs, ls.feats.findVMA, t.verifiedInstructions())
	return nil
}

// WaitLoaded waits until New's programs are loaded and returns why they
// did not load, if they did not. Attach waits for them too.
func (t *Tracer) WaitLoaded() error {
	<-t.loaded
	return t.loadErr
}

// ResolvesUnread says whether BPF unwinds a process's first samples before
// user space has read its mappings: its program's code from the task's mm,
// and one library per sample from the task's VMAs (resolve_vma, 5.17).
func (t *Tracer) ResolvesUnread() bool { return t.resolvesUnread }

// ResolveVMA is the program that looks PCs up in the task's VMAs with
// bpf_find_vma (native_stack.ebpf.c): loaded only where the kernel supports
// that; without it, the native unwinder goes on without.
const ResolveVMA = "resolve_vma"

// ReadContext is the program that reads goroutine labels and OpenTelemetry
// thread contexts at the end of an unwind (read_context.ebpf.c): loaded on
// its own, so that a kernel refusing it loses only those.
const ReadContext = "read_context"

func boolToU32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// eventBufferBytes sizes the ring buffer: a power of two (a kernel
// requirement) holding about half a second of traces.
func eventBufferBytes(cpus, hz int) uint32 {
	want := uint64(cpus) * uint64(hz) * bytesPerTrace / 2
	want = min(max(want, minEventBufferBytes), maxEventBufferBytes)
	return uint32(1) << bits.Len64(want-1)
}

func setConstants(spec *ebpf.CollectionSpec, values map[string]any) error {
	for name, v := range values {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("BPF object lacks constant %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("setting BPF constant %s: %w", name, err)
		}
	}
	return nil
}

// loadError turns a load failure into advice.
func loadError(err error) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		// cilium/ebpf names the program first: "program NAME: load program: ...".
		prog := "a BPF program"
		if before, _, ok := strings.Cut(err.Error(), ":"); ok && strings.HasPrefix(before, "program ") {
			prog = "BPF " + before
		}
		return fmt.Errorf("the kernel's verifier rejected %s (kernel %s): %+v", prog, KernelRelease(), verr)
	}
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("loading BPF programs: %w (needs root; on kernels before 5.11 also a high enough RLIMIT_MEMLOCK)", err)
	}
	if strings.Contains(err.Error(), "load kernel spec") {
		// The programs read kernel structs (a task's stack and thread
		// pointer, for kernel frames, runtimes and APM trace correlation)
		// at offsets relocated from the kernel's BTF.
		return fmt.Errorf("loading BPF programs: the kernel's BTF type information is missing or unreadable "+
			"(/sys/kernel/btf/vmlinux; kernels built with CONFIG_DEBUG_INFO_BTF=y have it, as distribution kernels "+
			"do since about 5.4): %w", err)
	}
	return fmt.Errorf("loading BPF programs: %w", err)
}

// selectRuntimes checks the unwinders of the runtimes to load against the
// object (id, configuration struct) and removes the programs of the others
// from spec, so that a runtime switched off costs nothing.
func selectRuntimes(spec *ebpf.CollectionSpec, shared *support.Shared, want []*interpreter.Runtime) (
	map[interpreter.ID]*interpreter.Runtime, error) {
	loaded := map[interpreter.ID]*interpreter.Runtime{}
	for _, rt := range want {
		if rt.ID == 0 {
			continue
		}
		id, ok := shared.Runtimes[rt.Name]
		if !ok || interpreter.ID(id) != rt.ID {
			return nil, fmt.Errorf("runtime %s has id %d, the BPF object's RUNTIME_%s %d (present: %v)",
				rt.Name, rt.ID, strings.ToUpper(rt.Name), id, ok)
		}
		if rt.ConfigStruct != "" {
			if err := shared.CheckMirror(rt.ConfigStruct, rt.ConfigMirror); err != nil {
				return nil, fmt.Errorf("runtime %s: %w", rt.Name, err)
			}
		}
		loaded[rt.ID] = rt
	}
	for name, id := range shared.Runtimes {
		if _, ok := loaded[interpreter.ID(id)]; !ok {
			delete(spec.Programs, support.RuntimeProgram(name))
		}
	}
	return loaded, nil
}

// progSlots are the tail-call targets that loaded, by name: the core's by
// the names of enum prog_id, the runtimes' by the names the registry
// gives.
func (t *Tracer) progSlots() map[string]uint32 {
	slots := maps.Clone(t.shared.Programs)
	if !t.resolvesUnread {
		delete(slots, ResolveVMA)
	}
	if t.readContext == nil {
		delete(slots, ReadContext)
	}
	for id, rt := range t.runtimes {
		slots[support.RuntimeProgram(rt.Name)] = uint32(id)
	}
	return slots
}

// fillProgArray registers the tail-call targets in array from progs.
func (t *Tracer) fillProgArray(array *ebpf.Map, progs map[string]*ebpf.Program) error {
	for name, idx := range t.progSlots() {
		p, ok := progs[name]
		if !ok {
			return fmt.Errorf("BPF object lacks program %s for tail-call slot %d", name, idx)
		}
		if err := array.Put(idx, p); err != nil {
			return fmt.Errorf("registering tail-call target %s: %w", name, err)
		}
	}
	return nil
}

// Runtimes names the runtimes whose unwinders are loaded.
func (t *Tracer) Runtimes() []string {
	var names []string
	for _, rt := range t.runtimes {
		names = append(names, rt.Name)
	}
	slices.Sort(names)
	return names
}

// Attach starts sampling every online CPU and watching process exits and
// execs.
func (t *Tracer) Attach() error {
	if err := t.WaitLoaded(); err != nil {
		return err
	}
	for tp, prog := range map[string]*ebpf.Program{
		"sched_process_exit": t.progs.ProcessExit,
		"sched_process_exec": t.progs.ProcessExec,
	} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: prog})
		if err != nil {
			t.Detach()
			return fmt.Errorf("attaching to the %s tracepoint: %w", tp, err)
		}
		t.procLinks = append(t.procLinks, l)
	}
	t.attachMapWatch()
	if err := t.attachOffCPU(); err != nil {
		t.Detach()
		return err
	}
	mode, err := t.openPerfEvents()
	if err != nil {
		t.Detach()
		return err
	}
	log.Infof("Sampling %d CPUs at %d Hz (programs loaded in %v; perf events attached via %s; new mappings watched by %s)",
		len(t.cpus), t.cfg.SamplesPerSecond, t.loadTime.Round(time.Millisecond), mode, t.mapWatchMode)
	return nil
}

// openPerfEvents opens every CPU's event, enabled unless sampling is off,
// and returns how the program was attached to them.
func (t *Tracer) openPerfEvents() (attachMode string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cpu := range t.cpus {
		pe, err := openPerfEvent(cpu, t.cfg.SamplesPerSecond, t.progs.SampleEntry, !t.samplingOff)
		if err != nil {
			return "", err
		}
		t.perfEvents = append(t.perfEvents, pe)
		attachMode = pe.attachMode()
	}
	return attachMode, nil
}

// SetSampling turns sampling on or off without unloading anything (for
// probabilistic profiling): off, the perf events are disabled and cost
// nothing, and no switch is traced off the CPU. It may be called before Attach, which then attaches them in
// that state.
func (t *Tracer) SetSampling(on bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.samplingOff = !on
	var errs []error
	for _, pe := range t.perfEvents {
		errs = append(errs, pe.enable(on))
	}
	if t.offCPU != nil {
		errs = append(errs, t.pauseOffCPU(!on))
	}
	return errors.Join(errs...)
}

// Detach stops sampling. Events already in the ring buffer can still be read.
func (t *Tracer) Detach() {
	t.mu.Lock()
	for _, pe := range t.perfEvents {
		pe.close()
	}
	t.perfEvents = nil
	t.mu.Unlock()
	for _, l := range t.procLinks {
		l.Close()
	}
	t.procLinks = nil
}

// VerifiedInstructions returns, per loaded program, how many instructions
// the verifier processed to accept it (1,000,000 is the kernel's limit):
// from the program's info where the kernel reports it (5.16), else from the
// statistics line of its verifier log.
func (t *Tracer) VerifiedInstructions() map[string]uint32 {
	if t.WaitLoaded() != nil {
		return map[string]uint32{}
	}
	return t.verifiedInstructions()
}

func (t *Tracer) verifiedInstructions() map[string]uint32 {
	out := map[string]uint32{}
	progs := maps.Clone(t.progColl.Programs)
	if t.mapWatch != nil {
		progs[MapWatchFexit] = t.mapWatch
	}
	if t.readContext != nil {
		progs[ReadContext] = t.readContext
	}
	if t.offCPU != nil {
		progs[OffCPUSwitch] = t.offCPU.Programs[OffCPUSwitch]
	}
	for name, p := range progs {
		if info, err := p.Info(); err == nil {
			if n, ok := info.VerifiedInstructions(); ok {
				out[name] = n
				continue
			}
		}
		if n, ok := processedInsns(p.VerifierLog); ok {
			out[name] = n
		}
	}
	return out
}

// processedInsnsRe matches the verifier's statistics line, "processed 123
// insns (limit 1000000) ...", the same since 5.2.
var processedInsnsRe = regexp.MustCompile(`(?m)^processed (\d+) insns`)

func processedInsns(verifierLog string) (uint32, bool) {
	m := processedInsnsRe.FindStringSubmatch(verifierLog)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(n), true
}

// Attachment says how Attach attached: the sampling program to the perf
// events ("bpf_link", or "ioctl" before 5.15) and the watch of new
// executable mappings (MapWatchModes). Empty before Attach.
func (t *Tracer) Attachment() (perfEvents, mapWatch string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.perfEvents) > 0 {
		perfEvents = t.perfEvents[0].attachMode()
	}
	return perfEvents, t.mapWatchMode
}

// MapMaxEntries is the capacity of a loaded map, 0 for a map that does not
// exist: for reports that name the maps they show.
func (t *Tracer) MapMaxEntries(name string) uint32 {
	if m, ok := t.coll.Maps[name]; ok {
		return m.MaxEntries()
	}
	return 0
}

// Metrics returns the BPF counters summed over CPUs, by name.
func (t *Tracer) Metrics() (map[string]uint64, error) {
	out := make(map[string]uint64, len(t.shared.Metrics))
	var perCPU []uint64
	read := func(m *ebpf.Map, idx uint32, name string) error {
		if err := m.Lookup(idx, &perCPU); err != nil {
			return fmt.Errorf("reading BPF counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
		return nil
	}
	for id, name := range t.shared.Metrics {
		if err := read(t.objs.Metrics, uint32(id), name); err != nil {
			return nil, err
		}
	}
	for idx, name := range t.shared.RuntimeMetrics {
		if _, loaded := t.runtimes[interpreter.ID(idx/support.RuntimeMetricsPerRuntime)]; !loaded {
			continue
		}
		if err := read(t.objs.RuntimeMetrics, idx, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Close detaches and unloads everything.
func (t *Tracer) Close() error {
	t.Detach()
	if t.reader != nil {
		t.reader.Close()
	}
	if t.wake != nil {
		t.wake.close()
	}
	<-t.loaded
	if t.progColl != nil {
		t.progColl.Close()
	}
	if t.coll != nil {
		t.coll.Close()
	}
	if t.mapWatch != nil {
		t.mapWatch.Close()
	}
	if t.readContext != nil {
		t.readContext.Close()
	}
	if t.offCPU != nil {
		t.offCPU.Close()
	}
	return nil
}

// KernelRelease is the running kernel's release, as uname -r prints it.
func KernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(uts.Release[:])
}

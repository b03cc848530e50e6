package processmanager

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/support"
)

// runtimeState is what the manager knows of one runtime in one process.
type runtimeState struct {
	rt *interpreter.Runtime
	// bin is the runtime found in a mapped file, nil for a runtime that
	// detects itself in the process (Runtime.Detect).
	bin interpreter.Binary
	// bias is the load bias of bin's file.
	bias uint64
	// proc is nil until the runtime attached.
	proc interpreter.Process
	// inBPF says the runtime's configuration map has the process.
	inBPF bool
	// regions are the code ranges it claimed, as written to the mapping
	// trie.
	regions []interpreter.Region
	// retry paces attach attempts while proc is nil; starting counts
	// those that failed with interpreter.ErrStarting.
	retry    libpf.Backoff
	starting int
	// refused is set when the runtime refused the process for good.
	refused bool
	// missed is set when a conversion found code in its regions that it
	// could not name; lastUpdate is when it was last asked to look again.
	missed     bool
	lastUpdate time.Time
}

// pending says the runtime waits to be attached: conversions of the
// process are not cached meanwhile. One that refused never will be.
func (st *runtimeState) pending() bool {
	return st.proc == nil && !st.refused && st.bin != nil && st.bin.Unsupported() == nil
}

// runtimeFor returns the state of the runtime whose frames have kind k.
func (p *process) runtimeFor(k libpf.FrameKind) *runtimeState {
	for _, st := range p.runtimes {
		if st.rt.ID != 0 && st.rt.ID.Kind() == k {
			return st
		}
	}
	return nil
}

// findRuntimes notices the runtimes a process's mappings hold, drops those
// that went, and attaches (paced) those not attached yet. Call it after
// the mappings changed. The caller holds m.mu.
func (m *Manager) findRuntimes(p *process) {
	type found struct {
		bin  interpreter.Binary
		bias uint64
	}
	inFiles := map[*interpreter.Runtime]found{}
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.ELF == nil || mp.pf == nil {
			continue
		}
		for _, rm := range mp.file.ELF.Runtimes {
			if _, ok := inFiles[rm.Runtime]; !ok {
				inFiles[rm.Runtime] = found{rm.Binary, mp.pf.Bias}
			}
		}
	}
	kept := p.runtimes[:0]
	for _, st := range p.runtimes {
		if f, ok := inFiles[st.rt]; st.bin != nil && (!ok || f.bin != st.bin || f.bias != st.bias) {
			m.dropRuntime(p, st)
			continue
		}
		kept = append(kept, st)
	}
	p.runtimes = kept
	for rt, f := range inFiles {
		if p.runtimeOf(rt) == nil {
			m.addRuntime(p, &runtimeState{rt: rt, bin: f.bin, bias: f.bias})
		}
	}
	for _, rt := range m.runtimes {
		if rt.Detect != nil && p.runtimeOf(rt) == nil {
			m.addRuntime(p, &runtimeState{rt: rt})
		}
	}
	for _, st := range p.runtimes {
		// New mappings may be what it lacked (its C library).
		st.retry.Reset()
		m.attachRuntime(p, st)
		m.updateRuntime(p, st)
	}
}

// runtimeOf returns the state of rt in p, nil if it has none.
func (p *process) runtimeOf(rt *interpreter.Runtime) *runtimeState {
	for _, st := range p.runtimes {
		if st.rt == rt {
			return st
		}
	}
	return nil
}

// addRuntime starts tracking a runtime of p. A runtime found in a file
// names the process's runtime; one a version cannot support is counted
// and never attached.
func (m *Manager) addRuntime(p *process, st *runtimeState) {
	st.retry = libpf.NewBackoff(st.rt.RetryMin, st.rt.RetryMax)
	p.runtimes = append(p.runtimes, st)
	if st.bin == nil {
		return
	}
	if p.info.RuntimeName == "" {
		info := *p.info
		info.RuntimeName, info.RuntimeVersion = st.rt.DisplayName, st.bin.Version()
		p.info = &info
		// Conversions cached so far carry the old process info.
		p.gen = m.newGeneration()
	}
	if err := st.bin.Unsupported(); err != nil {
		m.counters.interpreterErrors++
		m.log.WithError(err).Debugf("process %d: not unwinding its %s", p.pid, st.rt.DisplayName)
	}
}

// attachRuntime attaches a runtime to its process, or retries (paced)
// where that failed. The caller holds m.mu.
func (m *Manager) attachRuntime(p *process, st *runtimeState) {
	if st.proc != nil || st.refused || (st.bin != nil && st.bin.Unsupported() != nil) || !st.retry.Ready(m.now()) {
		return
	}
	if !m.live(p) {
		return // gone
	}
	h := &runtimeHost{m: m, p: p, st: st}
	var proc interpreter.Process
	var err error
	if st.bin != nil {
		proc, err = st.bin.Attach(h)
	} else {
		proc, err = st.rt.Detect(h)
	}
	if err == nil && proc != nil {
		st.proc = proc
		m.counters.runtimeAttached[st.rt.Name]++
		m.log.Debugf("process %d: attached %s", p.pid, st.rt.Name)
		if st.rt.ID == 0 {
			// A runtime without a BPF unwinder names its frames at
			// conversion only: those cached before it attached (it
			// found what it needs after the process was first read)
			// are converted again. Not the others': BPF did not unwind
			// their frames then, and converting a JIT runtime's traces
			// again later, against code that has moved, named fewer
			// (a JIT runtime test's first process: 94.7-97.7% instead
			// of 99%).
			p.gen = m.newGeneration()
		}
		return
	}
	// A failed attempt may have written some of its entries.
	m.clearRuntimeBPF(p, st)
	if m.refused(p, st, err) {
		return
	}
	if errors.Is(err, interpreter.ErrStarting) && st.starting < interpreter.StartingTries {
		// Not an error: the runtime will be ready soon.
		st.starting++
		wait := st.retry.Again(m.now())
		m.log.WithError(err).Debugf("process %d: %s not started yet (next try in %v)", p.pid, st.rt.Name, wait)
		m.retryLater(p, wait)
		return
	}
	wait := st.retry.Failed(m.now())
	if err != nil {
		m.counters.interpreterErrors++
		m.log.WithError(err).Debugf("process %d: cannot attach %s yet (next try in %v)", p.pid, st.rt.Name, wait)
	}
}

// retryLater tries p's waiting runtimes again after wait, without waiting
// for a sample to ask: the reader of traces wakes only every 200 ms
// (tracer.TraceWakeupLatency), and until a runtime is attached BPF cannot
// unwind its code. The caller holds m.mu.
func (m *Manager) retryLater(p *process, wait time.Duration) {
	m.afterFunc(wait, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if !m.closed && m.procs[p.pid] == p && m.live(p) {
			m.refreshRuntimes(p)
		}
	})
}

// minRuntimeUpdate is the least time between two looks of an attached
// runtime at its process (Updater), so a process that JIT-compiles
// continuously costs a bounded amount.
const minRuntimeUpdate = 100 * time.Millisecond

// updateRuntime lets an attached runtime look at its process again
// (Updater). The caller holds m.mu.
func (m *Manager) updateRuntime(p *process, st *runtimeState) {
	u, ok := st.proc.(interpreter.Updater)
	if !ok || m.now().Sub(st.lastUpdate) < minRuntimeUpdate {
		return
	}
	st.lastUpdate = m.now()
	st.missed = false
	changed, err := u.Update(&runtimeHost{m: m, p: p, st: st})
	if m.refused(p, st, err) {
		m.dropRuntime(p, st)
		changed = true
	} else if err != nil {
		m.counters.interpreterErrors++
		m.log.WithError(err).Debugf("process %d: updating %s", p.pid, st.rt.Name)
	}
	if changed {
		// Cached conversions name its code as it was.
		p.gen = m.newGeneration()
	}
}

// refreshRuntimes retries attaching runtimes and lets those that missed
// code, or are due to, look again: the part of a sample's lifecycle work that is the
// runtimes'. The caller holds m.mu.
func (m *Manager) refreshRuntimes(p *process) {
	for _, st := range p.runtimes {
		due := st.rt.UpdateEvery > 0 && m.now().Sub(st.lastUpdate) >= st.rt.UpdateEvery
		if st.proc == nil {
			m.attachRuntime(p, st)
		} else if st.missed || due {
			m.updateRuntime(p, st)
		}
	}
}

// runtimeWorkDue says whether refreshRuntimes would try to attach a runtime
// of p or let an attached one look again now. The caller holds m.mu.
func (m *Manager) runtimeWorkDue(p *process) bool {
	now := m.now()
	for _, st := range p.runtimes {
		if st.proc == nil {
			if !st.refused && (st.bin == nil || st.bin.Unsupported() == nil) && st.retry.Ready(now) {
				return true
			}
			continue
		}
		if _, ok := st.proc.(interpreter.Updater); !ok || now.Sub(st.lastUpdate) < minRuntimeUpdate {
			continue
		}
		if st.missed || st.rt.UpdateEvery > 0 && now.Sub(st.lastUpdate) >= st.rt.UpdateEvery {
			return true
		}
	}
	return false
}

// refused says whether err refuses the process for good (counted by
// reason; the runtime does not try again).
func (m *Manager) refused(p *process, st *runtimeState, err error) bool {
	var r *interpreter.RefusedError
	if !errors.As(err, &r) {
		return false
	}
	st.refused = true
	m.counters.runtimeRefusals[st.rt.Name+"/"+r.Reason]++
	m.log.WithError(err).Debugf("process %d: %s refused", p.pid, st.rt.Name)
	return true
}

// dropRuntimes detaches every runtime of a process. The caller holds m.mu.
func (m *Manager) dropRuntimes(p *process) {
	for _, st := range p.runtimes {
		m.dropRuntime(p, st)
	}
	p.runtimes = nil
}

// dropRuntime detaches one runtime and removes its BPF entries.
func (m *Manager) dropRuntime(p *process, st *runtimeState) {
	if st.proc != nil {
		st.proc.Detach()
		st.proc = nil
	}
	m.clearRuntimeBPF(p, st)
}

// clearRuntimeBPF removes what a runtime wrote to BPF for a process.
func (m *Manager) clearRuntimeBPF(p *process, st *runtimeState) {
	if st.inBPF {
		if err := m.runtimeMaps().DeleteRuntimeConfig(p.pid, st.rt.ID); err != nil {
			m.log.WithError(err).Debugf("process %d: removing its %s configuration", p.pid, st.rt.Name)
		}
		st.inBPF = false
	}
	if m.unwind != nil {
		for _, r := range st.regions {
			m.unwind.RemoveRegion(p.pid, r.Start)
		}
	}
	st.regions = nil
}

// runtimeMaps is where runtimes write their configuration: the tracer's
// maps, or nowhere without Unwinding.
func (m *Manager) runtimeMaps() unwindmaps.RuntimeMaps {
	if m.unwind != nil && m.unwinding.Runtimes != nil {
		return m.unwinding.Runtimes
	}
	return noRuntimeMaps{}
}

type noRuntimeMaps struct{}

func (noRuntimeMaps) SetRuntimeConfig(uint32, interpreter.ID, any) error { return nil }
func (noRuntimeMaps) DeleteRuntimeConfig(uint32, interpreter.ID) error   { return nil }

// runtimeFrames symbolizes one BPF frame of a runtime. A frame that cannot
// be symbolized (the process exited, the object was freed before we read
// it) is named as such and counted.
func (m *Manager) runtimeFrames(p *process, rf support.Frame, frames []libpf.Frame) []libpf.Frame {
	st := p.runtimeFor(rf.Kind)
	if st != nil && st.proc != nil {
		out, err := st.proc.Symbolize(rf, frames)
		if err == nil && len(out) > len(frames) {
			return out
		}
	}
	name := "runtime"
	if st != nil {
		name = st.rt.DisplayName
	}
	m.counters.runtimeFrameErrors++
	return append(frames, libpf.Frame{Kind: rf.Kind, FunctionName: "[unknown " + name + " frame]"})
}

// symbolizeAnonymous names a native frame in anonymous memory from the
// runtimes that claimed code there; false if none could. A miss lets the
// runtimes look again on the next sample.
func (p *process) symbolizeAnonymous(addr uint64) (libpf.Frame, bool) {
	for _, st := range p.runtimes {
		as, ok := st.proc.(interpreter.AddrSymbolizer)
		if !ok || !st.claims(addr) {
			continue
		}
		if f, ok := as.SymbolizeAddr(addr); ok {
			return f, true
		}
		st.missed = true
	}
	return libpf.Frame{}, false
}

// claimed says whether a runtime claimed addr.
func (p *process) claimed(addr uint64) bool {
	for _, st := range p.runtimes {
		if st.claims(addr) {
			return true
		}
	}
	return false
}

// claims says whether addr is in one of the runtime's regions.
func (st *runtimeState) claims(addr uint64) bool {
	for _, r := range st.regions {
		if addr >= r.Start && addr < r.End {
			return true
		}
	}
	return false
}

// runtimeTraceRecheck is how long a trace with frames of the process's
// runtimes may be served from the cache (the least TraceRecheck of those
// it has frames of); 0 for no limit.
func (p *process) runtimeTraceRecheck(frames []libpf.Frame) time.Duration {
	var d time.Duration
	for i := range frames {
		if !frames[i].Kind.IsRuntime() {
			continue
		}
		if st := p.runtimeFor(frames[i].Kind); st != nil && st.rt.TraceRecheck > 0 && (d == 0 || st.rt.TraceRecheck < d) {
			d = st.rt.TraceRecheck
		}
	}
	return d
}

// runtimesPending says a runtime of the process waits to be attached.
func (p *process) runtimesPending() bool {
	for _, st := range p.runtimes {
		if st.pending() {
			return true
		}
	}
	return false
}

// runtimeHost is the manager's side of one runtime in one process
// (interpreter.Host). Its methods run under m.mu.
type runtimeHost struct {
	m  *Manager
	p  *process
	st *runtimeState
}

func (h *runtimeHost) PID() libpf.PID { return libpf.PID(h.p.pid) }
func (h *runtimeHost) Bias() uint64   { return h.st.bias }

func (h *runtimeHost) Memory() (io.ReaderAt, error) { return h.m.processMem(h.p) }

func (h *runtimeHost) Libc() (*libc.TSDLayout, error) { return processTSD(h.p) }

func (h *runtimeHost) SetConfig(v any) error {
	if h.st.rt.ID == 0 {
		return fmt.Errorf("runtime %s has no BPF unwinder to configure", h.st.rt.Name)
	}
	if err := h.m.runtimeMaps().SetRuntimeConfig(h.p.pid, h.st.rt.ID, v); err != nil {
		return fmt.Errorf("writing the %s configuration: %w", h.st.rt.Name, err)
	}
	h.st.inBPF = true
	return nil
}

// SetRegions writes the claimed ranges to the mapping trie: code the
// native unwinder knows (no unknown-PC reports), handed to the runtime's
// unwinder where Unwind is set.
func (h *runtimeHost) SetRegions(rs []interpreter.Region) error {
	for _, r := range rs {
		if r.End <= r.Start {
			return fmt.Errorf("region [%#x, %#x) is empty", r.Start, r.End)
		}
		if r.Unwind && h.st.rt.ID == 0 {
			return fmt.Errorf("runtime %s has no BPF unwinder to hand region %#x to", h.st.rt.Name, r.Start)
		}
	}
	if h.st.rt.ID == 0 {
		// A runtime that only names code leaves what another runtime's
		// unwinder claimed to that unwinder (JIT code a runtime unwinds
		// and also lists in a symbol file for other tools).
		rs = slices.DeleteFunc(slices.Clone(rs), func(r interpreter.Region) bool { return h.unwoundByOther(r) })
	}
	if u := h.m.unwind; u != nil {
		for _, r := range h.st.regions {
			u.RemoveRegion(h.p.pid, r.Start)
		}
		for _, r := range rs {
			var id interpreter.ID
			if r.Unwind {
				id = h.st.rt.ID
			}
			u.AddRegion(h.p.pid, r.Start, r.End, uint8(id))
		}
	}
	h.st.regions = append([]interpreter.Region(nil), rs...)
	return nil
}

// unwoundByOther says whether another runtime's unwinder claimed code
// that overlaps r.
func (h *runtimeHost) unwoundByOther(r interpreter.Region) bool {
	for _, st := range h.p.runtimes {
		if st == h.st {
			continue
		}
		for _, o := range st.regions {
			if o.Unwind && o.Start < r.End && r.Start < o.End {
				return true
			}
		}
	}
	return false
}

func (h *runtimeHost) Mappings() []interpreter.Mapping {
	out := make([]interpreter.Mapping, 0, len(h.p.mappings))
	for _, mp := range h.p.mappings {
		out = append(out, hostMapping(&mp.entry))
	}
	return out
}

func (h *runtimeHost) ReadMappings() ([]interpreter.Mapping, error) {
	entries, err := h.m.source.Maps(h.p.pid, proc.AllMappings)
	if err != nil {
		return nil, err
	}
	out := make([]interpreter.Mapping, 0, len(entries))
	for i := range entries {
		out = append(out, hostMapping(&entries[i]))
	}
	return out, nil
}

func hostMapping(e *proc.MapsEntry) interpreter.Mapping {
	return interpreter.Mapping{Start: e.Start, End: e.End, Offset: e.Offset, Path: e.Path,
		Executable: e.Executable, Inaccessible: e.Inaccessible}
}

func (h *runtimeHost) Root() string { return h.m.source.Root(h.p.pid) }

func (h *runtimeHost) NamespacePID() (uint32, error) { return h.m.source.NamespacePID(h.p.pid) }

// processTSD finds the thread-specific data layout of the C library a
// process maps.
func processTSD(p *process) (*libc.TSDLayout, error) {
	var decodeErr error
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.ELF == nil {
			continue
		}
		if mp.file.ELF.TSD != nil {
			return mp.file.ELF.TSD, nil
		}
		if mp.file.ELF.TSDErr != nil {
			decodeErr = fmt.Errorf("%s: %w", mp.entry.Path, mp.file.ELF.TSDErr)
		}
	}
	if decodeErr != nil {
		return nil, decodeErr
	}
	return nil, errors.New("no mapped C library defines pthread_getspecific")
}

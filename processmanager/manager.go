package processmanager

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	"github.com/hostprof/ebpf-profiler/processmanager/golabels"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

// ErrProcessExited says a process went away while we were reading it. It is
// expected (short-lived processes, samples that arrive after the exit) and
// counted rather than logged. It is process.ErrExited, which every read of
// a process returns then.
var ErrProcessExited = proc.ErrExited

// Config configures a Manager. The zero value is usable.
type Config struct {
	// ProcFS and SysFS are where procfs and sysfs are mounted; "/proc" and
	// "/sys" when empty (a containerized daemon may see the host's under
	// another path).
	ProcFS, SysFS string
	// ProcessSource, when set, is what processes are read through instead
	// of procfs at ProcFS: tests fake or count the reads with it.
	ProcessSource proc.Source
	// FileCacheSize bounds how many files' data (file id, build ids,
	// symbols) are cached; 4096 when zero.
	FileCacheSize int
	// MapsRereadInterval is the least time between two reads of one
	// process's maps triggered by unknown addresses; 1s when zero.
	MapsRereadInterval time.Duration
	// Logger receives warnings and debug messages; logrus's standard logger
	// when nil.
	Logger logrus.FieldLogger
	// Unwinding, when set, mirrors process mappings and their files' stack
	// deltas into the native unwinder's BPF maps.
	Unwinding *unwindmaps.Unwinding
	// Correlator, when set, is told of APM agents and counts the samples
	// taken in their traces.
	Correlator *tracecorr.Correlator
	// CRISockets are the container runtime sockets asked for the
	// Kubernetes names of processes' containers (cri.DefaultSockets); none
	// when empty. KubeletRoot is the kubelet's directory
	// (cri.DefaultKubeletRoot), read for them where no socket answers;
	// not when empty.
	CRISockets  []string
	KubeletRoot string
	// Runtimes are the language runtimes looked for in processes
	// (package interpreter's registry, as -tracers selects it); none when
	// empty.
	Runtimes []*interpreter.Runtime
	// CheckInterval is how often a process that is being sampled has its
	// maps re-read and its APM agent's storage pointer looked at again,
	// so that a library it dlopens is found even where no mapping watcher
	// runs and no sample falls in the library's own code; 3s when zero.
	CheckInterval time.Duration
	// Demangle says how native symbol names are shown: simplified (the
	// zero value), full or as mangled.
	Demangle execinfo.DemangleMode
	// DebugDirs are searched for separate debug files (by build id and
	// debug link); DefaultDebugDirs when nil.
	DebugDirs []string
	// DebugInfoBytes bounds the debug information kept open for source
	// lines and inlined frames; DefaultDebugInfoBytes when zero, and
	// negative turns lines off.
	DebugInfoBytes int64
	// DebugInfoInflateDir is where compressed debug sections are
	// inflated, into unlinked files (debuginfo.Options.InflateDir); the
	// heap when empty.
	DebugInfoInflateDir string
	// Debuginfod, when set, fetches debug files that the host lacks; a
	// file asked for is opened again DebuginfodRecheck later (10 s when
	// zero).
	Debuginfod        *debuginfo.Debuginfod
	DebuginfodRecheck time.Duration
}

const (
	defaultFileCacheSize      = 4096
	defaultMapsRereadInterval = time.Second
	defaultCheckInterval      = 3 * time.Second
)

// Manager holds the state of every process seen in a trace and converts raw
// traces. Its methods are safe for concurrent use; in the daemon they are
// called from the Handler's two goroutines (the tracer's event pump
// converts, the lifecycle reads processes) and a timer (Sweep,
// ReloadKernelSymbols, Stats). One mutex guards the state. A new process's
// stat, maps and files are read before it is taken (preread.go); attaching
// runtimes and re-reading maps happen under it.
type Manager struct {
	// source is where processes and the kernel's symbols are read.
	source         proc.Source
	sysFS          string
	rereadInterval time.Duration
	checkInterval  time.Duration
	corr           *tracecorr.Correlator
	// names asks the node's container runtime for containers' Kubernetes
	// names; nil without CRI sockets.
	names     *containerNames
	runtimes  []*interpreter.Runtime
	demangler *execinfo.Demangler
	// lines finds source lines and inlined calls of native frames; nil
	// when Config.DebugInfoBytes turned them off.
	lines *lineSymbolizer
	// linesRetryAt is, during one conversion, the earliest time at which
	// a file's lines that were not ready may be, and linesOpening says a
	// file's lines are being read: appendNativeFrame sets them.
	linesRetryAt time.Time
	linesOpening bool
	// youngProcess, newbornProcess: see quickRereadInterval.
	youngProcess, newbornProcess time.Duration
	log                          logrus.FieldLogger
	now                          func() time.Time
	// afterFunc runs f after d on its own goroutine (time.AfterFunc).
	afterFunc func(d time.Duration, f func())
	// closed is set by Close: timers that fire later do nothing.
	closed bool

	// unwind is nil unless Config.Unwinding is set.
	unwind *unwindmaps.Sync
	// unwinding is Config.Unwinding, when set.
	unwinding unwindmaps.Unwinding

	// self is the daemon's own pid, which PrepareBusy leaves out.
	self uint32

	mu    sync.Mutex
	procs map[uint32]*process
	// prereads are what the lifecycle read of processes it is setting up
	// before it took mu (preread); each is taken by that set-up.
	prereads map[uint32]*preread
	files    *execinfo.Cache
	// byFileID is a mapping of each recently seen file, by the file id
	// BPF puts in frames it resolved itself: it names frames of processes
	// whose mappings were never read (they exited first).
	byFileID *libpf.LRU[uint64, *mapping]
	// exited remembers processes whose exit was reported: samples taken
	// while the kernel tears an exiting process down arrive after the exit
	// event, and must not bring its state back.
	exited *libpf.LRU[uint32, exitedProcess]
	// unread are processes whose exec deferred reading them to their
	// first sample (Unwinding.ReadAtFirstSample); mapping events do not
	// read them either.
	unread *libpf.LRU[uint32, struct{}]
	// tracked, when BPF filters process events, is told of every
	// process added to and removed from procs (Unwinding.Tracked).
	tracked unwindmaps.TrackedProcesses
	kernel  *kernel
	// nextGen numbers process states. A cached conversion is valid only
	// while its pid's state has the generation it was made with; 0 means
	// "never valid".
	nextGen  uint64
	hashBuf  []byte
	counters counters

	warnHiddenKsyms sync.Once
}

// process is what the manager knows about one live process.
type process struct {
	pid uint32
	gen uint64
	// startTime tells a process from a later one with the same pid.
	startTime uint64
	info      *libpf.ProcessInfo
	// mapsRead is set once the maps were read (or found unreadable).
	mapsRead     bool
	lastMapsRead time.Time
	// lastCheck is when checkProcess last ran for it.
	lastCheck time.Time
	// workQueued says its due work was handed to the lifecycle
	// (Manager.settled), which has not done it yet.
	workQueued bool
	// mapsChanging is set when the last read found new mappings: a
	// process that maps libraries (a program starting, an interpreter importing
	// extension modules) usually maps more soon, so its next re-read may
	// come sooner (quickRereadInterval), as for a young process.
	mapsChanging bool
	// leaderComm is the main thread's name in its last sample
	// (execedUnseen).
	leaderComm string
	// seen is when the manager created this state.
	seen time.Time
	// vanished is when a read found the process gone. Its state stays for
	// the samples still queued before its exit event, which forgets it;
	// no more is read from it.
	vanished time.Time
	// mappings are the executable mappings, sorted by start address.
	mappings []*mapping
	// byFile indexes mappings by their file's 64-bit id (the first
	// mapping of each file); nil until findFile needs it, and again
	// whenever mappings change.
	byFile map[uint64]*mapping
	// runtimes are the language runtimes the process runs.
	runtimes []*runtimeState
	// apm is set when the process has an APM agent.
	apm *apmProcess
	// goLabels is set while BPF reads the goroutine labels of the
	// process, a Go program.
	goLabels *golabels.Layout
	// procCtx is set when the process published an OpenTelemetry process
	// context; threadCtxInBPF once BPF reads its threads' contexts.
	procCtx        *processContext
	threadCtxInBPF bool
	threadCtx      support.ThreadCtxProc
	// mem is the process's memory (Source.OpenMemory), opened on first need
	// by the interpreter and APM readers and closed when it is forgotten.
	mem proc.ReadAtCloser
}

// exitedProcess is a process whose exit was reported.
type exitedProcess struct {
	startTime uint64
	info      *libpf.ProcessInfo
}

// maxExitedProcesses bounds how many exits are remembered: more than exit
// in the time the last samples of a process take to arrive.
const maxExitedProcesses = 4096

// mapping is one executable mapping of a process.
type mapping struct {
	entry proc.MapsEntry
	// file is nil for anonymous memory and files we could not read.
	file *execinfo.File
	// unread says its file could not be read: the next read of the maps
	// tries again (the vDSO cannot be read while a process execs, though
	// /proc shows the new image's maps already), and an unknown PC in it
	// asks for one. Not the exec event that follows: reading the maps
	// then, as the process starts, took the re-read a runtime's new code
	// needed a moment later.
	unread bool
	// pf is the mapping frames point to, shared by all of them so the
	// reporter can dedupe by pointer; nil for anonymous memory.
	pf *libpf.Mapping
	// attached says it was handed to the unwinder's maps.
	attached bool
}

// New returns a Manager. It reads the kernel's symbols and build id once;
// a kernel without readable symbols is logged, not fatal: kernel frames
// then stay unsymbolized.
func New(cfg Config) (*Manager, error) {
	m := &Manager{
		source:         cfg.ProcessSource,
		self:           uint32(os.Getpid()),
		sysFS:          cmp.Or(cfg.SysFS, "/sys"),
		rereadInterval: cmp.Or(cfg.MapsRereadInterval, defaultMapsRereadInterval),
		checkInterval:  cmp.Or(cfg.CheckInterval, defaultCheckInterval),
		corr:           cfg.Correlator,
		runtimes:       cfg.Runtimes,
		youngProcess:   youngProcess,
		newbornProcess: newbornProcess,
		log:            cfg.Logger,
		now:            time.Now,
		afterFunc:      func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		procs:          map[uint32]*process{},
		prereads:       map[uint32]*preread{},
		nextGen:        1,
		counters:       counters{runtimeAttached: map[string]uint64{}, runtimeRefusals: map[string]uint64{}},
		demangler:      execinfo.NewDemangler(cfg.Demangle),
	}
	dirs := cfg.DebugDirs
	if dirs == nil {
		dirs = DefaultDebugDirs
	}
	if cfg.DebugInfoBytes >= 0 {
		m.lines = newLineSymbolizer(debuginfo.Options{DebugDirs: dirs, InflateDir: cfg.DebugInfoInflateDir},
			cmp.Or(cfg.DebugInfoBytes, DefaultDebugInfoBytes), cfg.Debuginfod, func() time.Time { return m.now() })
		m.lines.recheck = cmp.Or(cfg.DebuginfodRecheck, defaultDebuginfodRecheck)
	}
	if m.log == nil {
		m.log = logrus.StandardLogger()
	}
	if m.source == nil {
		fs := proc.FS{Mount: cmp.Or(cfg.ProcFS, "/proc")}
		if err := fs.Usable(); err != nil {
			return nil, fmt.Errorf("procfs not usable at %s (mount it or set Config.ProcFS): %w", fs.Mount, err)
		}
		m.source = fs
	}
	m.files = execinfo.NewCache(cmp.Or(cfg.FileCacheSize, defaultFileCacheSize), cfg.Runtimes, dirs, m.log)
	m.byFileID = libpf.NewLRU[uint64, *mapping](cmp.Or(cfg.FileCacheSize, defaultFileCacheSize), 0)
	m.exited = libpf.NewLRU[uint32, exitedProcess](maxExitedProcesses, 0)
	m.unread = libpf.NewLRU[uint32, struct{}](maxExitedProcesses, 0)
	m.kernel = m.loadKernel()
	if len(cfg.CRISockets) > 0 || cfg.KubeletRoot != "" {
		m.names = newContainerNames(cfg.CRISockets, cfg.KubeletRoot, cmp.Or(cfg.ProcFS, "/proc"), m.applyContainerNames)
	}
	if u := cfg.Unwinding; u != nil {
		m.unwinding = *u
		m.unwind = unwindmaps.New(*u, m.log)
		if u.Tracked != nil && u.ReadAtFirstSample {
			if err := u.Tracked.FilterProcessEvents(); err != nil {
				m.log.Warnf("Process events of every process are sent (filtering them: %v)", err)
			} else {
				m.tracked = u.Tracked
			}
		}
	}
	return m, nil
}

// Close stops the background loading of stack deltas.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	if m.lines != nil {
		m.lines.close()
	}
	m.mu.Unlock()
	if m.names != nil {
		m.names.close()
	}
	if m.unwind != nil {
		m.unwind.Close()
	}
}

// forget drops a process's state (and its BPF mappings). The caller holds
// m.mu.
func (m *Manager) forget(pid uint32) {
	if p, ok := m.procs[pid]; ok {
		m.dropRuntimes(p)
		m.dropAPM(p)
		m.dropGoProgram(p)
		m.dropThreadContext(p)
		if p.mem != nil {
			p.mem.Close()
		}
		if m.tracked != nil && pid != 0 {
			m.tracked.UntrackProcess(pid)
		}
	}
	delete(m.procs, pid)
	if m.unwind != nil {
		m.unwind.Forget(pid)
	}
}

// DropMappedDebugInfo drops the resident pages of the mapped debug
// information (they stay in the page cache): the pages lookups touched once
// otherwise stay in the daemon's resident set while their file is open.
func (m *Manager) DropMappedDebugInfo() {
	if m.lines != nil {
		m.lines.dropResident()
	}
}

// ReloadKernelSymbols re-reads /proc/kallsyms, e.g. after modules were
// loaded. Traces converted earlier keep the old names. An unchanged table
// is kept: the names of cached and held traces are substrings of its names,
// and a new table beside them would be megabytes more at every reload.
func (m *Manager) ReloadKernelSymbols() {
	syms, err := loadKallsyms(m.source)
	m.mu.Lock()
	same := err == nil && m.kernel != nil && m.kernel.syms.digest == syms.digest
	m.mu.Unlock()
	if same {
		return
	}
	k := m.kernelOf(syms, err)
	m.mu.Lock()
	m.kernel = k
	m.mu.Unlock()
}

func (m *Manager) loadKernel() *kernel {
	syms, err := loadKallsyms(m.source)
	return m.kernelOf(syms, err)
}

// kernelOf makes the kernel symbolizer of a table read (or of none, when
// err says why).
func (m *Manager) kernelOf(syms *kallsyms, err error) *kernel {
	if err != nil {
		m.log.WithError(err).Warn("kernel frames will not be symbolized")
		syms = &kallsyms{modules: []moduleRange{{name: vmlinuxName}}}
	}
	if syms.hidden {
		m.warnHiddenKsyms.Do(func() {
			m.log.Warn("/proc/kallsyms shows only zero addresses (kernel.kptr_restrict hides them): " +
				"kernel frames will not be symbolized; run as root with CAP_SYSLOG or set " +
				"sysctl kernel.kptr_restrict=0")
		})
	}
	k, err := newKernel(m.sysFS, syms)
	if err != nil {
		m.log.WithError(err).Warn("kernel frames will have no file id")
	}
	return k
}

// RefreshMappings reads a process's mappings now if it is new, or re-reads
// them if the rate limit allows, so that its code is mapped for BPF before
// its next samples; and retries (paced) attaching its runtimes where that
// failed.
func (m *Manager) RefreshMappings(pid libpf.PID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.processFor(uint32(pid), "")
	if !m.live(p) {
		return
	}
	if !p.mapsRead {
		m.ensureMaps(p)
	} else {
		m.rereadMaps(p)
	}
	// BPF also asks when a runtime it was not told of runs.
	m.refreshRuntimes(p)
	if p.apm != nil {
		m.readAPMAgent(p)
	}
}

// UnknownPC handles BPF's report that pc of pid lies in no mapping it has
// loaded. A pc in a mapping the manager knows needs no read of the
// process's maps: the mapping is handed to the unwinder if it was not (a
// process over MaxEagerMappings, a full queue), or is on its way. Else the
// maps are read as RefreshMappings does.
func (m *Manager) UnknownPC(pid libpf.PID, pc uint64) {
	if pc != 0 && m.attachKnown(uint32(pid), pc) {
		return
	}
	m.RefreshMappings(pid)
}

// attachKnown hands the mapping of pc to the unwinder and reports true if
// pid's state knows one with a file.
func (m *Manager) attachKnown(pid uint32, pc uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.procs[pid]
	if !ok || !p.mapsRead || !m.live(p) || m.unwind == nil {
		return false
	}
	mp := p.findMapping(pc)
	if mp == nil || mp.pf == nil || mp.unread {
		return false // an unread file is read again with the maps
	}
	m.attachMapping(pid, mp)
	return true
}

// Tracks reports whether the manager holds state for pid.
func (m *Manager) Tracks(pid libpf.PID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.procs[uint32(pid)]
	return ok
}

// ProcessExited forgets a process. Traces converted for it stop being
// served from the Handler's cache even if the pid is reused. Call it on exec
// too: the new program's code may sit where the old one's mappings were.
func (m *Manager) ProcessExited(pid libpf.PID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[uint32(pid)]; ok {
		m.exited.Add(p.pid, exitedProcess{startTime: p.startTime, info: p.info}, 0)
		m.forget(uint32(pid))
		m.counters.processesExited++
	} else if _, ok := m.unread.Get(uint32(pid)); ok {
		// Exec'd and never sampled: nothing to forget, and nothing read
		// (a late sample of it finds it a zombie or gone).
		m.unread.Remove(uint32(pid))
	} else if st, err := m.source.Stat(uint32(pid)); err == nil {
		// Never sampled yet; its last samples may still come.
		m.exited.Add(uint32(pid), exitedProcess{startTime: st.StartTime}, 0)
	}
}

// Sweep forgets processes that are gone or whose pid now belongs to another
// process, for exits whose event was lost. Call it from a timer; it returns
// how many processes it forgot.
func (m *Manager) Sweep() int {
	type tracked struct {
		p         *process
		startTime uint64
	}
	m.mu.Lock()
	all := make([]tracked, 0, len(m.procs))
	for _, p := range m.procs {
		if p.pid != 0 {
			all = append(all, tracked{p, p.startTime})
		}
	}
	m.mu.Unlock()

	// Read /proc without the lock: thousands of processes take a while.
	var gone []*process
	for _, t := range all {
		st, err := m.source.Stat(t.p.pid)
		if errors.Is(err, ErrProcessExited) || (err == nil && st.StartTime != t.startTime) {
			gone = append(gone, t.p)
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, p := range gone {
		if m.procs[p.pid] == p {
			m.forget(p.pid)
			m.counters.processesExited++
			n++
		}
	}
	return n
}

// sampled is a sample's lifecycle work, done before its trace is
// converted (or found converted): the pid's state is created on first
// sight and its mappings read for a trace with user frames; runtimes and
// the APM agent that wait are retried (paced), and checkProcess runs when
// it is due, so a process only gets it while it runs. It returns the
// state the trace belongs to and its generation, 0 if it is not kept.
func (m *Manager) sampled(raw *support.Trace) (*process, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.processFor(raw.PID, raw.Comm)
	if m.procs[p.pid] == p && raw.TID == raw.PID && m.execedUnseen(p, raw.Comm) {
		m.counters.execsFoundBySample++
		m.forget(p.pid)
		m.counters.processesExited++
		p = m.processFor(raw.PID, raw.Comm)
		p.leaderComm = raw.Comm
	}
	if m.procs[p.pid] != p {
		return p, 0
	}
	if !p.mapsRead {
		if len(raw.Frames) > 0 && m.live(p) {
			m.ensureMaps(p)
		}
		// Its first check is due at its next sample.
		m.dueWork(p, false)
	} else {
		m.dueWork(p, true)
	}
	return p, p.gen
}

// dueWork retries attaching the runtimes and the APM agent that wait
// (paced by their backoff) and, with check, checks the process if that is
// due. The caller holds m.mu.
func (m *Manager) dueWork(p *process, check bool) {
	p.workQueued = false
	if !m.live(p) || !p.mapsRead {
		return
	}
	if now := m.now(); check && now.Sub(p.lastCheck) >= m.checkIntervalOf(p) {
		p.lastCheck = now
		m.checkProcess(p)
		if !m.live(p) {
			return // a read found it gone
		}
	}
	m.refreshRuntimes(p)
	if p.apm.pending() {
		m.readAPMAgent(p) // paced by its backoff
	}
}

// refresh does the due work of pid's process (dueWork), if it still has
// state.
func (m *Manager) refresh(pid uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[pid]; ok {
		m.dueWork(p, true)
	}
}

// settled returns the state a trace is converted with without reading
// anything: ready is false when the trace needs its process read first
// (sampled): the first sample of a pid, the first with user frames, or a
// main thread's new name that may be an exec. due says the process has
// work due (dueWork) that no trace waits for; it is said once until done.
func (m *Manager) settled(raw *support.Trace) (p *process, gen uint64, ready, due bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.procs[raw.PID]
	switch {
	case !ok, !p.vanished.IsZero() && m.now().Sub(p.vanished) >= vanishedGrace:
		return nil, 0, false, false
	case raw.TID == raw.PID && p.leaderComm != raw.Comm:
		if p.leaderComm != "" && p.info != nil && m.live(p) {
			return nil, 0, false, false // execedUnseen reads its executable's name
		}
		p.leaderComm = raw.Comm
	}
	if !m.live(p) {
		return p, p.gen, true, false
	}
	if !p.mapsRead {
		if len(raw.Frames) > 0 {
			return nil, 0, false, false
		}
		return p, p.gen, true, false
	}
	if m.runtimeWorkDue(p) {
		// A runtime attaches or looks again (paced) before the trace is
		// converted: it may name code the trace ran.
		return nil, 0, false, false
	}
	if !p.workQueued && (m.now().Sub(p.lastCheck) >= m.checkIntervalOf(p) || p.apm.pending()) {
		p.workQueued = true
		due = true
	}
	return p, p.gen, true, due
}

// rereadDue says whether a conversion of p that met an address outside
// every known mapping may have p's maps read again (rereadMaps' limit).
func (m *Manager) rereadDue(p *process) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live(p) && m.now().Sub(p.lastMapsRead) >= m.rereadWait(p)
}

// execedUnseen says whether a process exec'd while its state is still of
// the image before. The exec event comes after the exec: samples taken
// during it (the main thread already has the new name, the old state's
// info would be paired with it) are handled before the event, and a lost
// event leaves the state stale until the next check. The main thread's name
// (an exec leaves only that thread) changing is the cue; a rename by the
// program itself costs one readlink.
func (m *Manager) execedUnseen(p *process, comm string) bool {
	if p.leaderComm == comm {
		return false
	}
	known := p.leaderComm
	p.leaderComm = comm
	if known == "" || p.info == nil || !m.live(p) {
		return false
	}
	exe, err := m.source.Executable(p.pid)
	return err == nil && exe != p.info.ExecutablePath
}

// checkProcess looks for what a process may have changed without telling:
// mappings no sample or mapping event revealed, and a new APM process
// storage. The caller holds m.mu.
func (m *Manager) checkProcess(p *process) {
	m.counters.processChecks++
	m.rereadMaps(p)
	if !m.live(p) {
		return
	}
	for _, st := range p.runtimes {
		if st.proc != nil {
			m.updateRuntime(p, st)
		}
	}
	if p.apm != nil {
		m.recheckAPMAgent(p)
	}
}

// checkIntervalOf is how often a sampled process is checked: its maps are
// read each time, so a process with a huge mapping table is checked less
// often, in proportion (at most every maxCheckInterval).
func (m *Manager) checkIntervalOf(p *process) time.Duration {
	if n := len(p.mappings); n > MaxEagerMappings {
		return min(m.checkInterval*time.Duration(n/MaxEagerMappings+1), max(maxCheckInterval, m.checkInterval))
	}
	if m.now().Sub(p.seen) < m.youngProcess {
		// A process first read while its loader still ran publishes
		// what it publishes (an OpenTelemetry process context) after:
		// found within youngCheckInterval.
		return min(m.checkInterval, youngCheckInterval)
	}
	return m.checkInterval
}

// youngCheckInterval is how often a process is checked in its first
// youngProcess.
const youngCheckInterval = time.Second

// maxCheckInterval bounds checkIntervalOf.
const maxCheckInterval = time.Minute

func (m *Manager) newGeneration() uint64 {
	g := m.nextGen
	m.nextGen++
	return g
}

// processFor returns the state of pid, creating it on first sight. A
// process that cannot be read (it already exited) gets a state that is used
// for this trace only and not kept.
func (m *Manager) processFor(pid uint32, comm string) *process {
	if p, ok := m.procs[pid]; ok {
		if p.vanished.IsZero() || m.now().Sub(p.vanished) < vanishedGrace {
			return p
		}
		// Its exit event was lost and Sweep has not run: the pid may
		// be another process's by now.
		m.forget(pid)
	}
	p := &process{pid: pid, gen: m.newGeneration(), seen: m.now()}
	if pid == 0 {
		// The idle task: kernel frames only, and no /proc/0.
		p.info = &libpf.ProcessInfo{PID: 0, ExecutableName: "swapper"}
		p.mapsRead = true
		m.procs[pid] = p
		return p
	}
	pre := m.prereads[pid]
	var st proc.Stat
	var err error
	if pre != nil && pre.info != nil {
		st, err = pre.stat, pre.statErr
	} else {
		st, err = m.source.Stat(pid)
	}
	if e, ok := m.exited.Get(pid); ok && e.info != nil && errors.Is(err, ErrProcessExited) {
		// A sample of the process's exit, converted after it was reaped.
		p.info, p.mapsRead = e.info, true
		return p
	}
	if err != nil {
		m.procError(pid, err)
		p.info = &libpf.ProcessInfo{PID: libpf.PID(pid), ExecutableName: comm}
		p.mapsRead = true
		return p
	}
	if e, ok := m.exited.Get(pid); ok && e.startTime == st.StartTime {
		// A sample of the process's exit: it gets no state again.
		p.info = cmp.Or(e.info, &libpf.ProcessInfo{PID: libpf.PID(pid), ExecutableName: comm})
		p.mapsRead = true
		return p
	}
	if m.tracked != nil {
		// Before anything of the image is read: an exec from here on is
		// reported.
		m.tracked.TrackProcess(pid)
	}
	p.startTime = st.StartTime
	if pre != nil && pre.info != nil {
		p.info, pre.info = pre.info, nil
	} else {
		p.info = m.source.Info(pid, comm)
	}
	m.nameContainer(p)
	m.procs[pid] = p
	m.unread.Remove(pid)
	m.counters.processesSeen++
	return p
}

// vanishedGrace is how long the state of a process that a read found gone
// is kept without its exit event: samples wait in the ring buffer for up
// to the tracer's poll interval (1 s) and are converted after the process
// was reaped, and its JIT code is named only from that state.
const vanishedGrace = 5 * time.Second

// procError counts a failure to read a process. A process that exited is
// marked vanished: its exit event or Sweep forgets it. One that still
// runs lost a mapping while it was read: its state is dropped and read
// anew.
func (m *Manager) procError(pid uint32, err error) {
	if errors.Is(err, ErrProcessExited) {
		p, ok := m.procs[pid]
		if ok && !p.vanished.IsZero() {
			return
		}
		m.counters.processesVanished++
		if !ok {
			return
		}
		if st, err := m.source.Stat(pid); err == nil && st.StartTime == p.startTime {
			// It runs: what went was one of its mappings (the dynamic
			// loader maps and unmaps while it starts). Its state is
			// read anew on its next sample.
			m.forget(pid)
			return
		}
		p.vanished = m.now()
		return
	}
	m.counters.procErrors++
	m.log.WithError(err).Debugf("reading process %d", pid)
}

// live says whether p is its pid's state and no read found the process
// gone: only then is anything read from it.
func (m *Manager) live(p *process) bool {
	return m.procs[p.pid] == p && p.vanished.IsZero()
}

// ensureMaps reads a process's mappings on first need.
func (m *Manager) ensureMaps(p *process) {
	if p.mapsRead {
		return
	}
	if _, err := m.loadMaps(p); err != nil {
		m.procError(p.pid, err)
	}
}

// rereadMaps re-reads the mappings of a process after an address missed
// them all, at most once per rereadInterval (quickRereadInterval after a
// read that found new mappings). It reports whether they changed.
func (m *Manager) rereadMaps(p *process) bool {
	if !m.live(p) {
		return false
	}
	if m.now().Sub(p.lastMapsRead) < m.rereadWait(p) {
		m.counters.mapsRereadsLimited++
		return false
	}
	changed, err := m.loadMaps(p)
	if err != nil {
		m.procError(p.pid, err)
		return false
	}
	p.mapsChanging = changed
	if changed {
		// Cached conversions may name mappings that are gone, or leave
		// addresses unmapped that are now known.
		p.gen = m.newGeneration()
		// Attached runtimes look again (Updater): the new mappings
		// may be their code.
		for _, st := range p.runtimes {
			if st.proc != nil {
				st.missed = true
			}
		}
	}
	return changed
}

// processMem returns the process's memory, opening it on first need. Only
// tracked processes keep it open: forget closes it.
func (m *Manager) processMem(p *process) (proc.ReadAtCloser, error) {
	if !m.live(p) {
		return nil, fmt.Errorf("process %d: %w", p.pid, ErrProcessExited)
	}
	if p.mem == nil {
		mem, err := m.source.OpenMemory(p.pid)
		if err != nil {
			return nil, err
		}
		p.mem = mem
	}
	return p.mem, nil
}

// quickRereadInterval is the least time between two re-reads of the maps
// of a process whose last read found new mappings, or that the manager
// has known for less than youngProcess; newbornRereadInterval that during
// the first newbornProcess, while the dynamic loader maps its libraries.
// Where BPF cannot watch new mappings (no fexit or kprobes) only these
// re-reads find them, and a process that lives 20 ms would otherwise be
// unwound only as far as the mappings it had at exec.
const (
	quickRereadInterval   = 100 * time.Millisecond
	youngProcess          = 5 * time.Second
	newbornRereadInterval = 5 * time.Millisecond
	newbornProcess        = 200 * time.Millisecond
)

// rereadWait is the least time from a process's last maps read to the next.
func (m *Manager) rereadWait(p *process) time.Duration {
	age := m.now().Sub(p.seen)
	switch {
	case age < m.newbornProcess:
		return min(newbornRereadInterval, m.rereadInterval)
	case p.mapsChanging || age < m.youngProcess:
		return min(quickRereadInterval, m.rereadInterval)
	}
	return m.rereadInterval
}

// loadMaps (re-)reads a process's executable mappings. Mappings that did not
// change keep their state and their *libpf.Mapping.
func (m *Manager) loadMaps(p *process) (changed bool, err error) {
	p.mapsRead = true
	p.lastMapsRead = m.now()
	m.counters.mapsReads++
	var entries []proc.MapsEntry
	if pre := m.prereads[p.pid]; pre != nil && pre.mapsRead {
		entries, err, pre.mapsRead = pre.maps, pre.mapsErr, false
	} else {
		entries, err = m.source.Maps(p.pid, proc.ExecutableMappings)
	}
	if err != nil {
		return false, err
	}
	if len(entries) == 0 {
		// A zombie's maps are empty: it keeps the mappings it had
		// for the samples still queued.
		if _, err := m.source.Stat(p.pid); err != nil {
			return false, err
		}
	}
	entries, ctxAddr := splitContextMapping(entries)
	defer m.readProcessContext(p, ctxAddr)
	slices.SortFunc(entries, func(a, b proc.MapsEntry) int { return cmp.Compare(a.Start, b.Start) })

	old := p.mappings
	fresh := make([]*mapping, 0, len(entries))
	changed = len(old) != len(entries)
	// One open per file, however often it is mapped: a process may map
	// one file thousands of times. A preread opened them already.
	files := map[[2]uint64]*execinfo.File{}
	if pre := m.prereads[p.pid]; pre != nil {
		maps.Copy(files, pre.files)
	}
	j := 0
	for i := range entries {
		e := &entries[i]
		for j < len(old) && old[j].entry.Start < e.Start {
			j++
		}
		same := j < len(old) && old[j].entry.SameAs(e)
		if same && !old[j].unread {
			fresh = append(fresh, old[j])
			continue
		}
		mp, err := m.newMapping(p.pid, e, files)
		if err != nil {
			return false, err
		}
		if !same || !mp.unread {
			changed = true
		}
		fresh = append(fresh, mp)
	}
	if m.unwind != nil && changed {
		m.syncUnwind(p.pid, old, fresh)
	}
	p.mappings, p.byFile = fresh, nil
	if changed {
		m.findRuntimes(p)
		m.findAPMAgent(p)
		m.findGoProgram(p)
	}
	return changed, nil
}

// MaxEagerMappings bounds the executable mappings of one process
// that are handed to the unwinder's maps when its maps are read. Beyond it
// (a process with thousands of libraries, or a hostile process
// mapping one file 15,000 times), a mapping is handed over when a sample
// or an unknown-PC report first falls in it: the work follows the code
// that runs, not the size of the mapping table.
const MaxEagerMappings = 1024

// syncUnwind tells the unwinder maps which mappings went and came.
func (m *Manager) syncUnwind(pid uint32, old, fresh []*mapping) {
	kept := make(map[*mapping]bool, len(fresh))
	for _, mp := range fresh {
		kept[mp] = true
	}
	for _, mp := range old {
		if !kept[mp] && mp.attached {
			m.unwind.Detach(pid, mp.entry.Start)
		}
	}
	was := make(map[*mapping]bool, len(old))
	for _, mp := range old {
		was[mp] = true
	}
	lazy := len(fresh) > MaxEagerMappings
	for _, mp := range fresh {
		switch {
		case was[mp]:
		case lazy:
			m.counters.mappingsDeferred++
		default:
			m.attachMapping(pid, mp)
		}
	}
}

// attachMapping hands a mapping to the unwinder's maps, unless it has no
// file to unwind with or the queue is full (counted; the next sample in it
// tries again).
func (m *Manager) attachMapping(pid uint32, mp *mapping) {
	if mp.attached {
		return
	}
	if um, ok := unwindMapping(pid, mp, m.source); ok && m.unwind.Attach(um) {
		mp.attached = true
	}
}

// unwindMapping describes a mapping for the unwinder's maps; a mapping
// without a file to unwind with has nothing to describe.
func unwindMapping(pid uint32, mp *mapping, src proc.Source) (unwindmaps.Mapping, bool) {
	if mp.pf == nil || mp.pf.FileID.IsZero() || mp.file == nil || mp.file.ELF == nil {
		return unwindmaps.Mapping{}, false
	}
	e := mp.entry
	um := unwindmaps.Mapping{
		PID: pid, Start: e.Start, End: e.End, Bias: mp.pf.Bias, ID: mp.pf.FileID,
		Open: func() (unwindmaps.File, error) { return proc.OpenImage(src, pid, &e) },
		Path: e.Path, Size: mp.file.Size,
	}
	if e.IsFile() {
		um.Known, um.HasKey = mp.file.ELF.KnownFile()
		um.Key = support.NewFileKey(e.Dev, e.Inode)
	}
	for _, rm := range mp.file.ELF.Runtimes {
		if rm.Runtime.ID == 0 || rm.Binary.Unsupported() != nil {
			continue // no unwinder, or never attached: nothing to hand over
		}
		for _, r := range rm.Binary.CodeRanges() {
			if !rm.Runtime.CodeRangesAtPC {
				um.RuntimeCode = append(um.RuntimeCode, unwindmaps.CodeRange{Start: r[0], End: r[1], Runtime: uint8(rm.Runtime.ID)})
				continue
			}
			// Where this mapping maps the range, in process addresses.
			start, end := max(r[0]+mp.pf.Bias, e.Start), min(r[1]+mp.pf.Bias, e.End)
			if start < end {
				um.AtPC = append(um.AtPC, unwindmaps.CodeRange{Start: start, End: end, Runtime: uint8(rm.Runtime.ID)})
			}
		}
	}
	return um, true
}

// vdsoReadKey is the vDSO's entry in newMapping's files already read.
var vdsoReadKey = [2]uint64{^uint64(0), ^uint64(0)}

// newMapping builds the state of one mapping, reading its file through the
// file cache unless read (by device and inode) has it. Only a process exit
// is an error: a file that cannot be read still gives a mapping, just
// without a file id.
func (m *Manager) newMapping(pid uint32, e *proc.MapsEntry, read map[[2]uint64]*execinfo.File) (*mapping, error) {
	mp := &mapping{entry: *e}
	var err error
	switch {
	case e.IsFile() && read[[2]uint64{e.Dev, e.Inode}] != nil:
		mp.file = read[[2]uint64{e.Dev, e.Inode}]
	case e.IsFile():
		mp.file, err = m.files.ForMapping(m.source, pid, e)
		if mp.file != nil && read != nil {
			read[[2]uint64{e.Dev, e.Inode}] = mp.file
		}
	case e.IsVDSO() && read[vdsoReadKey] != nil:
		mp.file = read[vdsoReadKey]
	case e.IsVDSO():
		mp.file, err = m.files.VDSOForMapping(m.source, pid, e)
	default:
		return mp, nil
	}
	if errors.Is(err, ErrProcessExited) {
		return nil, err
	}
	if err != nil {
		m.counters.fileErrors++
		mp.unread = true
		m.log.WithError(err).Debugf("process %d: mapping %s", pid, e.Path)
	}
	mp.pf = &libpf.Mapping{
		Start: e.Start, End: e.End, FileOffset: e.Offset,
		// Without ELF segments, frames are reported as file offsets.
		Bias: e.Start - e.Offset,
		Path: e.Path,
	}
	if mp.file == nil {
		return mp, nil
	}
	mp.pf.FileID = mp.file.ID
	m.byFileID.Add(mp.file.ID.Low64(), mp, 0)
	if d := mp.file.ELF; d != nil {
		mp.pf.GNUBuildID, mp.pf.GoBuildID = d.GNUBuildID, d.GoBuildID
		if bias, ok := d.Bias(e.Start, e.Offset); ok {
			mp.pf.Bias = bias
		}
	}
	return mp, nil
}

// findMapping returns the mapping containing addr.
func (p *process) findMapping(addr uint64) *mapping {
	i, found := slices.BinarySearchFunc(p.mappings, addr, func(mp *mapping, a uint64) int {
		return cmp.Compare(mp.entry.Start, a)
	})
	if !found {
		i--
	}
	if i < 0 || addr >= p.mappings[i].entry.End {
		return nil
	}
	return p.mappings[i]
}

// findFile returns the mapping of the file whose 64-bit truncated id BPF
// reported.
func (p *process) findFile(low64 uint64) *mapping {
	if p.byFile == nil {
		p.byFile = map[uint64]*mapping{}
		for _, mp := range p.mappings {
			if mp.file != nil {
				if _, ok := p.byFile[mp.file.ID.Low64()]; !ok {
					p.byFile[mp.file.ID.Low64()] = mp
				}
			}
		}
	}
	return p.byFile[low64]
}

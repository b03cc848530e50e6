package processmanager

import (
	"maps"

	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
)

// Stats are the counters of a Manager and of the Handler in front of it.
// Counts are totals since start; sizes are current.
type Stats struct {
	// Handler.
	TracesReceived   uint64
	TraceCacheHits   uint64
	TraceCacheMisses uint64
	TraceCacheSize   int
	ConversionErrors uint64
	// Lifecycle is what the lifecycle goroutine was handed.
	Lifecycle LifecycleStats

	// Manager.
	TracesConverted uint64
	TruncatedTraces uint64
	// UnmappedFrames are user frames not attributed to a file: outside
	// every mapping or in anonymous memory (JIT code).
	UnmappedFrames   uint64
	ProcessesTracked int
	// ProcessesSeen counts processes whose state was created.
	ProcessesSeen uint64
	// ProcessesExited counts states freed by ProcessExited or Sweep.
	ProcessesExited uint64
	// ProcessesVanished counts processes that exited while being read.
	ProcessesVanished uint64
	// ProcessReadErrors counts other failures to read /proc/PID.
	ProcessReadErrors uint64
	MapsReads         uint64
	// MappingsAdded counts executable mappings added as BPF reported them.
	MappingsAdded uint64
	// RuntimeProcesses are tracked processes per runtime (by name) that
	// run it, RuntimeAttached the processes each attached to so far;
	// RuntimeConfigs are the processes whose configuration is in the
	// runtimes' BPF map. InterpreterErrors counts files a runtime found
	// its own but could not read, runtimes found in a process but not
	// supported (a version without struct offsets) and failed attempts to
	// attach one (not counting waits for the runtime to start).
	// RuntimeFrameErrors counts runtime frames that could not be
	// symbolized.
	RuntimeProcesses   map[string]int
	RuntimeAttached    map[string]uint64
	RuntimeConfigs     int
	InterpreterErrors  uint64
	RuntimeFrameErrors uint64
	// RuntimeRefusals counts processes a runtime refused for good, by
	// runtime and reason ("<runtime>/<reason>").
	RuntimeRefusals map[string]uint64
	// APMAgents counts APM agent libraries found in processes; APMErrors
	// failed reads of one (not counting waits for the agent to publish).
	APMAgents, APMErrors uint64
	// GoPrograms counts Go programs whose goroutine labels BPF was told
	// to read; GoLabelErrors the writes of that which failed.
	GoPrograms, GoLabelErrors uint64
	// ContainersNamed counts containers the runtime named; CRIErrors the
	// questions that failed for another reason than no runtime or a
	// container it does not run.
	ContainersNamed, CRIErrors uint64
	// ProcessContexts counts OpenTelemetry process contexts read (each
	// publication once); ProcessContextErrors those that could not be.
	ProcessContexts, ProcessContextErrors uint64
	// ThreadContexts counts processes whose threads' OpenTelemetry
	// contexts BPF was told to read; ThreadContextErrors those it could
	// not be told of.
	ThreadContexts, ThreadContextErrors uint64
	// UnknownAttributeKeys counts thread context attributes left out: the
	// process's key table lacked their index.
	UnknownAttributeKeys uint64
	// ProcessChecks counts periodic checks of sampled processes.
	ProcessChecks uint64
	// StaleExecs counts exec events handled after the new image's state
	// was already read, which left the state as it was.
	StaleExecs uint64
	// ExecsFoundBySample counts execs a sample revealed before their
	// event was handled, or without one (see execedUnseen).
	ExecsFoundBySample uint64
	// ExecsDeferred counts execs of known programs whose process is read
	// at its first sample rather than at once (Unwinding.ReadAtFirstSample).
	ExecsDeferred uint64
	// DemangleFailures counts symbol names that looked mangled but did
	// not demangle (they are shown as they are).
	DemangleFailures uint64
	// DebugFilesOpened counts files whose debug information was opened
	// for source lines, by where it was found ("file", "build-id",
	// "debuglink", "pclntab"); DebugFilesMissing files that had none,
	// DebugFileErrors files whose information could not be read,
	// DebugFilesEvicted files closed to stay within the bound of
	// DebugInfoBytes (now held: DebugInfoBytesHeld); LineLookupErrors
	// addresses whose lookup failed.
	// Native counts the native frames of converted traces and what
	// they were given (names, source lines, inlined frames).
	Native             NativeFrameCounts
	DebugFilesOpened   map[string]uint64
	DebugFilesMissing  uint64
	DebugFileErrors    uint64
	DebugFilesEvicted  uint64
	DebugInfoBytesHeld int64
	LineLookupErrors   uint64
	// MapsRereadsLimited counts re-reads skipped by the rate limit.
	MapsRereadsLimited uint64
	FileCacheSize      int
	FileCacheHits      uint64
	FileCacheMisses    uint64
	// FileErrors counts mapped files that could not be opened.
	FileErrors uint64
	// ELFErrors counts files that looked like ELF but did not parse.
	ELFErrors     uint64
	KernelSymbols int

	// Stack deltas (with Config.Unwinding).
	// DeltaFilesLoaded counts files whose deltas were extracted and loaded.
	DeltaFilesLoaded uint64
	// DeltaExtractErrors counts files whose unwind information did not parse.
	DeltaExtractErrors uint64
	// DeltaLoadErrors counts mappings left to frame pointers: extraction or
	// map errors, a full pool or rule table.
	DeltaLoadErrors uint64
	// DeltaMappingsDropped counts mappings not queued: the queue was full.
	DeltaMappingsDropped uint64
	// DeltaMappingsDeferred counts mappings of processes with more than
	// MaxEagerMappings executable mappings that were not handed to the
	// unwinder when read, but only if a sample falls in them.
	DeltaMappingsDeferred uint64
	// DeltasResident is what the maps hold now.
	DeltasResident unwindmaps.DeltaResidency
	// DeltaCache is what the on-disk delta cache did (zero without one).
	DeltaCache unwindmaps.DeltaCacheStats
	// UnwindQueue is how many mapping changes wait for the delta loader.
	UnwindQueue int
}

// counters are the Manager's mutable counts, guarded by its mutex.
type counters struct {
	tracesConverted      uint64
	truncatedTraces      uint64
	unmappedFrames       uint64
	processesSeen        uint64
	processesExited      uint64
	processesVanished    uint64
	procErrors           uint64
	mapsReads            uint64
	mapsRereadsLimited   uint64
	fileErrors           uint64
	mappingsAdded        uint64
	interpreterErrors    uint64
	runtimeAttached      map[string]uint64
	runtimeFrameErrors   uint64
	runtimeRefusals      map[string]uint64
	apmAgents            uint64
	apmErrors            uint64
	goPrograms           uint64
	goLabelErrors        uint64
	containersNamed      uint64
	criErrors            uint64
	processContexts      uint64
	processContextErrors uint64
	threadContexts       uint64
	threadContextErrors  uint64
	processChecks        uint64
	staleExecs           uint64
	execsDeferred        uint64
	execsFoundBySample   uint64
	mappingsDeferred     uint64
	native               NativeFrameCounts
}

// Stats returns the Manager's counters; the Handler fields are zero.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &m.counters
	fc := m.files.Stats()
	st := Stats{
		TracesConverted:       c.tracesConverted,
		TruncatedTraces:       c.truncatedTraces,
		UnmappedFrames:        c.unmappedFrames,
		ProcessesTracked:      len(m.procs),
		ProcessesSeen:         c.processesSeen,
		ProcessesExited:       c.processesExited,
		ProcessesVanished:     c.processesVanished,
		ProcessReadErrors:     c.procErrors,
		MapsReads:             c.mapsReads,
		MapsRereadsLimited:    c.mapsRereadsLimited,
		MappingsAdded:         c.mappingsAdded,
		InterpreterErrors:     c.interpreterErrors + fc.RuntimeErrors,
		RuntimeAttached:       maps.Clone(c.runtimeAttached),
		RuntimeFrameErrors:    c.runtimeFrameErrors,
		RuntimeRefusals:       maps.Clone(c.runtimeRefusals),
		RuntimeProcesses:      map[string]int{},
		APMAgents:             c.apmAgents,
		APMErrors:             c.apmErrors,
		GoPrograms:            c.goPrograms,
		GoLabelErrors:         c.goLabelErrors,
		ContainersNamed:       c.containersNamed,
		CRIErrors:             c.criErrors,
		ProcessContexts:       c.processContexts,
		ProcessContextErrors:  c.processContextErrors,
		ThreadContexts:        c.threadContexts,
		ThreadContextErrors:   c.threadContextErrors,
		ProcessChecks:         c.processChecks,
		DemangleFailures:      m.demangler.Failures(),
		StaleExecs:            c.staleExecs,
		ExecsDeferred:         c.execsDeferred,
		ExecsFoundBySample:    c.execsFoundBySample,
		DeltaMappingsDeferred: c.mappingsDeferred,
		Native:                c.native,
		FileCacheSize:         fc.Size,
		FileCacheHits:         fc.Hits,
		FileCacheMisses:       fc.Misses,
		FileErrors:            c.fileErrors,
		ELFErrors:             fc.ELFErrors,
		KernelSymbols:         len(m.kernel.syms.syms),
	}
	if l := m.lines; l != nil {
		l.mu.Lock()
		defer l.mu.Unlock()
		st.DebugFilesOpened = maps.Clone(l.stats.filesOpened)
		st.DebugFilesMissing = l.stats.filesMissing
		st.DebugFileErrors = l.stats.fileErrors
		st.DebugFilesEvicted = l.stats.evicted
		st.DebugInfoBytesHeld = l.bytes
		st.LineLookupErrors = l.stats.lookupErrors
	}
	for _, p := range m.procs {
		for _, rs := range p.runtimes {
			if rs.bin != nil || rs.proc != nil {
				st.RuntimeProcesses[rs.rt.Name]++
			}
			if rs.inBPF {
				st.RuntimeConfigs++
			}
		}
	}
	if u := m.unwind; u != nil {
		us := u.Stats()
		st.DeltaFilesLoaded = us.FilesLoaded
		st.DeltaExtractErrors = us.ExtractErrors
		st.DeltaLoadErrors = us.LoadErrors
		st.DeltaMappingsDropped = us.Dropped
		st.UnwindQueue = us.Queue
		st.DeltasResident = us.Resident
		st.DeltaCache = m.unwinding.Cache.Stats()
	}
	return st
}

// NativeFrameCounts count the native frames of converted traces: machine
// frames (Frames), those named (Named, of which Demangled had a mangled
// name), those with a source line (WithLine), and the inlined frames
// added above them (Inlined, not in Frames).
type NativeFrameCounts struct {
	Frames, Named, Demangled, WithLine, Inlined uint64
}

// Package unwindmaps keeps the native unwinder's BPF maps in step with the
// processes' mappings: it extracts each mapped file's stack deltas (or
// reads them from an on-disk cache), loads them once per file, and writes
// each mapping to the mapping trie.
package unwindmaps

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/support"
)

// ExtractFunc turns a file's bytes into its stack deltas.
type ExtractFunc func(r io.ReaderAt) (nativeunwind.Deltas, error)

// Unwinding says how the native unwinder's maps are kept: where to write
// them, how big they are, and how to extract a file's deltas.
type Unwinding struct {
	Maps     DeltaMaps
	Capacity support.DeltaCapacity
	Extract  ExtractFunc
	// Runtimes, when set, receives what the runtimes' unwinders need of
	// each process that runs a runtime.
	Runtimes RuntimeMaps
	// APM, when set, receives where each process's APM agent keeps its
	// threads' trace context.
	APM APMMaps
	// GoLabels, when set, receives how to read the goroutine labels of
	// each Go program's threads.
	GoLabels GoLabelMaps
	// ThreadCtx, when set, receives where processes keep their threads'
	// OpenTelemetry thread context.
	ThreadCtx ThreadCtxMaps
	// Cache, when set, keeps extracted deltas on disk by file id.
	Cache *DeltaCache
	// ReadAtFirstSample says BPF unwinds a process's samples before its
	// mappings are read, as far as the program it runs and one library
	// per sample go (tracer.Tracer.ResolvesUnread): a process that exec'd
	// a program whose deltas are loaded is read only when first sampled.
	ReadAtFirstSample bool
	// Tracked, when set with ReadAtFirstSample, is told which processes
	// the manager keeps state for, and BPF then reports execs and exits
	// of those only (and execs of programs not loaded yet): a short
	// command that is never sampled costs nothing at all.
	Tracked TrackedProcesses
	// Now, when set, is the clock idle files and failed files age by
	// instead of time.Now: a test ages them without waiting.
	Now func() time.Time
}

// RuntimeMaps writes the per-process configuration of the runtimes' BPF
// unwinders; the tracer implements it.
type RuntimeMaps interface {
	SetRuntimeConfig(pid uint32, id interpreter.ID, v any) error
	DeleteRuntimeConfig(pid uint32, id interpreter.ID) error
}

// APMMaps writes the BPF map of processes with an APM agent; the tracer
// implements it.
type APMMaps interface {
	SetAPMProc(pid uint32, p support.APMProc) error
	DeleteAPMProc(pid uint32) error
}

// GoLabelMaps writes the BPF map of Go programs whose goroutine labels are
// read; the tracer implements it.
type GoLabelMaps interface {
	SetGoProc(pid uint32, p support.GoProc) error
	DeleteGoProc(pid uint32) error
}

// ThreadCtxMaps writes the BPF map of processes with an OpenTelemetry
// thread context; the tracer implements it.
type ThreadCtxMaps interface {
	SetThreadCtxProc(pid uint32, p support.ThreadCtxProc) error
	DeleteThreadCtxProc(pid uint32) error
}

// TrackedProcesses filters BPF's process events (tracer.Tracer).
type TrackedProcesses interface {
	// FilterProcessEvents turns the filter on, before the first process
	// is tracked.
	FilterProcessEvents() error
	// TrackProcess is called before a process's mappings are read.
	TrackProcess(pid uint32)
	UntrackProcess(pid uint32)
}

// maxPendingAttaches bounds the mappings waiting for their deltas; beyond
// it new mappings are dropped (and counted) and unwind with frame pointers.
const maxPendingAttaches = 4096

// Sync mirrors every process's file mappings into the BPF mapping
// trie and keeps their files' stack deltas loaded. Extraction can take
// seconds for a large library, so it never runs on the trace path: the
// caller queues jobs, one worker goroutine writes the BPF maps in their
// order, and the extractQueue's goroutines extract the files the worker
// asks for, smallest first. A mapping whose file is being extracted is
// parked meanwhile; the jobs after it go on.
type Sync struct {
	u       Unwinding
	log     logrus.FieldLogger
	loader  *deltaLoader
	extract *extractQueue

	jobs chan unwindJob
	// pending counts the jobs queued or parked.
	pending atomic.Int64
	done    chan struct{}
	// closed, set by Close under closeMu, makes send drop jobs.
	closeMu sync.RWMutex
	closed  bool

	// attached is the worker's record of what it wrote, per pid and
	// mapping start.
	attached map[uint32]map[uint64]attachedMapping
	// parked are the mappings waiting for their file's deltas, per pid
	// and mapping start; extracting lists them per file being extracted.
	parked     map[uint32]map[uint64]*unwindJob
	extracting map[uint64][]*unwindJob
	// parkSeq numbers parked jobs; barriers wait for those parked before
	// them.
	parkSeq  uint64
	barriers []barrier

	dropped, extractErrors, loadErrors, filesLoaded atomic.Uint64
	// warnedFull is set once a full map has been logged (worker only).
	warnedFull bool
	// resident holds the sizes for Stats, published by the worker when
	// its queue runs empty.
	resident atomic.Pointer[DeltaResidency]
}

// DeltaResidency is what the stack-delta maps hold now.
type DeltaResidency struct {
	// Files with deltas loaded, and their deltas, pages and the distinct
	// rules they use (rules are never freed). Files includes IdleFiles,
	// which no process maps any more but are kept for a while.
	Files, IdleFiles, Deltas, Pages, Rules int
	// MappingPrefixes are the mapping trie's entries: a mapping takes
	// one per aligned power-of-two block of its address range.
	MappingPrefixes int
	// Mappings is the number of process mappings with deltas.
	Mappings int
}

// publish unloads expired idle files and stores the current sizes for
// Stats.
func (s *Sync) publish() {
	s.loader.expireIdle(s.loader.now())
	r := &DeltaResidency{
		Files: len(s.loader.files), IdleFiles: s.loader.idleFiles, Rules: len(s.loader.rules),
	}
	for _, f := range s.loader.files {
		r.Deltas += int(f.span.len)
		r.Pages += len(f.pages)
	}
	for _, ms := range s.attached {
		r.Mappings += len(ms)
		for _, m := range ms {
			r.MappingPrefixes += len(rangePrefixes(m.start, m.end))
		}
	}
	s.resident.Store(r)
}

// IsKnown says whether BPF's known_files names a loaded file by key; safe
// to call from any goroutine.
func (s *Sync) IsKnown(key support.FileKey) bool { return s.loader.isKnown(key) }

// Stats counts what the worker did and what the maps hold.
type Stats struct {
	// FilesLoaded counts files whose deltas were extracted or read from
	// the cache; ExtractErrors and LoadErrors the failures; Dropped the
	// mappings not queued because the queue was full.
	FilesLoaded, ExtractErrors, LoadErrors, Dropped uint64
	// Queue is the number of jobs queued or parked.
	Queue int
	// Resident is what the maps held when the worker last published it.
	Resident DeltaResidency
}

// Stats is safe to call from any goroutine.
func (s *Sync) Stats() Stats {
	st := Stats{
		FilesLoaded: s.filesLoaded.Load(), ExtractErrors: s.extractErrors.Load(),
		LoadErrors: s.loadErrors.Load(), Dropped: s.dropped.Load(), Queue: int(s.pending.Load()),
	}
	if r := s.resident.Load(); r != nil {
		st.Resident = *r
	}
	return st
}

type unwindJob struct {
	pid uint32
	// detachAll forgets the pid; otherwise the job attaches or (detach)
	// removes one mapping, or adds (region) or removes (detach and region)
	// a runtime's region.
	detachAll, detach, region bool
	m                         attachedMapping
	// key names the file for BPF, known is what BPF is told of it
	// (Mapping.Known); hasKey is false for the vDSO and files whose
	// executable segments disagree on p_vaddr - p_offset.
	key    support.FileKey
	known  support.KnownFile
	hasKey bool
	// open reads the mapped file; called only when its deltas are not
	// loaded yet. id is the file's whole id, the cache's key.
	open func() (File, error)
	id   libpf.FileID
	// runtimeCode are the eval loops of the runtimes in the file, whose
	// deltas are marked for the runtimes' unwinders.
	runtimeCode []CodeRange
	// barrier, when set, is closed once every earlier job is done.
	barrier chan struct{}
	// path names the file in log lines; size orders extractions.
	path string
	size int64
	// seq is the job's number while it is parked.
	seq uint64
}

// barrier is a Wait whose earlier jobs were parked: it is closed once
// no job parked before it (seq at most its seq) is left.
type barrier struct {
	ch  chan struct{}
	seq uint64
}

type attachedMapping struct {
	start, end, bias uint64
	// fileID is 0 for a runtime's region of anonymous code, which runtime
	// unwinds if set.
	fileID  uint64
	runtime uint8
	// atPC are the parts of a file's mapping whose code a runtime's
	// unwinder takes over at the PC (Runtime.CodeRangesAtPC).
	atPC []CodeRange
}

// CodeRange is a range of a runtime's code: file addresses of an eval
// loop, or process addresses of code taken over at the PC.
type CodeRange struct {
	Start, End uint64
	Runtime    uint8
}

// File is a mapped file opened for extraction.
type File interface {
	io.ReaderAt
	io.Closer
}

// Mapping is what Attach needs of a process's file mapping.
type Mapping struct {
	PID              uint32
	Start, End, Bias uint64
	// ID is the file's id; its low half names the file in BPF.
	ID libpf.FileID
	// Key names the file for BPF, Known is what BPF is told of it;
	// HasKey is false for the vDSO and files whose executable segments
	// disagree on p_vaddr - p_offset.
	Key    support.FileKey
	Known  support.KnownFile
	HasKey bool
	// Open reads the mapped file; it is called only when the file's
	// deltas are not loaded yet.
	Open func() (File, error)
	// Path names the file in log lines; Size orders extractions.
	Path string
	Size int64
	// RuntimeCode are the eval loops of the runtimes in the file (file
	// addresses), whose deltas are marked for the runtimes' unwinders.
	// AtPC are the parts of the mapping whose code a runtime's unwinder
	// takes over at the PC (process addresses).
	RuntimeCode, AtPC []CodeRange
}

// New starts the worker that writes u.Maps.
func New(u Unwinding, log logrus.FieldLogger) *Sync {
	s := &Sync{
		u:          u,
		log:        log,
		loader:     newDeltaLoader(u.Maps, u.Capacity),
		jobs:       make(chan unwindJob, maxPendingAttaches),
		done:       make(chan struct{}),
		attached:   map[uint32]map[uint64]attachedMapping{},
		parked:     map[uint32]map[uint64]*unwindJob{},
		extracting: map[uint64][]*unwindJob{},
	}
	if u.Now != nil {
		s.loader.now = u.Now
	}
	s.extract = newExtractQueue(s.extractFile)
	go s.run()
	return s
}

// Attach queues a mapping and reports whether it did: not when the queue
// is full (counted; its frames unwind with frame pointers until it is
// attached).
func (s *Sync) Attach(mp Mapping) bool {
	if s.pending.Load() >= maxPendingAttaches/2 {
		s.dropped.Add(1)
		return false
	}
	j := unwindJob{
		pid:         mp.PID,
		m:           attachedMapping{start: mp.Start, end: mp.End, bias: mp.Bias, fileID: mp.ID.Low64(), atPC: mp.AtPC},
		key:         mp.Key,
		known:       mp.Known,
		hasKey:      mp.HasKey,
		open:        mp.Open,
		id:          mp.ID,
		runtimeCode: mp.RuntimeCode,
		path:        mp.Path,
		size:        mp.Size,
	}
	j.known.FileID = j.m.fileID
	s.send(j)
	return true
}

// AddRegion queues the claim of a runtime's region of anonymous code
// [start, end): known code to the native unwinder, handed to runtime's
// unwinder where runtime is set.
func (s *Sync) AddRegion(pid uint32, start, end uint64, runtime uint8) {
	s.send(unwindJob{pid: pid, region: true, m: attachedMapping{start: start, end: end, runtime: runtime}})
}

// RemoveRegion queues the removal of a region added at start.
func (s *Sync) RemoveRegion(pid uint32, start uint64) {
	s.send(unwindJob{pid: pid, detach: true, region: true, m: attachedMapping{start: start}})
}

// Detach queues the removal of the mapping attached at start. Removals are
// never dropped: the queue keeps half its room for them.
func (s *Sync) Detach(pid uint32, start uint64) {
	s.send(unwindJob{pid: pid, detach: true, m: attachedMapping{start: start}})
}

// Forget queues the removal of everything of pid.
func (s *Sync) Forget(pid uint32) { s.send(unwindJob{pid: pid, detachAll: true}) }

// send queues a job; after Close it drops it: the process lifecycle may
// still be finishing its work.
func (s *Sync) send(j unwindJob) bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return false
	}
	s.pending.Add(1)
	s.jobs <- j
	return true
}

// Close stops the worker after the queued jobs.
func (s *Sync) Close() {
	s.closeMu.Lock()
	if !s.closed {
		s.closed = true
		close(s.jobs)
	}
	s.closeMu.Unlock()
	<-s.done
}

// run is the worker. It also wakes up now and then with nothing to do, to
// unload files that stayed idle.
func (s *Sync) run() {
	defer close(s.done)
	defer s.extract.close()
	defer func() {
		for _, b := range s.barriers {
			close(b.ch) // nothing more will be done
		}
	}()
	tick := time.NewTicker(idleFileKeep / 4)
	defer tick.Stop()
	for {
		select {
		case j, ok := <-s.jobs:
			if !ok {
				return
			}
			switch {
			case j.barrier != nil:
				s.barriers = append(s.barriers, barrier{ch: j.barrier, seq: s.parkSeq})
				s.pending.Add(-1)
			case s.handle(&j):
				// Parked: done when its file is.
			default:
				s.pending.Add(-1)
			}
		case r := <-s.extract.results:
			s.extracted(r)
		case <-tick.C:
			s.publish()
			continue
		}
		// Stats and barriers see the maps as they are after the job.
		if len(s.jobs) == 0 || len(s.barriers) > 0 {
			s.publish()
		}
		s.releaseBarriers()
	}
}

// Wait returns once every job queued before it is done.
func (s *Sync) Wait() {
	b := make(chan struct{})
	if s.send(unwindJob{barrier: b}) {
		<-b
	}
}

// releaseBarriers closes the barriers whose parked jobs are all done.
func (s *Sync) releaseBarriers() {
	if len(s.barriers) == 0 {
		return
	}
	oldest := s.parkSeq + 1
	for _, ms := range s.parked {
		for _, j := range ms {
			oldest = min(oldest, j.seq)
		}
	}
	s.barriers = slices.DeleteFunc(s.barriers, func(b barrier) bool {
		if b.seq < oldest {
			close(b.ch)
			return true
		}
		return false
	})
}

// handle does a job and reports whether it was parked.
func (s *Sync) handle(j *unwindJob) (parked bool) {
	switch {
	case j.detachAll:
		for start := range s.parked[j.pid] {
			s.unpark(j.pid, start)
		}
		for start := range s.attached[j.pid] {
			s.remove(j.pid, start)
		}
		delete(s.attached, j.pid)
	case j.detach:
		// A region starts where its anonymous mapping does, and a file
		// may be mapped over it: each removes only its own kind.
		if !j.region {
			s.unpark(j.pid, j.m.start)
		}
		if m, ok := s.attached[j.pid][j.m.start]; ok && (m.fileID == 0) == j.region {
			s.remove(j.pid, j.m.start)
		}
	case j.region:
		// It replaces a file mapping that waits at its start, as it
		// replaces one attached there.
		s.unpark(j.pid, j.m.start)
		if err := s.addTrie(j.pid, j.m); err != nil {
			s.log.WithError(err).Debugf("process %d: region at %#x", j.pid, j.m.start)
		}
	default:
		return s.add(j)
	}
	return false
}

// add attaches a mapping whose file's deltas are loaded, or parks it until
// they are.
func (s *Sync) add(j *unwindJob) (parked bool) {
	s.unpark(j.pid, j.m.start)
	if _, ok := s.attached[j.pid][j.m.start]; ok {
		s.remove(j.pid, j.m.start)
	}
	if s.loader.acquire(j.m.fileID) {
		s.attachLoaded(j)
		return false
	}
	if err := s.loader.failure(j.m.fileID); err != nil {
		s.failed(j, err)
		return false
	}
	s.parkSeq++
	j.seq = s.parkSeq
	if s.parked[j.pid] == nil {
		s.parked[j.pid] = map[uint64]*unwindJob{}
	}
	s.parked[j.pid][j.m.start] = j
	waiting, queued := s.extracting[j.m.fileID]
	s.extracting[j.m.fileID] = append(waiting, j)
	if !queued {
		s.extract.push(&extraction{job: j, size: j.size})
	}
	return true
}

// unpark drops the parked job of a mapping, if there is one: it is done.
func (s *Sync) unpark(pid uint32, start uint64) {
	if _, ok := s.parked[pid][start]; !ok {
		return
	}
	delete(s.parked[pid], start)
	if len(s.parked[pid]) == 0 {
		delete(s.parked, pid)
	}
	s.pending.Add(-1)
}

// isParked says whether j still waits: a later job may have detached its
// mapping, or replaced it.
func (s *Sync) isParked(j *unwindJob) bool { return s.parked[j.pid][j.m.start] == j }

// extracted loads an extracted file's deltas and attaches the mappings
// that wait for them.
func (s *Sync) extracted(r extracted) {
	fileID := r.x.job.m.fileID
	waiting := slices.DeleteFunc(s.extracting[fileID], func(j *unwindJob) bool { return !s.isParked(j) })
	delete(s.extracting, fileID)
	var transient transientError
	if errors.As(r.err, &transient) {
		// The process whose mapping was opened went away; another
		// that maps the file may still be there.
		if s.isParked(r.x.job) {
			s.unpark(r.x.job.pid, r.x.job.m.start)
			s.failed(r.x.job, r.err)
		}
		waiting = slices.DeleteFunc(waiting, func(j *unwindJob) bool { return j == r.x.job })
		if len(waiting) > 0 {
			s.extracting[fileID] = waiting
			s.extract.push(&extraction{job: waiting[0], size: waiting[0].size})
		}
		return
	}
	err := s.loader.load(fileID, r.deltas, r.err)
	for _, j := range waiting {
		s.unpark(j.pid, j.m.start)
		if err != nil {
			s.failed(j, err)
		} else if s.loader.acquire(fileID) {
			s.attachLoaded(j)
		}
	}
}

// attachLoaded writes a mapping whose file's deltas are loaded (and
// acquired) to the trie.
func (s *Sync) attachLoaded(j *unwindJob) {
	if j.hasKey {
		if err := s.loader.knownAs(j.key, j.known); err != nil {
			s.log.WithError(err).Debugf("process %d: mapping at %#x", j.pid, j.m.start)
		}
	}
	if err := s.addTrie(j.pid, j.m); err != nil {
		s.logFailure(j, err) // counted by addTrie
	}
}

// failed counts a mapping left without deltas: it unwinds with frame
// pointers.
func (s *Sync) failed(j *unwindJob, err error) {
	s.loadErrors.Add(1)
	s.logFailure(j, err)
}

// logFailure says why a mapping has no deltas: a full map once as a
// warning, the rest at debug level.
func (s *Sync) logFailure(j *unwindJob, err error) {
	if isMapFull(err) && !s.warnedFull {
		s.warnedFull = true
		s.log.WithError(err).Warn("A BPF map for stack deltas is full: further files are unwound with frame pointers only " +
			"(logged once; raise -map-scale-factor)")
		return
	}
	s.log.WithError(err).Debugf("process %d: no stack deltas for mapping at %#x", j.pid, j.m.start)
}

// extractFile returns a file's deltas with its runtimes' code marked; it
// runs on the extractQueue's goroutines.
func (s *Sync) extractFile(x *extraction) (deltaSeq, error) {
	start := time.Now()
	d, cached, err := s.extractJob(x.job)
	if err != nil {
		return deltaSeq{}, err
	}
	s.filesLoaded.Add(1)
	from := "extracted"
	if cached {
		from = "read from the cache"
	}
	s.log.Debugf("%d stack deltas of %s %s in %v", d.n, x.job.path, from, time.Since(start).Round(time.Millisecond))
	for _, c := range x.job.runtimeCode {
		d = deltaSeq{n: d.n + 2, all: nativeunwind.MarkRuntimeSeq(d.all, c.Start, c.End, c.Runtime)}
	}
	return d, nil
}

// extractJob returns a job's file's deltas: from the cache, or extracted
// from the file (and cached).
func (s *Sync) extractJob(j *unwindJob) (d deltaSeq, cached bool, err error) {
	if d, ok := s.u.Cache.load(j.id); ok {
		return d, true, nil
	}
	f, err := j.open()
	if err != nil {
		return deltaSeq{}, false, transientError{err}
	}
	defer f.Close()
	deltas, err := s.u.Extract(f)
	if err != nil {
		s.extractErrors.Add(1)
		return deltaSeq{}, false, fmt.Errorf("extracting stack deltas: %w", err)
	}
	s.u.Cache.store(j.id, deltas)
	return seqOf(deltas), false, nil
}

// addTrie writes a mapping (or region) to the mapping trie.
func (s *Sync) addTrie(pid uint32, m attachedMapping) error {
	if _, ok := s.attached[pid][m.start]; ok && m.fileID == 0 {
		s.remove(pid, m.start)
	}
	s.attachedFor(pid)[m.start] = m
	for _, p := range rangePrefixes(m.start, m.end) {
		key := support.NewPidMappingKey(pid, p[0], int(p[1]))
		if err := s.u.Maps.SetPidMapping(key, support.PidMapping{FileID: m.fileID, Bias: m.bias, Runtime: m.runtime}); err != nil {
			s.loadErrors.Add(1)
			s.remove(pid, m.start)
			return fmt.Errorf("writing the mapping trie: %w", err)
		}
	}
	// A part taken over at the PC: its prefixes are nested in the
	// mapping's (every aligned block inside a range lies in one of the
	// range's own), so the trie's longest match finds them.
	for _, c := range m.atPC {
		for _, p := range rangePrefixes(c.Start, c.End) {
			key := support.NewPidMappingKey(pid, p[0], int(p[1]))
			if err := s.u.Maps.SetPidMapping(key, support.PidMapping{FileID: m.fileID, Bias: m.bias, Runtime: c.Runtime}); err != nil {
				s.loadErrors.Add(1)
				s.remove(pid, m.start)
				return fmt.Errorf("writing the mapping trie: %w", err)
			}
		}
	}
	return nil
}

func (s *Sync) attachedFor(pid uint32) map[uint64]attachedMapping {
	m := s.attached[pid]
	if m == nil {
		m = map[uint64]attachedMapping{}
		s.attached[pid] = m
	}
	return m
}

func (s *Sync) remove(pid uint32, start uint64) {
	m, ok := s.attached[pid][start]
	if !ok {
		return
	}
	delete(s.attached[pid], start)
	for _, p := range rangePrefixes(m.start, m.end) {
		_ = s.u.Maps.DeletePidMapping(support.NewPidMappingKey(pid, p[0], int(p[1])))
	}
	for _, c := range m.atPC {
		for _, p := range rangePrefixes(c.Start, c.End) {
			_ = s.u.Maps.DeletePidMapping(support.NewPidMappingKey(pid, p[0], int(p[1])))
		}
	}
	s.loader.release(m.fileID)
}

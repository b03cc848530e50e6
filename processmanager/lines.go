package processmanager

import (
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
)

// Source lines and inlined calls of native frames. A file's debug
// information is opened in the background after the first sample of one
// of its addresses (reading and indexing a large file takes long, and
// conversions must not wait for it), kept while the bytes of all open
// files stay within Config.DebugInfoBytes (least recently used first out),
// and every address's answer is cached.

// DefaultDebugInfoBytes is the default bound on debug information kept
// open: inflated and mapped sections and indexes, enough for a few hundred
// binaries of ordinary size.
const DefaultDebugInfoBytes = 128 << 20

// DefaultDebugDirs are searched for separate debug files by default.
var DefaultDebugDirs = []string{"/usr/lib/debug"}

const (
	// maxDebugFiles bounds the files whose debug information (or its
	// absence) is remembered.
	maxDebugFiles = 4096
	// maxLineResults bounds the cached answers per address.
	maxLineResults = 1 << 16
	// missingCost is what remembering a file without debug information
	// costs in the byte bound.
	missingCost = 256
	// openQueue bounds the files waiting to be opened; a file that finds
	// the queue full is queued on a later sample.
	openQueue = 64
	// queueFullRecheck is how soon a trace converted while the open queue
	// was full is converted again, to queue its files then.
	queueFullRecheck = 500 * time.Millisecond
	// defaultDebuginfodRecheck is how long after asking debuginfod for a
	// file's debug information the file is opened again.
	defaultDebuginfodRecheck = 10 * time.Second
)

// lineKey is an address of a file.
type lineKey struct {
	file libpf.FileID
	addr uint64
}

// debugFile is a file's debug information, or why it has none.
type debugFile struct {
	d   *debuginfo.File
	err error
	// opening is set while the file is queued or being opened.
	opening bool
	// retryAt is when a file without debug information is looked at
	// again: debuginfod may have fetched it by then. Zero: never.
	retryAt time.Time
}

// lineStats counts what the line lookups found.
type lineStats struct {
	// filesOpened counts files whose debug information was opened, by
	// where it was found; filesMissing those without any; fileErrors
	// those whose information could not be read; evicted those closed
	// to stay within the bound.
	filesOpened  map[string]uint64
	filesMissing uint64
	fileErrors   uint64
	evicted      uint64
	// lookupErrors counts addresses whose lookup failed.
	lookupErrors uint64
}

// openRequest is a file to open in the background: the mapping to open it
// through, then (for the opener) the file open.
type openRequest struct {
	id      libpf.FileID
	src     proc.Source
	pid     uint32
	entry   proc.MapsEntry
	buildID string

	file *os.File
	root string
}

// lineSymbolizer finds the source lines of native frames. Its methods
// are called with the Manager's lock held; its own lock orders them with
// the background opener.
type lineSymbolizer struct {
	opts debuginfo.Options
	// debuginfod, when set, is asked for files without debug information
	// that have a build id; its cache is one of opts.DebugDirs.
	debuginfod *debuginfo.Debuginfod
	recheck    time.Duration
	now        func() time.Time
	maxBytes   int64
	// requests are the files to open, taken by mappingOpener, which
	// opens them through their processes' mappings (a /proc access that
	// conversion leaves to it) and hands them to the opener (queue).
	requests chan openRequest
	queue    chan openRequest
	wg       sync.WaitGroup
	// settled counts the files whose opening ended, with or without debug
	// information: a trace converted while one of its files was opening is
	// converted again once it has changed.
	settled atomic.Uint64

	mu      sync.Mutex
	files   *libpf.LRU[libpf.FileID, debugFile]
	bytes   int64
	results *libpf.LRU[lineKey, []debuginfo.Frame]
	stats   lineStats
	closed  bool
	// mappingsDone is closed when mappingOpener has returned.
	mappingsDone chan struct{}
}

// newLineSymbolizer opens debug information where opts say, maxBytes of
// it at most.
func newLineSymbolizer(opts debuginfo.Options, maxBytes int64, dfd *debuginfo.Debuginfod, now func() time.Time) *lineSymbolizer {
	if dfd != nil {
		opts.DebugDirs = append(slices.Clip(opts.DebugDirs), dfd.Dir())
	}
	// One file may take up to half the bound.
	opts.MaxDecompressed = maxBytes / 2
	s := &lineSymbolizer{
		debuginfod: dfd,
		recheck:    defaultDebuginfodRecheck,
		now:        now,
		opts:       opts,
		maxBytes:   maxBytes,
		requests:   make(chan openRequest, openQueue),
		queue:      make(chan openRequest, openQueue),
		files:      libpf.NewLRU[libpf.FileID, debugFile](maxDebugFiles, 0),
		results:    libpf.NewLRU[lineKey, []debuginfo.Frame](maxLineResults, 0),
		stats:      lineStats{filesOpened: map[string]uint64{}},
	}
	s.wg.Add(1)
	go s.opener()
	s.mappingsDone = make(chan struct{})
	go s.mappingOpener()
	return s
}

// frames returns the source frames at addr of the file mapped by mp in
// process pid, innermost first; nil when there is no information. When
// the file's information is being opened, or was queued now, opening is
// set: convert the trace again once settled() has changed. retryAt is
// when to convert it again otherwise (debuginfod may have fetched the
// file, or the queue has room); zero: never. With pid 0 (mp is not the
// process's own mapping) a file is not queued.
func (s *lineSymbolizer) frames(src proc.Source, pid uint32, mp *mapping, addr uint64) (fs []debuginfo.Frame, retryAt time.Time, opening bool) {
	if mp.entry.IsVDSO() {
		return nil, time.Time{}, false // an image in memory, no file to find debug files by
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := lineKey{mp.file.ID, addr}
	if fs, ok := s.results.Get(key); ok {
		return fs, time.Time{}, false
	}
	df, ok := s.files.Get(key.file)
	switch {
	case ok && df.opening:
		return nil, time.Time{}, true
	case ok && df.d == nil && !df.retryAt.IsZero() && pid != 0 && s.now().After(df.retryAt):
		s.remove(key.file, df)
		ok = false
	case ok && df.d == nil:
		return nil, df.retryAt, false
	}
	if !ok {
		if pid == 0 {
			return nil, time.Time{}, false
		}
		queued, full := s.request(src, pid, mp)
		if full {
			return nil, s.now().Add(queueFullRecheck), false
		}
		return nil, time.Time{}, queued
	}
	fs, err := df.d.Lookup(addr)
	if err != nil {
		s.stats.lookupErrors++
	}
	s.results.Add(key, fs, 0)
	return fs, time.Time{}, false
}

// settledFiles is the count of files whose opening ended; see frames.
func (s *lineSymbolizer) settledFiles() uint64 { return s.settled.Load() }

// request queues mp's file for mappingOpener; full says the queue had no
// room. The caller holds s.mu.
func (s *lineSymbolizer) request(src proc.Source, pid uint32, mp *mapping) (queued, full bool) {
	if s.closed {
		return false, false
	}
	req := openRequest{id: mp.file.ID, src: src, pid: pid, entry: mp.entry}
	if mp.file.ELF != nil {
		req.buildID = mp.file.ELF.GNUBuildID
	}
	select {
	case s.requests <- req:
		s.add(mp.file.ID, debugFile{opening: true}, missingCost)
		return true, false
	default:
		return false, true // a later conversion queues it
	}
}

// mappingOpener opens each requested file through its process's mapping
// (cheap, and possible only while the process lives: it comes first, not
// behind a slow debug information read) and queues it for the opener.
func (s *lineSymbolizer) mappingOpener() {
	defer close(s.mappingsDone)
	for req := range s.requests {
		f, err := req.src.OpenMapping(req.pid, &req.entry)
		switch {
		case errors.Is(err, ErrProcessExited):
			// Another process of the file may queue it.
			s.abandon(req.id)
		case err != nil:
			s.opened(req, nil, err)
		default:
			req.file, req.root = f, req.src.Root(req.pid)
			s.queue <- req
		}
	}
	close(s.queue)
}

// abandon forgets a file requested whose process exited first; the traces
// that waited for it are converted again.
func (s *lineSymbolizer) abandon(id libpf.FileID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.settled.Add(1)
	if df, ok := s.files.Get(id); ok && df.opening {
		s.files.Remove(id)
		s.bytes -= missingCost
	}
}

// opener opens queued files one at a time.
func (s *lineSymbolizer) opener() {
	defer s.wg.Done()
	for req := range s.queue {
		d, err := debuginfo.Open(debuginfo.Executable{File: req.file, Root: req.root, Path: req.entry.Path}, s.opts)
		req.file.Close()
		s.opened(req, d, err)
	}
}

// opened records the outcome of opening a file.
func (s *lineSymbolizer) opened(req openRequest, d *debuginfo.File, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.settled.Add(1) // after the file is recorded
	if old, ok := s.files.Get(req.id); ok {
		s.remove(req.id, old)
	}
	if s.closed {
		if d != nil {
			d.Close()
		}
		return
	}
	df := debugFile{d: d, err: err}
	cost := int64(missingCost)
	switch {
	case d != nil:
		s.stats.filesOpened[d.Source]++
		cost = d.Cost()
	case errors.Is(err, debuginfo.ErrNoDebugInfo):
		s.stats.filesMissing++
		if s.debuginfod != nil && req.buildID != "" {
			s.debuginfod.Request(req.buildID)
			df.retryAt = s.now().Add(s.recheck)
		}
	default:
		s.stats.fileErrors++
	}
	s.add(req.id, df, cost)
}

// add remembers df, closing the least recently used files until the
// bound holds. The file just added stays, also when it alone is larger
// than the bound: then it is the only one kept. The caller holds s.mu.
func (s *lineSymbolizer) add(id libpf.FileID, df debugFile, cost int64) {
	if s.files.Len() >= maxDebugFiles {
		s.evictOldest()
	}
	s.files.Add(id, df, 0)
	s.bytes += cost
	for s.bytes > s.maxBytes {
		if oldest, _, ok := s.files.Oldest(); !ok || oldest == id {
			break
		}
		s.evictOldest()
	}
}

func (s *lineSymbolizer) evictOldest() {
	if id, df, ok := s.files.Oldest(); ok {
		if df.opening {
			// The opener will record it; only its place goes.
			s.files.Remove(id)
			s.bytes -= missingCost
			return
		}
		s.remove(id, df)
		if df.d != nil {
			s.stats.evicted++
		}
	}
}

// remove forgets a file and closes its information.
func (s *lineSymbolizer) remove(id libpf.FileID, df debugFile) {
	s.files.Remove(id)
	if df.d != nil {
		s.bytes -= df.d.Cost()
		df.d.Close()
	} else {
		s.bytes -= missingCost
	}
}

// dropResident drops the resident pages of every open file's mappings:
// what lookups touched since the last call.
func (s *lineSymbolizer) dropResident() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, df := range s.files.All() {
		if df.d != nil {
			df.d.DropResident()
		}
	}
}

// wait waits until the files queued so far are opened (for tests).
func (s *lineSymbolizer) wait() {
	for {
		s.mu.Lock()
		pending := len(s.requests) > 0 || len(s.queue) > 0
		for _, df := range s.files.All() {
			pending = pending || df.opening
		}
		s.mu.Unlock()
		if !pending {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// close stops the opener and closes every open file.
func (s *lineSymbolizer) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.requests) // mappingOpener closes the opener's queue
	s.mu.Unlock()
	<-s.mappingsDone
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.files.Len() > 0 {
		s.evictOldest()
	}
}

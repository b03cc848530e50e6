package processmanager

import (
	"errors"
	"fmt"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
)

// Source lines and inlined calls of native frames. Debug information is
// opened the first time an address of its file is symbolized, kept while
// the bytes of all open files stay within Config.DebugInfoBytes (least
// recently used first out), and every address's answer is cached.

// DefaultDebugInfoBytes is the default bound on debug information kept
// open: mapped and inflated sections and indexes, enough for a few hundred
// binaries of ordinary size.
const DefaultDebugInfoBytes = 512 << 20

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

// lineSymbolizer finds the source lines of native frames.
type lineSymbolizer struct {
	opts     debuginfo.Options
	maxBytes int64
	files    *lru[libpf.FileID, debugFile]
	bytes    int64
	results  *lru[lineKey, []debuginfo.Frame]
	stats    lineStats
}

func newLineSymbolizer(dirs []string, maxBytes int64) *lineSymbolizer {
	return &lineSymbolizer{
		opts: debuginfo.Options{
			DebugDirs: dirs,
			// One file may take up to half the bound.
			MaxDecompressed: maxBytes / 2,
		},
		maxBytes: maxBytes,
		files:    newLRU[libpf.FileID, debugFile](maxDebugFiles),
		results:  newLRU[lineKey, []debuginfo.Frame](maxLineResults),
		stats:    lineStats{filesOpened: map[string]uint64{}},
	}
}

// frames returns the source frames at addr of the file mapped by mp in
// process pid, innermost first; nil when there is no information. With
// pid 0 (mp is not the process's own mapping) a file not open yet is not
// opened. The caller holds the Manager's lock.
func (s *lineSymbolizer) frames(procFS string, pid uint32, mp *mapping, addr uint64) []debuginfo.Frame {
	if mp.entry.isVDSO() {
		return nil // an image in memory, no file to find debug files by
	}
	key := lineKey{mp.file.id, addr}
	if fs, ok := s.results.Get(key); ok {
		return fs
	}
	df, ok := s.files.Get(key.file)
	if !ok {
		if pid == 0 {
			return nil
		}
		df = s.open(procFS, pid, mp)
	}
	if df.d == nil {
		return nil
	}
	fs, err := df.d.Lookup(addr)
	if err != nil {
		s.stats.lookupErrors++
	}
	s.results.Add(key, fs)
	return fs
}

// open opens the debug information of mp's file and makes room for it.
func (s *lineSymbolizer) open(procFS string, pid uint32, mp *mapping) debugFile {
	var df debugFile
	f, err := openMapping(procFS, pid, &mp.entry)
	if err == nil {
		df.d, df.err = debuginfo.Open(debuginfo.Executable{
			File: f, Root: fmt.Sprintf("%s/%d/root", procFS, pid), Path: mp.entry.path,
		}, s.opts)
		f.Close()
	} else {
		df.err = err
	}
	cost := int64(missingCost)
	switch {
	case df.d != nil:
		s.stats.filesOpened[df.d.Source]++
		cost = df.d.Cost()
	case errors.Is(df.err, debuginfo.ErrNoDebugInfo):
		s.stats.filesMissing++
	default:
		s.stats.fileErrors++
	}
	s.add(mp.file.id, df, cost)
	return df
}

// add remembers df, closing the least recently used files until the
// bound holds. The file just added stays (the caller uses it), also when
// it alone is larger than the bound: then it is the only one kept.
func (s *lineSymbolizer) add(id libpf.FileID, df debugFile, cost int64) {
	if s.files.Len() >= maxDebugFiles {
		s.evictOldest()
	}
	s.files.Add(id, df)
	s.bytes += cost
	for s.bytes > s.maxBytes {
		if oldest, _, ok := s.files.Oldest(); !ok || oldest == id {
			break
		}
		s.evictOldest()
	}
}

func (s *lineSymbolizer) evictOldest() {
	id, df, ok := s.files.Oldest()
	if !ok {
		return
	}
	s.files.Remove(id)
	s.bytes -= s.cost(df)
	if df.d != nil {
		df.d.Close()
		s.stats.evicted++
	}
}

func (s *lineSymbolizer) cost(df debugFile) int64 {
	if df.d != nil {
		return df.d.Cost()
	}
	return missingCost
}

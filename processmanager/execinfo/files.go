package execinfo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/golabels"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

// File is what is known about one executable file. It is immutable once
// built and shared by every process that maps the file.
type File struct {
	ID libpf.FileID
	// Size is the file's size in bytes.
	Size int64
	// ELF is nil for files that are not ELF or failed to parse: their frames
	// get the file id but no symbols.
	ELF *ELF
}

// fileKey identifies a file's content without reading it: a file replaced
// in place (same inode, new size or mtime) gets a new key.
type fileKey struct {
	dev, ino      uint64
	size, mtimeNs int64
}

// vdsoDev marks keys of vDSO images, which have no file: their ino is a
// hash of the image instead.
const vdsoDev = ^uint64(0)

func keyFromStat(st *syscall.Stat_t) fileKey {
	return fileKey{
		dev: st.Dev, ino: st.Ino, size: st.Size,
		mtimeNs: st.Mtim.Sec*1e9 + st.Mtim.Nsec,
	}
}

// Cache holds per-file data for the most recently used files. Processes
// keep the File of their mappings, so eviction only costs a re-parse when
// a new process maps an evicted file. It is safe for concurrent use: the
// process manager reads a new process's files before it takes its own
// lock. Files are parsed outside the cache's lock; two callers missing the
// same file at once both parse it, and the second result is kept.
type Cache struct {
	log logrus.FieldLogger
	// runtimes are looked for in every file.
	runtimes []*interpreter.Runtime
	// debugDirs are searched for the symbols of stripped files.
	debugDirs []string

	mu  sync.Mutex
	lru *libpf.LRU[fileKey, *File]
	// reading has the files being read, closed when done: a second
	// reader of one waits for the first instead of reading it again.
	reading      map[fileKey]chan struct{}
	hits, misses uint64
	elfErrors    uint64
	// runtimeErrors counts files a runtime found its own but could not
	// read (Runtime.Recognise errors).
	runtimeErrors uint64
}

// NewCache returns a cache of the size most recently used files, in which
// the runtimes rts are looked for and whose stripped files are named from
// debug files found in debugDirs.
func NewCache(size int, rts []*interpreter.Runtime, debugDirs []string, log logrus.FieldLogger) *Cache {
	return &Cache{
		lru:       libpf.NewLRU[fileKey, *File](size, 0),
		reading:   map[fileKey]chan struct{}{},
		log:       log,
		runtimes:  rts,
		debugDirs: debugDirs,
	}
}

// CacheStats are a Cache's counters. ELFErrors counts files that failed to
// parse as ELF; RuntimeErrors counts files a runtime found its own but
// could not read.
type CacheStats struct {
	Size                                   int
	Hits, Misses, ELFErrors, RuntimeErrors uint64
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{c.lru.Len(), c.hits, c.misses, c.elfErrors, c.runtimeErrors}
}

// ForMapping returns the data of the file behind a mapping, parsing it
// on a cache miss.
func (c *Cache) ForMapping(src proc.Source, pid uint32, e *proc.MapsEntry) (*File, error) {
	f, err := src.OpenMapping(pid, e)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", e.Path, err)
	}
	return c.get(keyFromStat(&st), f, e.Path)
}

// VDSOForMapping reads the vDSO image from the process's memory. Every
// process of one ABI shares the image, so it is cached by content.
func (c *Cache) VDSOForMapping(src proc.Source, pid uint32, e *proc.MapsEntry) (*File, error) {
	image, err := proc.ReadVDSO(src, pid, e)
	if err != nil {
		return nil, err
	}
	key := fileKey{dev: vdsoDev, ino: xxh3.Hash(image), size: int64(len(image))}
	return c.get(key, bytes.NewReader(image), proc.VDSOPath)
}

type readSeekerAt interface {
	io.ReadSeeker
	io.ReaderAt
}

func (c *Cache) get(key fileKey, r readSeekerAt, name string) (*File, error) {
	c.mu.Lock()
	for {
		if fi, ok := c.lru.Get(key); ok {
			c.hits++
			c.mu.Unlock()
			return fi, nil
		}
		done, busy := c.reading[key]
		if !busy {
			break
		}
		// Read by another goroutine: its result, or, if it failed,
		// this reader's own try.
		c.mu.Unlock()
		<-done
		c.mu.Lock()
	}
	c.misses++
	done := make(chan struct{})
	c.reading[key] = done
	c.mu.Unlock()
	var elfErrors, runtimeErrors uint64
	defer func() {
		c.mu.Lock()
		c.elfErrors += elfErrors
		c.runtimeErrors += runtimeErrors
		delete(c.reading, key)
		close(done)
		c.mu.Unlock()
	}()
	id, err := libpf.FileIDFromExecutable(r)
	if err != nil {
		return nil, fmt.Errorf("file id of %s: %w", name, err)
	}
	fi := &File{ID: id, Size: key.size}
	if isELF(r) {
		// A corrupt ELF file still has a file id; it just cannot be
		// symbolized locally.
		if fi.ELF, err = parseELF(r, name, c.runtimes, c.debugDirs); err != nil {
			elfErrors++
			c.log.WithError(err).Debugf("not symbolizing %s", name)
		}
		if fi.ELF != nil {
			for _, err := range fi.ELF.recogniseErrs {
				runtimeErrors++
				c.log.WithError(err).Debugf("not unwinding the runtime in %s", name)
			}
			// Said once per file read (the file cache keeps it): every
			// process of an unsupported build is profiled without its
			// runtime's frames.
			for _, rm := range fi.ELF.Runtimes {
				if err := rm.Binary.Unsupported(); err != nil {
					c.log.WithError(err).Warnf("Not unwinding %s %s in %s", rm.Runtime.DisplayName, rm.Binary.Version(), name)
				}
			}
		}
		if fi.ELF != nil && fi.ELF.GoLabelsErr != nil && !errors.Is(fi.ELF.GoLabelsErr, golabels.ErrNotGo) {
			// Said once per file read, as above.
			c.log.WithError(fi.ELF.GoLabelsErr).Infof("Not reading goroutine labels of %s", name)
		}
		if fi.ELF != nil && tracecorr.IsAgentLibrary(name) {
			if fi.ELF.APM, err = readAgentLibrary(r); err != nil {
				c.log.WithError(err).Debugf("%s: not an APM agent library", name)
			}
		}
	}
	c.mu.Lock()
	c.lru.Add(key, fi, 0)
	c.mu.Unlock()
	return fi, nil
}

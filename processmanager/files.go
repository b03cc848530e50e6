package processmanager

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

// fileInfo is what is known about one executable file. It is immutable once
// built and shared by every process that maps the file.
type fileInfo struct {
	id libpf.FileID
	// size is the file's size in bytes.
	size int64
	// elf is nil for files that are not ELF or failed to parse: their frames
	// get the file id but no symbols.
	elf *elfData
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

// fileCache holds per-file data for the most recently used files. Processes
// keep the fileInfo of their mappings, so eviction only costs a re-parse when
// a new process maps an evicted file. It is safe for concurrent use: the
// lifecycle reads a new process's files before it takes the manager's lock
// (Manager.preread). Files are parsed outside its lock; two callers missing
// the same file at once both parse it, and the second result is kept.
type fileCache struct {
	log logrus.FieldLogger
	// runtimes are looked for in every file.
	runtimes []*interpreter.Runtime
	// debugDirs are searched for the symbols of stripped files.
	debugDirs []string

	mu           sync.Mutex
	lru          *libpf.LRU[fileKey, *fileInfo]
	hits, misses uint64
	elfErrors    uint64
	// runtimeErrors counts files a runtime found its own but could not
	// read (Runtime.Recognise errors).
	runtimeErrors uint64
}

// fileCacheStats are a fileCache's counters.
type fileCacheStats struct {
	size                                   int
	hits, misses, elfErrors, runtimeErrors uint64
}

func (c *fileCache) stats() fileCacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fileCacheStats{c.lru.Len(), c.hits, c.misses, c.elfErrors, c.runtimeErrors}
}

// fileForMapping returns the data of the file behind a mapping, parsing it
// on a cache miss.
func (c *fileCache) fileForMapping(src proc.Source, pid uint32, e *proc.MapsEntry) (*fileInfo, error) {
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

// vdsoForMapping reads the vDSO image from the process's memory. Every
// process of one ABI shares the image, so it is cached by content.
func (c *fileCache) vdsoForMapping(src proc.Source, pid uint32, e *proc.MapsEntry) (*fileInfo, error) {
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

func (c *fileCache) get(key fileKey, r readSeekerAt, name string) (*fileInfo, error) {
	c.mu.Lock()
	if fi, ok := c.lru.Get(key); ok {
		c.hits++
		c.mu.Unlock()
		return fi, nil
	}
	c.misses++
	c.mu.Unlock()
	var elfErrors, runtimeErrors uint64
	defer func() {
		c.mu.Lock()
		c.elfErrors += elfErrors
		c.runtimeErrors += runtimeErrors
		c.mu.Unlock()
	}()
	id, err := libpf.FileIDFromExecutable(r)
	if err != nil {
		return nil, fmt.Errorf("file id of %s: %w", name, err)
	}
	fi := &fileInfo{id: id, size: key.size}
	if isELF(r) {
		// A corrupt ELF file still has a file id; it just cannot be
		// symbolized locally.
		if fi.elf, err = parseELF(r, name, c.runtimes, c.debugDirs); err != nil {
			elfErrors++
			c.log.WithError(err).Debugf("not symbolizing %s", name)
		}
		if fi.elf != nil {
			for _, err := range fi.elf.recogniseErrs {
				runtimeErrors++
				c.log.WithError(err).Debugf("not unwinding the runtime in %s", name)
			}
			// Said once per file read (the file cache keeps it): every
			// process of an unsupported build is profiled without its
			// runtime's frames.
			for _, rm := range fi.elf.runtimes {
				if err := rm.bin.Unsupported(); err != nil {
					c.log.WithError(err).Warnf("Not unwinding %s %s in %s", rm.rt.DisplayName, rm.bin.Version(), name)
				}
			}
		}
		if fi.elf != nil && tracecorr.IsAgentLibrary(name) {
			if fi.elf.apm, err = readAgentLibrary(r); err != nil {
				c.log.WithError(err).Debugf("%s: not an APM agent library", name)
			}
		}
	}
	c.mu.Lock()
	c.lru.Add(key, fi, 0)
	c.mu.Unlock()
	return fi, nil
}

package processmanager

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
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

// openMapping opens the file behind a mapping. /proc/PID/map_files works for
// deleted files and files in other mount namespaces; /proc/PID/root/<path>
// is the fallback for kernels or setups where map_files is not readable, and
// is checked to still be the mapped inode.
func openMapping(procFS string, pid uint32, e *mapsEntry) (*os.File, error) {
	mapFile := fmt.Sprintf("%s/%d/map_files/%x-%x", procFS, pid, e.start, e.end)
	f, err := os.Open(mapFile)
	if err == nil {
		return f, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		if _, statErr := os.Stat(fmt.Sprintf("%s/%d", procFS, pid)); statErr != nil {
			return nil, procErr(mapFile, err)
		}
	}
	if e.deleted {
		return nil, fmt.Errorf("opening %s: %w", mapFile, err)
	}
	rootPath := fmt.Sprintf("%s/%d/root%s", procFS, pid, e.path)
	f, err2 := os.Open(rootPath)
	if err2 != nil {
		return nil, fmt.Errorf("opening %s: %w; %s: %w", mapFile, err, rootPath, err2)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", rootPath, err)
	}
	if st.Ino != e.inode {
		f.Close()
		return nil, fmt.Errorf("opening %s: %w; %s is no longer the mapped file", mapFile, err, rootPath)
	}
	return f, nil
}

// fileCache holds per-file data for the most recently used files. Processes
// keep the fileInfo of their mappings, so eviction only costs a re-parse when
// a new process maps an evicted file.
type fileCache struct {
	lru *libpf.LRU[fileKey, *fileInfo]
	log logrus.FieldLogger
	// runtimes are looked for in every file.
	runtimes []*interpreter.Runtime
	// debugDirs are searched for the symbols of stripped files.
	debugDirs    []string
	hits, misses uint64
	elfErrors    uint64
	// runtimeErrors counts files a runtime found its own but could not
	// read (Runtime.Recognise errors).
	runtimeErrors uint64
}

// fileForMapping returns the data of the file behind a mapping, parsing it
// on a cache miss.
func (c *fileCache) fileForMapping(procFS string, pid uint32, e *mapsEntry) (*fileInfo, error) {
	f, err := openMapping(procFS, pid, e)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", e.path, err)
	}
	return c.get(keyFromStat(&st), f, e.path)
}

// vdsoForMapping reads the vDSO image from the process's memory. Every
// process of one ABI shares the image, so it is cached by content.
func (c *fileCache) vdsoForMapping(procFS string, pid uint32, e *mapsEntry) (*fileInfo, error) {
	image, err := readVDSO(procFS, pid, e)
	if err != nil {
		return nil, err
	}
	key := fileKey{dev: vdsoDev, ino: xxh3.Hash(image), size: int64(len(image))}
	return c.get(key, bytes.NewReader(image), vdsoPath)
}

// readVDSO copies a process's vDSO image out of its memory: the vDSO has no
// file to open.
func readVDSO(procFS string, pid uint32, e *mapsEntry) ([]byte, error) {
	const maxVDSOSize = 1 << 20
	size := e.end - e.start
	if size == 0 || size > maxVDSOSize {
		return nil, fmt.Errorf("vdso of %d bytes", size)
	}
	memPath := fmt.Sprintf("%s/%d/mem", procFS, pid)
	mem, err := os.Open(memPath)
	if err != nil {
		return nil, procErr(memPath, err)
	}
	defer mem.Close()
	image := make([]byte, size)
	if _, err := mem.ReadAt(image, int64(e.start)); err != nil {
		return nil, procErr(memPath, err)
	}
	return image, nil
}

// mappedImage is the bytes behind an executable mapping: its file, or a
// copy of the vDSO.
type mappedImage interface {
	io.ReaderAt
	io.Closer
}

type vdsoImage struct{ *bytes.Reader }

func (vdsoImage) Close() error { return nil }

// openImage opens what a mapping maps, to extract its stack deltas.
func openImage(procFS string, pid uint32, e *mapsEntry) (mappedImage, error) {
	if e.isVDSO() {
		image, err := readVDSO(procFS, pid, e)
		if err != nil {
			return nil, err
		}
		return vdsoImage{bytes.NewReader(image)}, nil
	}
	return openMapping(procFS, pid, e)
}

type readSeekerAt interface {
	io.ReadSeeker
	io.ReaderAt
}

func (c *fileCache) get(key fileKey, r readSeekerAt, name string) (*fileInfo, error) {
	if fi, ok := c.lru.Get(key); ok {
		c.hits++
		return fi, nil
	}
	c.misses++
	id, err := libpf.FileIDFromExecutable(r)
	if err != nil {
		return nil, fmt.Errorf("file id of %s: %w", name, err)
	}
	fi := &fileInfo{id: id, size: key.size}
	if isELF(r) {
		// A corrupt ELF file still has a file id; it just cannot be
		// symbolized locally.
		if fi.elf, err = parseELF(r, name, c.runtimes, c.debugDirs); err != nil {
			c.elfErrors++
			c.log.WithError(err).Debugf("not symbolizing %s", name)
		}
		if fi.elf != nil {
			for _, err := range fi.elf.recogniseErrs {
				c.runtimeErrors++
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
	c.lru.Add(key, fi, 0)
	return fi, nil
}

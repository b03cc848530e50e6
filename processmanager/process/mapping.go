package process

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// OpenMapping opens the file behind a mapping. /proc/PID/map_files works
// for deleted files and files in other mount namespaces; /proc/PID/root/<path>
// is the fallback for kernels or setups where map_files is not readable, and
// is checked to still be the mapped inode.
func (fs FS) OpenMapping(pid uint32, e *MapsEntry) (*os.File, error) {
	mapFile := fs.mapFile(pid, e.Start, e.End)
	f, err := os.Open(mapFile)
	if err == nil {
		return f, nil
	}
	if errors.Is(err, os.ErrNotExist) && !fs.runs(pid) {
		return nil, procErr(mapFile, err)
	}
	if e.Deleted {
		return nil, fmt.Errorf("opening %s: %w", mapFile, err)
	}
	rootPath := fs.Root(pid) + e.Path
	f, err2 := os.Open(rootPath)
	if err2 != nil {
		return nil, fmt.Errorf("opening %s: %w; %s: %w", mapFile, err, rootPath, err2)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", rootPath, err)
	}
	if st.Ino != e.Inode {
		f.Close()
		return nil, fmt.Errorf("opening %s: %w; %s is no longer the mapped file", mapFile, err, rootPath)
	}
	return f, nil
}

// MappingPath reads the mapping's /proc/PID/map_files link.
func (fs FS) MappingPath(pid uint32, start, end uint64) (path string, deleted bool, err error) {
	link := fs.mapFile(pid, start, end)
	target, err := os.Readlink(link)
	if err != nil {
		if fs.runs(pid) {
			return "", false, ErrMappingGone
		}
		return "", false, procErr(link, err)
	}
	path, deleted = strings.CutSuffix(target, deletedSuffix)
	return path, deleted, nil
}

func (fs FS) mapFile(pid uint32, start, end uint64) string {
	return fmt.Sprintf("%s/map_files/%x-%x", fs.dir(pid), start, end)
}

// ReadVDSO copies a process's vDSO image out of its memory: the vDSO has
// no file to open.
func ReadVDSO(src Source, pid uint32, e *MapsEntry) ([]byte, error) {
	const maxVDSOSize = 1 << 20
	size := e.End - e.Start
	if size == 0 || size > maxVDSOSize {
		return nil, fmt.Errorf("vdso of %d bytes", size)
	}
	mem, err := src.OpenMemory(pid)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	image := make([]byte, size)
	if _, err := mem.ReadAt(image, int64(e.Start)); err != nil {
		return nil, memErr(pid, err)
	}
	return image, nil
}

// memErr wraps an error reading a process's memory; see procErr.
func memErr(pid uint32, err error) error {
	return procErr(fmt.Sprintf("memory of process %d", pid), err)
}

type vdsoImage struct{ *bytes.Reader }

func (vdsoImage) Close() error { return nil }

// OpenImage opens the bytes behind an executable mapping: its file, or a
// copy of the vDSO.
func OpenImage(src Source, pid uint32, e *MapsEntry) (ReadAtCloser, error) {
	if e.IsVDSO() {
		image, err := ReadVDSO(src, pid, e)
		if err != nil {
			return nil, err
		}
		return vdsoImage{bytes.NewReader(image)}, nil
	}
	return src.OpenMapping(pid, e)
}

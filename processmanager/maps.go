package processmanager

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mapsEntry is one line of /proc/PID/maps.
type mapsEntry struct {
	start, end, offset uint64
	// dev and inode identify the mapped file; both are zero for anonymous
	// memory.
	dev, inode uint64
	// path is the file's path with any " (deleted)" suffix removed, a
	// pseudo path such as "[vdso]", or "" for anonymous memory.
	path       string
	deleted    bool
	executable bool
	// inaccessible: mapped with no access at all (PROT_NONE), as
	// reserves and guard pages are.
	inaccessible bool
}

const (
	vdsoPath      = "[vdso]"
	deletedSuffix = " (deleted)"
)

// isFile reports whether the entry maps a regular file.
func (e *mapsEntry) isFile() bool { return strings.HasPrefix(e.path, "/") }

func (e *mapsEntry) isVDSO() bool { return e.path == vdsoPath }

// sameAs reports whether two entries describe the same mapping of the same
// file, so state derived from one holds for the other.
func (e *mapsEntry) sameAs(o *mapsEntry) bool {
	return e.start == o.start && e.end == o.end && e.offset == o.offset &&
		e.dev == o.dev && e.inode == o.inode && e.path == o.path
}

// parseMapsLine parses one line of /proc/PID/maps:
//
//	start-end perms offset major:minor inode   path
//
// The path is everything after the padding that follows the inode, so it may
// contain spaces.
func parseMapsLine(line string) (mapsEntry, error) {
	var e mapsEntry
	fields := [5]string{}
	rest := line
	for i := range fields {
		var ok bool
		fields[i], rest, ok = strings.Cut(rest, " ")
		if !ok && i < len(fields)-1 {
			return e, fmt.Errorf("maps line %q: too few fields", line)
		}
	}
	addrs, perms, offset, dev, inode := fields[0], fields[1], fields[2], fields[3], fields[4]

	start, end, ok := strings.Cut(addrs, "-")
	if !ok {
		return e, fmt.Errorf("maps line %q: bad address range", line)
	}
	var err error
	if e.start, err = strconv.ParseUint(start, 16, 64); err != nil {
		return e, fmt.Errorf("maps line %q: start: %w", line, err)
	}
	if e.end, err = strconv.ParseUint(end, 16, 64); err != nil {
		return e, fmt.Errorf("maps line %q: end: %w", line, err)
	}
	if e.end < e.start {
		return e, fmt.Errorf("maps line %q: end before start", line)
	}
	if len(perms) != 4 {
		return e, fmt.Errorf("maps line %q: bad permissions", line)
	}
	e.executable = perms[2] == 'x'
	e.inaccessible = perms[:3] == "---"
	if e.offset, err = strconv.ParseUint(offset, 16, 64); err != nil {
		return e, fmt.Errorf("maps line %q: offset: %w", line, err)
	}
	major, minor, ok := strings.Cut(dev, ":")
	if !ok {
		return e, fmt.Errorf("maps line %q: bad device", line)
	}
	maj, err1 := strconv.ParseUint(major, 16, 32)
	mnr, err2 := strconv.ParseUint(minor, 16, 32)
	if err := errors.Join(err1, err2); err != nil {
		return e, fmt.Errorf("maps line %q: device: %w", line, err)
	}
	e.dev = unix.Mkdev(uint32(maj), uint32(mnr))
	if e.inode, err = strconv.ParseUint(inode, 10, 64); err != nil {
		return e, fmt.Errorf("maps line %q: inode: %w", line, err)
	}
	e.path = strings.TrimLeft(rest, " ")
	if e.inode != 0 && strings.HasSuffix(e.path, deletedSuffix) {
		e.path = strings.TrimSuffix(e.path, deletedSuffix)
		e.deleted = true
	}
	return e, nil
}

// parseMaps returns the executable mappings of a maps file, or all of them,
// in address order (the kernel lists them sorted).
func parseMaps(r io.Reader, all bool) ([]mapsEntry, error) {
	var out []mapsEntry
	s := bufio.NewScanner(r)
	// A line is at most a PATH_MAX path plus ~100 bytes of fields.
	s.Buffer(make([]byte, 0, 8192), unix.PathMax+256)
	for s.Scan() {
		e, err := parseMapsLine(s.Text())
		if err != nil {
			return nil, err
		}
		if all || e.executable {
			out = append(out, e)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// readMaps reads the executable mappings of a process, or all of them.
func readMaps(procFS string, pid uint32, all bool) ([]mapsEntry, error) {
	path := fmt.Sprintf("%s/%d/maps", procFS, pid)
	f, err := os.Open(path)
	if err != nil {
		return nil, procErr(path, err)
	}
	defer f.Close()
	entries, err := parseMaps(f, all)
	if err != nil {
		return nil, procErr(path, err)
	}
	return entries, nil
}

// procErr wraps an error reading a process's /proc files, mapping the ways a
// vanished process shows up to ErrProcessExited.
func procErr(path string, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("reading %s: %w (%w)", path, ErrProcessExited, err)
	}
	return fmt.Errorf("reading %s: %w", path, err)
}

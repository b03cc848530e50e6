package process

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/hostprof/ebpf-profiler/processmanager/processctx"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MapsEntry is one line of /proc/PID/maps.
type MapsEntry struct {
	Start, End, Offset uint64
	// Dev and Inode identify the mapped file; both are zero for anonymous
	// memory.
	Dev, Inode uint64
	// Path is the file's path with any " (deleted)" suffix removed, a
	// pseudo path such as "[vdso]", or "" for anonymous memory.
	Path       string
	Deleted    bool
	Executable bool
	// Inaccessible: mapped with no access at all (PROT_NONE), as
	// reserves and guard pages are.
	Inaccessible bool
}

const (
	// VDSOPath is the path maps shows for the vDSO.
	VDSOPath      = "[vdso]"
	deletedSuffix = " (deleted)"
)

// IsFile reports whether the entry maps a regular file.
func (e *MapsEntry) IsFile() bool { return strings.HasPrefix(e.Path, "/") }

func (e *MapsEntry) IsVDSO() bool { return e.Path == VDSOPath }

// SameAs reports whether two entries describe the same mapping of the same
// file, so state derived from one holds for the other.
func (e *MapsEntry) SameAs(o *MapsEntry) bool {
	return e.Start == o.Start && e.End == o.End && e.Offset == o.Offset &&
		e.Dev == o.Dev && e.Inode == o.Inode && e.Path == o.Path
}

// parseMapsLine parses one line of /proc/PID/maps:
//
//	start-end perms offset major:minor inode   path
//
// The path is everything after the padding that follows the inode, so it may
// contain spaces.
func parseMapsLine(line string) (MapsEntry, error) {
	var e MapsEntry
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
	if e.Start, err = strconv.ParseUint(start, 16, 64); err != nil {
		return e, fmt.Errorf("maps line %q: start: %w", line, err)
	}
	if e.End, err = strconv.ParseUint(end, 16, 64); err != nil {
		return e, fmt.Errorf("maps line %q: end: %w", line, err)
	}
	if e.End < e.Start {
		return e, fmt.Errorf("maps line %q: end before start", line)
	}
	if len(perms) != 4 {
		return e, fmt.Errorf("maps line %q: bad permissions", line)
	}
	e.Executable = perms[2] == 'x'
	e.Inaccessible = perms[:3] == "---"
	if e.Offset, err = strconv.ParseUint(offset, 16, 64); err != nil {
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
	e.Dev = unix.Mkdev(uint32(maj), uint32(mnr))
	if e.Inode, err = strconv.ParseUint(inode, 10, 64); err != nil {
		return e, fmt.Errorf("maps line %q: inode: %w", line, err)
	}
	e.Path = strings.TrimLeft(rest, " ")
	if e.Inode != 0 && strings.HasSuffix(e.Path, deletedSuffix) {
		e.Path = strings.TrimSuffix(e.Path, deletedSuffix)
		e.Deleted = true
	}
	return e, nil
}

// parseMaps returns the mappings of a maps file that which selects, in
// address order (the kernel lists them sorted).
func parseMaps(r io.Reader, which Mappings) ([]MapsEntry, error) {
	var out []MapsEntry
	s := bufio.NewScanner(r)
	// A line is at most a PATH_MAX path plus ~100 bytes of fields.
	s.Buffer(make([]byte, 0, 8192), unix.PathMax+256)
	for s.Scan() {
		e, err := parseMapsLine(s.Text())
		if err != nil {
			return nil, err
		}
		if which == AllMappings || e.Executable || processctx.IsMapping(e.Path, e.Executable) {
			out = append(out, e)
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func (fs FS) Maps(pid uint32, which Mappings) ([]MapsEntry, error) {
	path := fs.dir(pid) + "/maps"
	f, err := os.Open(path)
	if err != nil {
		return nil, procErr(path, err)
	}
	defer f.Close()
	entries, err := parseMaps(f, which)
	if err != nil {
		return nil, procErr(path, err)
	}
	return entries, nil
}

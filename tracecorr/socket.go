package tracecorr

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Refusal is why an agent's socket path was not used. The path comes from
// the agent's process, which may be hostile: resolved naively through
// /proc/PID/root it could make a root daemon write to any socket of the
// host.
type Refusal int

const (
	// RefusedPath: empty, relative, too long or holding a NUL byte.
	RefusedPath Refusal = iota
	// RefusedDotDot: the path has a ".." component.
	RefusedDotDot
	// RefusedEscape: a symlink on the way leads above the process's root.
	RefusedEscape
	// RefusedSymlinks: more symlinks on the way than the kernel follows.
	RefusedSymlinks
	// RefusedNotSocket: the file is not a socket, or a directory on the
	// way is not a directory.
	RefusedNotSocket
	// RefusedOwner: the socket is not owned by the process's user.
	RefusedOwner
	numRefusals
)

func (r Refusal) String() string {
	switch r {
	case RefusedPath:
		return "bad path"
	case RefusedDotDot:
		return "path with .."
	case RefusedEscape:
		return "symlink leaving the process's root"
	case RefusedSymlinks:
		return "too many symlinks"
	case RefusedNotSocket:
		return "not a socket"
	case RefusedOwner:
		return "socket not owned by the process's user"
	}
	return "unknown"
}

// RefusedError is the error of a refused socket path.
type RefusedError struct {
	Reason Refusal
	Path   string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refusing APM socket %q: %s", e.Path, e.Reason)
}

// maxSymlinks is how many symlinks a path may go through, as in the kernel
// (MAXSYMLINKS).
const maxSymlinks = 40

// agentSocket is a datagram socket connected to an agent's socket.
type agentSocket struct {
	fd int
	// id identifies the agent's socket file: a new file at the same path
	// is a new socket, which needs a new registration.
	id fileID
}

// fileID identifies a file: the inode number alone does not, as a file
// system may give a new file the number of one just removed.
type fileID struct {
	dev, ino uint64
	ctime    unix.Timespec
}

func fileIDOf(st *unix.Stat_t) fileID { return fileID{st.Dev, st.Ino, st.Ctim} }

func (s *agentSocket) close() { unix.Close(s.fd) }

// openAgentSocket connects a non-blocking datagram socket to the agent
// socket at path as process pid sees it. Every component is opened
// relative to the one before, without following symlinks: a symlink's
// target is resolved by us, inside the process's root, so neither the
// path nor a symlink on the way, nor one swapped in while we look, leads
// outside it. The final file must be a socket owned by the process's
// effective user. A path that does not exist yet is an ordinary error (the
// agent may still be creating it); what is refused is a *RefusedError.
func openAgentSocket(procFS string, pid uint32, path string) (*agentSocket, error) {
	if path == "" || path[0] != '/' || len(path) > maxPathBytes || strings.IndexByte(path, 0) >= 0 {
		return nil, &RefusedError{RefusedPath, path}
	}
	for _, c := range strings.Split(path, "/") {
		if c == ".." {
			return nil, &RefusedError{RefusedDotDot, path}
		}
	}
	uid, err := processUID(procFS, pid)
	if err != nil {
		return nil, err
	}
	fd, st, err := resolveInRoot(procFS, pid, path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		return nil, &RefusedError{RefusedNotSocket, path}
	case st.Uid != uid:
		return nil, &RefusedError{RefusedOwner, path}
	}
	return connectFD(fd, st)
}

// resolveInRoot resolves path inside the root of process pid (see
// resolveBeneath).
func resolveInRoot(procFS string, pid uint32, path string) (int, unix.Stat_t, error) {
	root, err := unix.Open(fmt.Sprintf("%s/%d/root", procFS, pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, unix.Stat_t{}, fmt.Errorf("opening the root of process %d: %w", pid, err)
	}
	defer unix.Close(root)
	return resolveBeneath(root, path)
}

// resolveBeneath opens path (absolute, without "..") beneath the directory
// root, resolving symlinks as the process whose root that is would, and
// returns an O_PATH descriptor of the final file with its stat.
func resolveBeneath(root int, path string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	// dirs is the chain of directories from root to the current one, so
	// that a ".." in a symlink target goes back one, and never above root.
	dirs := []int{root}
	defer func() {
		for _, d := range dirs[1:] {
			unix.Close(d)
		}
	}()
	todo := splitPath(path)
	links := 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		cur := dirs[len(dirs)-1]
		if name == ".." {
			if len(dirs) == 1 {
				return -1, st, &RefusedError{RefusedEscape, path}
			}
			unix.Close(cur)
			dirs = dirs[:len(dirs)-1]
			continue
		}
		fd, err := unix.Openat(cur, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, st, fmt.Errorf("opening %q of APM socket %q: %w", name, path, err)
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, st, fmt.Errorf("stat of %q of APM socket %q: %w", name, path, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := readlinkFD(fd)
			unix.Close(fd)
			if err != nil {
				return -1, st, fmt.Errorf("reading symlink %q of APM socket %q: %w", name, path, err)
			}
			if links++; links > maxSymlinks {
				return -1, st, &RefusedError{RefusedSymlinks, path}
			}
			if strings.HasPrefix(target, "/") {
				for _, d := range dirs[1:] {
					unix.Close(d)
				}
				dirs = dirs[:1]
			}
			todo = append(splitPath(target), todo...)
		case unix.S_IFDIR:
			if len(todo) == 0 {
				return fd, st, nil // the caller refuses it: not a socket
			}
			dirs = append(dirs, fd)
		default:
			if len(todo) > 0 {
				unix.Close(fd)
				return -1, st, &RefusedError{RefusedNotSocket, path}
			}
			return fd, st, nil
		}
	}
	// The path named the root itself, or a symlink to it.
	fd, err := unix.Openat(dirs[len(dirs)-1], ".", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, err
	}
	return fd, st, unix.Fstat(fd, &st)
}

// splitPath is a path's non-empty components other than ".".
func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// readlinkFD reads the target of the symlink that fd (O_PATH|O_NOFOLLOW)
// is.
func readlinkFD(fd int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", err
	}
	if n >= len(buf) {
		return "", errors.New("symlink target too long")
	}
	return string(buf[:n]), nil
}

// connectFD connects a new non-blocking datagram socket to the socket file
// that fd (O_PATH) is. Going through /proc/self/fd connects to that very
// file, not to whatever its path names by now, and lifts sun_path's
// 108-byte limit.
func connectFD(fd int, st unix.Stat_t) (*agentSocket, error) {
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating a datagram socket: %w", err)
	}
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(fd)}); err != nil {
		unix.Close(s)
		if errors.Is(err, unix.EACCES) {
			// Connecting takes write permission on the socket file.
			return nil, fmt.Errorf("connecting to the APM socket: %w (the daemon needs CAP_DAC_OVERRIDE "+
				"for sockets its user may not write)", err)
		}
		return nil, fmt.Errorf("connecting to the APM socket: %w", err)
	}
	return &agentSocket{fd: s, id: fileIDOf(&st)}, nil
}

// processUID is the effective user id of a process (/proc/PID/status).
func processUID(procFS string, pid uint32) (uint32, error) {
	f, err := os.Open(fmt.Sprintf("%s/%d/status", procFS, pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Uid:")
		if !ok {
			continue
		}
		// Real, effective, saved and filesystem uids.
		ids := strings.Fields(rest)
		if len(ids) < 2 {
			break
		}
		uid, err := strconv.ParseUint(ids[1], 10, 32)
		if err != nil {
			break
		}
		return uint32(uid), nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no Uid line in %s/%d/status", procFS, pid)
}

// sameSocket says whether path, resolved as openAgentSocket does, still
// names the socket s is connected to.
func sameSocket(procFS string, pid uint32, path string, s *agentSocket) bool {
	fd, st, err := resolveInRoot(procFS, pid, path)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return fileIDOf(&st) == s.id
}

// Package process reads running processes: their state, mappings, files,
// memory and description. Source is what the process manager reads them
// through; FS reads them from a procfs mount. Everything read here is a
// snapshot that may be stale as soon as it returns, and a process that
// exits while it is read is ErrExited.
package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// ErrExited says a process went away while it was read. It is expected
// (short-lived processes, samples that arrive after the exit): callers
// count it rather than log it.
var ErrExited = errors.New("process exited")

// ErrMappingGone says a mapping was unmapped or changed before it was read,
// in a process that still runs.
var ErrMappingGone = errors.New("mapping gone")

// Mappings selects the mappings Source.Maps returns.
type Mappings int

const (
	// ExecutableMappings are the mappings with execute permission, and
	// an OpenTelemetry process context's (processctx.IsMapping).
	ExecutableMappings Mappings = iota
	AllMappings
)

// ReadAtCloser is memory or a file, read at offsets and closed after use.
type ReadAtCloser interface {
	io.ReaderAt
	io.Closer
}

// Source is what a process is read through, one method per kind of read.
// Methods taking a pid return ErrExited (wrapped) when the process is gone.
// A Source is used from several goroutines at once.
type Source interface {
	// Stat returns the process's state; a zombie counts as exited.
	Stat(pid uint32) (Stat, error)
	// Maps returns the process's mappings in address order.
	Maps(pid uint32, which Mappings) ([]MapsEntry, error)
	// Info describes the process, best effort; comm is the name to fall
	// back on.
	Info(pid uint32, comm string) *libpf.ProcessInfo
	// Executable returns the path of the process's executable, as Info
	// gives it.
	Executable(pid uint32) (string, error)
	// OpenMapping opens the file a mapping maps, even where it was
	// deleted or lies in another mount namespace.
	OpenMapping(pid uint32, e *MapsEntry) (*os.File, error)
	// MappingPath returns the path of the file mapped at start-end as maps
	// shows it, and whether it was deleted; ErrMappingGone when the
	// process runs but no longer maps it there.
	MappingPath(pid uint32, start, end uint64) (path string, deleted bool, err error)
	// OpenMemory opens the process's memory, addressed as the process sees
	// it.
	OpenMemory(pid uint32) (ReadAtCloser, error)
	// NamespacePID is the process's pid in its innermost pid namespace.
	NamespacePID(pid uint32) (uint32, error)
	// Root is the process's root directory: paths in its mount namespace
	// are opened below it.
	Root(pid uint32) string
	// PIDs lists the processes that run now.
	PIDs() ([]uint32, error)
	// Kallsyms opens the kernel's symbol table (the kallsyms format).
	Kallsyms() (io.ReadCloser, error)
}

// FS reads processes from procfs mounted at Mount ("/proc" on a host; a
// containerized daemon may see the host's elsewhere).
type FS struct {
	Mount string
}

var _ Source = FS{}

// Usable says why the mount holds no procfs, nil when it does.
func (fs FS) Usable() error {
	_, err := os.Stat(fs.Mount + "/self")
	return err
}

// dir is the process's directory.
func (fs FS) dir(pid uint32) string { return fmt.Sprintf("%s/%d", fs.Mount, pid) }

// runs says whether the process's directory is there, to tell a process
// that exited from one of its files that went.
func (fs FS) runs(pid uint32) bool {
	_, err := os.Stat(fs.dir(pid))
	return err == nil
}

func (fs FS) Root(pid uint32) string { return fs.dir(pid) + "/root" }

func (fs FS) OpenMemory(pid uint32) (ReadAtCloser, error) {
	path := fs.dir(pid) + "/mem"
	f, err := os.Open(path)
	if err != nil {
		return nil, procErr(path, err)
	}
	return f, nil
}

func (fs FS) Kallsyms() (io.ReadCloser, error) { return os.Open(fs.Mount + "/kallsyms") }

// PIDs lists the numeric entries of the mount; pid 0 has none.
func (fs FS) PIDs() ([]uint32, error) {
	entries, err := os.ReadDir(fs.Mount)
	if err != nil {
		return nil, err
	}
	pids := make([]uint32, 0, len(entries))
	for _, e := range entries {
		if pid, err := strconv.ParseUint(e.Name(), 10, 32); err == nil && pid != 0 {
			pids = append(pids, uint32(pid))
		}
	}
	return pids, nil
}

// procErr wraps an error reading a process's procfs files, mapping the
// ways a vanished process shows up to ErrExited.
func procErr(path string, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("reading %s: %w (%w)", path, ErrExited, err)
	}
	return fmt.Errorf("reading %s: %w", path, err)
}

// Package perfmap names JIT code from the perf map a process writes,
// /tmp/perf-PID.map (Node with --perf-basic-prof, Java perf agents, .NET with
// DOTNET_PerfMapEnabled=1, Julia, …). It is a runtime without a BPF
// unwinder: it claims the process's anonymous executable mappings, which the
// native unwinder then walks with frame pointers as known code, and names
// the frames in them.
//
// The file is the target's, so it is read as hostile input: inside the
// process's own root and mount namespace and under its namespaced pid,
// never following a symlink out of that root, never blocking on a fifo,
// and within bounds of size, line length and entries.
package perfmap

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Runtime is the perf map reader as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:        "perfmap",
	DisplayName: "perf map",
	Detect:      detect,
	// A process looks for a perf map again when its mappings change, and
	// otherwise now and then: runtimes write it when they start.
	RetryMin: time.Second,
	RetryMax: 30 * time.Second,
	// A runtime frees code and reuses its addresses for other code, whose
	// later lines a sampled process's table must not wait long for.
	UpdateEvery: time.Second,
}

func init() { interpreter.Register(Runtime) }

// Bounds of one process's perf map.
const (
	// maxFileBytes: a larger file is refused. A busy Node service writes
	// a few MiB an hour.
	maxFileBytes = 256 << 20
	// maxEntries and maxNameBytes bound what is held of it.
	maxEntries   = 1 << 20
	maxNameBytes = 64 << 20
	// readChunk is read per system call.
	readChunk = 1 << 20
)

// Errors that refuse a perf map; each is a reason the process manager
// counts.
var (
	ErrSymlink    = errors.New("perf map is a symlink")
	ErrNotRegular = errors.New("perf map is not a regular file")
	ErrTooLarge   = errors.New("perf map too large")
	ErrFull       = errors.New("perf map has more entries than are kept")
)

// detect attaches to a process with anonymous executable memory and a perf
// map; nil, nil when it has either not (yet).
func detect(h interpreter.Host) (interpreter.Process, error) {
	regions := anonymousCode(h.Mappings())
	if len(regions) == 0 {
		return nil, nil
	}
	nspid, err := h.NamespacePID()
	if err != nil {
		return nil, err
	}
	f, err := open(h.Root(), fmt.Sprintf("tmp/perf-%d.map", nspid))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p := &process{f: f}
	if _, err := p.read(); err != nil {
		p.Detach()
		return nil, err
	}
	if err := h.SetRegions(regions); err != nil {
		p.Detach()
		return nil, err
	}
	p.regions = regions
	return p, nil
}

// open opens path inside the directory root as the process sees it:
// symlinks resolve inside that root (RESOLVE_IN_ROOT, 5.6+), the file
// itself may not be one, and only a regular file is opened for reading:
// opening a fifo may block and opening a device runs its driver (a
// watchdog starts counting down), so the file is looked at through an
// O_PATH descriptor first.
func open(root, path string) (*os.File, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dir)
	name := root + "/" + path
	fd, err := unix.Openat2(dir, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, interpreter.Refuse("symlink", fmt.Errorf("%s: %w", name, ErrSymlink))
	case err != nil:
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK: // O_PATH|O_NOFOLLOW opens the link itself
		return nil, interpreter.Refuse("symlink", fmt.Errorf("%s: %w", name, ErrSymlink))
	default:
		return nil, interpreter.Refuse("not_regular", fmt.Errorf("%s: %w", name, ErrNotRegular))
	}
	// Open the file just looked at, not its path, which may name
	// another by now.
	rfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(rfd), name), nil
}

// anonymousCode lists the anonymous executable mappings: JIT code.
func anonymousCode(ms []interpreter.Mapping) []interpreter.Region {
	var out []interpreter.Region
	for _, m := range ms {
		if m.Anonymous() {
			out = append(out, interpreter.Region{Start: m.Start, End: m.End})
		}
	}
	return out
}

// process is a process whose perf map is being read.
type process struct {
	f *os.File
	// offset is how far the file has been parsed.
	offset int64
	table  table
	// regions are the anonymous mappings claimed.
	regions []interpreter.Region
}

// read parses what the file gained since the last read; changed says
// the table did.
func (p *process) read() (changed bool, err error) {
	if p.f == nil {
		return false, interpreter.ErrDetached
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(p.f.Fd()), &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", p.f.Name(), err)
	}
	if st.Size > maxFileBytes {
		return false, interpreter.Refuse("too_large", fmt.Errorf("%s: %d bytes: %w", p.f.Name(), st.Size, ErrTooLarge))
	}
	if st.Size < p.offset {
		// Truncated and rewritten: start over.
		p.offset, p.table, changed = 0, table{}, true
	}
	entries := len(p.table.entries)
	defer func() { changed = changed || len(p.table.entries) != entries }()
	for p.offset < st.Size {
		buf := make([]byte, min(st.Size-p.offset, readChunk))
		got, err := p.f.ReadAt(buf, p.offset)
		if err != nil && !errors.Is(err, io.EOF) {
			return changed, fmt.Errorf("reading %s: %w", p.f.Name(), err)
		}
		if got == 0 {
			break
		}
		consumed, full := p.table.parse(buf[:got], maxEntries, maxNameBytes)
		p.offset += int64(consumed)
		if full {
			return changed, interpreter.Refuse("full", fmt.Errorf("%s: %w (%d)", p.f.Name(), ErrFull, maxEntries))
		}
		if consumed == 0 {
			break // an incomplete last line
		}
	}
	return changed, nil
}

// Update reads what the process appended to its perf map and claims the
// anonymous code it mapped since.
func (p *process) Update(h interpreter.Host) (changed bool, err error) {
	if changed, err = p.read(); err != nil {
		return changed, err
	}
	regions := anonymousCode(h.Mappings())
	if !slices.Equal(regions, p.regions) {
		if err := h.SetRegions(regions); err != nil {
			return changed, err
		}
		p.regions, changed = regions, true
	}
	return changed, nil
}

// SymbolizeAddr names the JIT code at a process address.
func (p *process) SymbolizeAddr(addr uint64) (libpf.Frame, bool) {
	name, ok := p.table.lookup(addr)
	if !ok {
		return libpf.Frame{}, false
	}
	return libpf.Frame{Kind: libpf.FrameNative, Address: addr, FunctionName: name}, true
}

// Symbolize is never called: the reader has no BPF unwinder and so no
// frames of its own.
func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	return out, fmt.Errorf("perf map: no frames of kind %d", f.Kind)
}

// Detach closes the file.
func (p *process) Detach() {
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	p.table = table{}
}

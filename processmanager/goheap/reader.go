package goheap

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
)

// ErrProfilingOff says a Go program keeps no memory profile: its
// MemProfileRate is 0, as the linker makes it in programs that cannot read
// their profile (no runtime/pprof, no runtime.MemProfile).
var ErrProfilingOff = errors.New("the program keeps no memory profile (MemProfileRate 0)")

// Profile is one read of a Go process's heap profile.
type Profile struct {
	// Rate is the program's MemProfileRate: the period of the profile,
	// in bytes.
	Rate    int64
	Samples []Sample
	// Skipped counts buckets left out because their counts read torn.
	Skipped int
	// Resolve names an address of the samples' stacks. It is safe for
	// concurrent use.
	Resolve func(addr uint64) Frame
}

// maxExecutables bounds the executables Reader keeps open with their
// tables.
const maxExecutables = 16

// Reader reads Go processes' heap profiles, keeping what it found of each
// executable (where its globals are, its function and line tables) for
// the next read. It is safe for concurrent use.
type Reader struct {
	mu    sync.Mutex
	execs map[exeKey]*executable
	order []exeKey // least recently used first
	col   collectState
	// goChecks are IsGo's answers.
	goChecks map[exeKey]bool
}

// errUnsupported says a program's heap profile cannot be found or
// symbolized (a release or build Locate does not know, no pclntab).
var errUnsupported = errors.New("cannot find or symbolize the heap profile")

// exeOf is the path of pid's executable in procfs and the file's key.
func exeOf(pid int) (string, exeKey, error) {
	path := fmt.Sprintf("/proc/%d/exe", pid)
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return path, exeKey{}, err
	}
	return path, exeKey{dev: st.Dev, ino: st.Ino, mtime: st.Mtim.Nano()}, nil
}

// exeKey identifies an executable file.
type exeKey struct {
	dev, ino uint64
	mtime    int64
}

type executable struct {
	file *os.File
	prog Program
	// pie says the executable is position-independent; firstLoad is its
	// first loadable segment's address less its file offset.
	pie       bool
	firstLoad uint64
	resolve   func(pc uint64) Frame // guarded by mu
	mu        sync.Mutex
	err       error
}

// NewReader returns a Reader.
func NewReader() *Reader {
	return &Reader{execs: map[exeKey]*executable{}, goChecks: map[exeKey]bool{}}
}

// Read reads the heap profile of Go process pid.
func (r *Reader) Read(pid int) (Profile, error) {
	p, _, err := r.read(pid)
	return p, err
}

// read is Read, also returning the key of pid's executable.
func (r *Reader) read(pid int) (Profile, exeKey, error) {
	exe, key, err := r.executable(pid)
	if err != nil {
		return Profile{}, key, err
	}
	p, err := exe.read(pid)
	return p, key, err
}

func (exe *executable) read(pid int) (Profile, error) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return Profile{}, err
	}
	defer mem.Close()
	m := procmem.New(mem)
	bias, err := loadBias(pid, exe)
	if err != nil {
		return Profile{}, err
	}
	rate, err := m.U64(exe.prog.Rate + bias)
	if err != nil {
		return Profile{}, fmt.Errorf("reading MemProfileRate: %w", err)
	}
	if rate == 0 {
		return Profile{}, ErrProfilingOff
	}
	var cycle uint32
	var flushed bool
	if exe.prog.Minor == 18 {
		var b [5]byte
		err = m.Read(exe.prog.Cycle+bias, b[:])
		cycle, flushed = uint32(b[0])|uint32(b[1])<<8|uint32(b[2])<<16|uint32(b[3])<<24, b[4] != 0
	} else {
		var v uint32
		v, err = m.U32(exe.prog.Cycle + bias)
		cycle, flushed = v>>1, v&1 != 0
	}
	if err != nil {
		return Profile{}, fmt.Errorf("reading the profile's cycle: %w", err)
	}
	l, _ := LayoutFor(exe.prog.Minor)
	buckets, skipped, err := Read(m, l, exe.prog.Buckets+bias, cycle, flushed)
	if err != nil {
		return Profile{}, err
	}
	// The stacks hold the process's addresses; the tables, the file's.
	for _, b := range buckets {
		for i := range b.Stack {
			b.Stack[i] -= bias
		}
	}
	exe.mu.Lock()
	defer exe.mu.Unlock()
	return Profile{Rate: int64(rate), Samples: Samples(buckets, exe.resolve, exe.prog.Minor, int64(rate)), Skipped: skipped,
		Resolve: exe.resolveLocked}, nil
}

// resolveLocked is exe.resolve under its mutex.
func (exe *executable) resolveLocked(addr uint64) Frame {
	exe.mu.Lock()
	defer exe.mu.Unlock()
	return exe.resolve(addr)
}

// loadBias is how far pid loaded a position-independent executable from
// its file's addresses (0 for one that is not).
func loadBias(pid int, exe *executable) (uint64, error) {
	if !exe.pie {
		return 0, nil
	}
	// The mapping at file offset 0 holds the first loadable segment.
	base, err := mappedBase(pid, exe.file)
	if err != nil {
		return 0, err
	}
	return base - exe.firstLoad, nil
}

// executable returns what Reader keeps of pid's executable, reading it
// the first time, and the executable's key.
func (r *Reader) executable(pid int) (*executable, exeKey, error) {
	path, key, err := exeOf(pid)
	if err != nil {
		return nil, key, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.execs[key]; ok {
		r.touch(key)
		return e, key, e.err
	}
	e := &executable{}
	e.file, e.err = os.Open(path)
	if e.err == nil {
		e.prog, e.err = Locate(e.file)
	}
	if e.err == nil {
		var f *elf.File
		if f, e.err = elf.NewFile(e.file); e.err == nil {
			e.pie = f.Type == elf.ET_DYN
			e.err = errors.New("no loadable segment")
			for _, p := range f.Progs {
				if p.Type == elf.PT_LOAD {
					e.firstLoad, e.err = p.Vaddr-p.Off, nil
					break
				}
			}
		}
		if e.err == nil {
			// The pclntab mapped, not copied: what the daemon keeps of
			// a Go program is the pages its lookups touched.
			var debug *debuginfo.File
			if debug, e.err = debuginfo.Open(debuginfo.Executable{File: e.file}, debuginfo.Options{}); e.err == nil {
				if debug.Source != "pclntab" {
					debug.Close()
					e.err = errors.New("no pclntab")
				} else {
					e.resolve = Resolver(debug.Lookup)
					// Unmapped once no profile waiting for export
					// resolves through it any more.
					runtime.AddCleanup(e, func(d *debuginfo.File) { d.Close() }, debug)
				}
			}
		}
	}
	if e.err != nil && e.file != nil {
		// The file opened but is not a program whose profile we can
		// find and symbolize.
		e.err = fmt.Errorf("%w: %w", errUnsupported, e.err)
		e.file.Close()
		e.file = nil
	}
	if len(r.order) >= maxExecutables {
		// Not closed: the profiles read waiting to be exported still
		// name their sites through its tables, which read the file (its
		// finalizer closes it once they are gone).
		delete(r.execs, r.order[0])
		r.order = r.order[1:]
	}
	r.execs[key] = e
	r.order = append(r.order, key)
	return e, key, e.err
}

func (r *Reader) touch(key exeKey) {
	for i, k := range r.order {
		if k == key {
			r.order = append(append(r.order[:i:i], r.order[i+1:]...), key)
			return
		}
	}
}

// Close closes the executables kept open.
func (r *Reader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.execs {
		if e.file != nil {
			e.file.Close()
		}
	}
	r.execs, r.order = map[exeKey]*executable{}, nil
}

// mappedBase is the lowest address at which pid maps file.
func mappedBase(pid int, file *os.File) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(file.Fd()), &st); err != nil {
		return 0, err
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		ino, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil || ino != st.Ino {
			continue
		}
		lo, _, _ := strings.Cut(f[0], "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			continue
		}
		off, err := strconv.ParseUint(f[2], 16, 64)
		if err != nil || off > start {
			continue
		}
		return start - off, nil
	}
	return 0, fmt.Errorf("process %d does not map its executable", pid)
}

// maxGoChecks bounds the executables IsGo remembers.
const maxGoChecks = 4096

// IsGo says whether pid's executable is a Go program (it has Go's build
// information), remembering the answer per executable file.
func (r *Reader) IsGo(pid int) bool {
	path, key, err := exeOf(pid)
	if err != nil {
		return false
	}
	r.mu.Lock()
	isGo, ok := r.goChecks[key]
	r.mu.Unlock()
	if ok {
		return isGo
	}
	if f, err := elf.Open(path); err == nil {
		isGo = f.Section(".go.buildinfo") != nil
		f.Close()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.goChecks) >= maxGoChecks {
		clear(r.goChecks)
	}
	r.goChecks[key] = isGo
	return isGo
}

package processmanager

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Processes learn of their own mappings as they are made: BPF reports every
// executable file mapping and every exec at once, so that even a process
// that lives for milliseconds has its mappings in the unwinder's maps before
// most of its code runs, without a sample to trigger a read of its maps.

// ProcessExeced replaces the state of a process that exec'd with the new
// image's, read at once: the kernel has mapped the executable and its
// interpreter, and the libraries the interpreter maps next arrive as
// ExecMapped calls.
func (m *Manager) ProcessExeced(pid libpf.PID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.procs[uint32(pid)]; ok {
		m.forget(uint32(pid))
		m.counters.processesExited++
	}
	m.exited.Remove(uint32(pid)) // it lives, whatever was said of it
	p := m.processFor(uint32(pid), "")
	m.ensureMaps(p)
	// The libraries are mapped after this read: where BPF does not report
	// them, the first unknown PC must be allowed to read the maps again.
	p.lastMapsRead = time.Time{}
}

// ExecMapped adds a new executable file mapping of a process. A process
// seen for the first time has all its mappings read instead.
func (m *Manager) ExecMapped(pid libpf.PID, em support.ExecMapping) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.processFor(uint32(pid), "")
	if m.procs[p.pid] != p {
		return // gone already
	}
	if !p.mapsRead {
		m.ensureMaps(p)
		return
	}
	e := mapsEntry{start: em.Start, end: em.End, offset: em.Offset, dev: em.Dev, inode: em.Ino, executable: true}
	if err := m.mappedPath(pid, &e); errors.Is(err, errMappingGone) {
		return
	} else if err != nil {
		m.procError(p.pid, err)
		return
	}
	if i, found := slices.BinarySearchFunc(p.mappings, e.start, func(mp *mapping, start uint64) int {
		return cmp.Compare(mp.entry.start, start)
	}); found && p.mappings[i].entry.sameAs(&e) {
		return // known from a maps read since
	}
	mp, err := m.newMapping(p.pid, &e)
	if err != nil {
		m.procError(p.pid, err)
		return
	}
	old := p.mappings
	fresh := make([]*mapping, 0, len(old)+1)
	for _, o := range old {
		if o.entry.end <= e.start || o.entry.start >= e.end {
			fresh = append(fresh, o) // the new mapping replaced any overlap
		}
	}
	fresh = append(fresh, mp)
	slices.SortFunc(fresh, func(a, b *mapping) int { return cmp.Compare(a.entry.start, b.entry.start) })
	if m.unwind != nil {
		m.syncUnwind(p.pid, old, fresh)
	}
	p.mappings = fresh
	m.findInterpreters(p)
	m.findAPMAgent(p)
	// Cached conversions may have left addresses of it unmapped.
	p.gen = m.newGeneration()
	m.counters.mappingsAdded++
}

// errMappingGone says a mapping was unmapped or changed before we read it.
var errMappingGone = errors.New("mapping gone")

// mappedPath sets a mapping's path from its /proc/PID/map_files link, as
// /proc/PID/maps would show it.
func (m *Manager) mappedPath(pid libpf.PID, e *mapsEntry) error {
	link := fmt.Sprintf("%s/%d/map_files/%x-%x", m.procFS, pid, e.start, e.end)
	path, err := os.Readlink(link)
	if err != nil {
		if _, statErr := os.Stat(fmt.Sprintf("%s/%d", m.procFS, pid)); statErr == nil {
			return errMappingGone
		}
		return procErr(link, err)
	}
	e.path, e.deleted = strings.CutSuffix(path, deletedSuffix)
	return nil
}

package processmanager

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/support"
)

// Processes learn of their own mappings as they are made: BPF reports every
// executable file mapping and every exec at once, so that even a process
// that lives for milliseconds has its mappings in the unwinder's maps before
// most of its code runs, without a sample to trigger a read of its maps.
// Where BPF can unwind a process it was not told of (its program's code from
// the task's mm, one library from its VMAs), an exec of a program it knows
// is read only at the process's first sample instead (ProcessExeced).

// ProcessExeced drops the state of a process that exec'd and reads the new
// image's at once: the kernel has mapped the executable and its
// interpreter, and the libraries the interpreter maps next arrive as
// ExecMapped calls. When the unwinder knows the program already and BPF
// resolves unread processes (Unwinding.ReadAtFirstSample), the read waits
// for the process's first sample instead: most exec'd processes (shell
// commands, build steps) exit before any, and cost nothing more.
func (m *Manager) ProcessExeced(pid libpf.PID, program support.FileKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[uint32(pid)]; ok {
		if m.readAfterExec(p) {
			m.counters.staleExecs++
			return
		}
		m.forget(uint32(pid))
		m.counters.processesExited++
	}
	m.exited.Remove(uint32(pid)) // it lives, whatever was said of it
	if m.unwind != nil && m.unwinding.ReadAtFirstSample && m.unwind.IsKnown(program) {
		m.counters.execsDeferred++
		m.unread.Add(uint32(pid), struct{}{}, 0)
		return
	}
	p := m.processFor(uint32(pid), "")
	m.ensureMaps(p)
	// The libraries are mapped after this read: where BPF does not report
	// them, the first unknown PC must be allowed to read the maps again.
	p.lastMapsRead = time.Time{}
}

// readAfterExec says whether the state of p was read from the image an
// exec event announces: the event was emitted before p's first sample but
// handled after it (a chain of execs, as in `unshare sh -c "exec chroot
// ..."`, announces each image after the last is running). Its mappings are
// then those /proc shows now; state read anew would be the same, minus
// what was learned since (an APM agent's registration, say).
func (m *Manager) readAfterExec(p *process) bool {
	if !p.mapsRead || len(p.mappings) == 0 {
		return false
	}
	entries, err := m.source.Maps(p.pid, proc.ExecutableMappings)
	entries, _ = splitContextMapping(entries)
	if err != nil || len(entries) != len(p.mappings) {
		return false
	}
	slices.SortFunc(entries, func(a, b proc.MapsEntry) int { return cmp.Compare(a.Start, b.Start) })
	for i := range entries {
		if !p.mappings[i].entry.SameAs(&entries[i]) {
			return false
		}
	}
	return true
}

// execMappingEntry is the maps entry BPF's report of a new mapping
// describes, without its path.
func execMappingEntry(em support.ExecMapping) proc.MapsEntry {
	return proc.MapsEntry{Start: em.Start, End: em.End, Offset: em.Offset, Dev: em.Dev, Inode: em.Ino, Executable: true}
}

// ExecMapped adds a new executable file mapping of a process. A process
// seen for the first time has all its mappings read instead.
func (m *Manager) ExecMapped(pid libpf.PID, em support.ExecMapping) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.unread.Get(uint32(pid)); ok {
		return // its first sample reads all its mappings
	}
	p := m.processFor(uint32(pid), "")
	if !m.live(p) {
		return // gone already
	}
	if !p.mapsRead {
		m.ensureMaps(p)
		return
	}
	e := execMappingEntry(em)
	var err error
	e.Path, e.Deleted, err = m.source.MappingPath(p.pid, e.Start, e.End)
	if errors.Is(err, proc.ErrMappingGone) {
		return
	} else if err != nil {
		m.procError(p.pid, err)
		return
	}
	if i, found := slices.BinarySearchFunc(p.mappings, e.Start, func(mp *mapping, start uint64) int {
		return cmp.Compare(mp.entry.Start, start)
	}); found && p.mappings[i].entry.SameAs(&e) {
		return // known from a maps read since
	}
	var read map[[2]uint64]*execinfo.File
	if pre := m.prereads[p.pid]; pre != nil {
		read = pre.files // prepareMapped's
	}
	mp, err := m.newMapping(p.pid, &e, read)
	if err != nil {
		m.procError(p.pid, err)
		return
	}
	old := p.mappings
	fresh := make([]*mapping, 0, len(old)+1)
	for _, o := range old {
		if o.entry.End <= e.Start || o.entry.Start >= e.End {
			fresh = append(fresh, o) // the new mapping replaced any overlap
		}
	}
	fresh = append(fresh, mp)
	slices.SortFunc(fresh, func(a, b *mapping) int { return cmp.Compare(a.entry.Start, b.entry.Start) })
	if m.unwind != nil {
		m.syncUnwind(p.pid, old, fresh)
	}
	p.mappings, p.byFile = fresh, nil
	m.findRuntimes(p)
	m.findAPMAgent(p)
	m.findGoProgram(p)
	// Cached conversions may have left addresses of it unmapped.
	p.gen = m.newGeneration()
	m.counters.mappingsAdded++
}

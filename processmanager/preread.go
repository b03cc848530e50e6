package processmanager

import (
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/support"
)

// preread is what setting a new process up reads from /proc, read before
// the manager's lock is taken: conversions of other processes go on
// meanwhile, and PrepareBusy reads processes side by side. Its files are read into the file cache, which is where the
// time goes (a runtime's 100 MB binary, a large library's symbols).
type preread struct {
	stat    proc.Stat
	statErr error
	// info is set until processFor takes it (with stat).
	info *libpf.ProcessInfo
	maps []proc.MapsEntry
	// mapsErr is the maps read's error; mapsRead is set until loadMaps
	// takes them.
	mapsErr  error
	mapsRead bool
	// files are the files of maps that were read, by device and inode
	// (vdsoReadKey for the vDSO), for loadMaps not to open them again.
	files map[[2]uint64]*execinfo.File
}

// prepare reads what setting pid up will read, if it has no state with
// its mappings read (withMaps: they will be read); the set-up that follows
// (under m.mu, on the same goroutine) takes it, and done drops what it left.
// Callers prepare different pids at once; should two prepare one pid
// (the lifecycle and the Go heap round), the first's read is used and each
// done drops only its own.
func (m *Manager) prepare(pid uint32, comm string, withMaps bool) (done func()) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	needed := pid != 0 && (!ok || !p.mapsRead) && m.prereads[pid] == nil
	m.mu.Unlock()
	if !needed {
		return func() {}
	}
	r := &preread{}
	r.stat, r.statErr = m.source.Stat(pid)
	if r.statErr == nil {
		r.info = m.source.Info(pid, comm)
	}
	if r.statErr == nil && withMaps {
		r.maps, r.mapsErr = m.source.Maps(pid, proc.ExecutableMappings)
		r.mapsRead = true
		r.files = m.readFiles(pid, r.maps)
	}
	return m.keepPreread(pid, r)
}

// prepareMapped reads the file of a new executable mapping of pid before
// the manager's lock (ExecMapped takes it), or, for a process whose maps
// are not read, what prepare reads. done drops what ExecMapped left.
func (m *Manager) prepareMapped(pid uint32, em support.ExecMapping) (done func()) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	known := ok && p.mapsRead
	_, unread := m.unread.Get(pid)
	taken := m.prereads[pid] != nil
	m.mu.Unlock()
	switch {
	case unread || taken:
		return func() {}
	case !known:
		return m.prepare(pid, "", true)
	}
	e := execMappingEntry(em)
	var err error
	if e.Path, e.Deleted, err = m.source.MappingPath(pid, e.Start, e.End); err != nil {
		return func() {} // ExecMapped finds that again
	}
	f, err := m.files.ForMapping(m.source, pid, &e)
	if err != nil || f == nil {
		return func() {}
	}
	r := &preread{files: map[[2]uint64]*execinfo.File{{e.Dev, e.Inode}: f}}
	return m.keepPreread(pid, r)
}

// keepPreread hands r to the set-up of pid that follows on the caller's
// goroutine; done drops what that set-up left of it.
func (m *Manager) keepPreread(pid uint32, r *preread) (done func()) {
	m.mu.Lock()
	m.prereads[pid] = r
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.prereads[pid] == r {
			delete(m.prereads, pid)
		}
		m.mu.Unlock()
	}
}

// readFiles reads the files of mappings through the file cache, once per
// file, and returns those it could read. Errors are left to the set-up,
// which tries those files again.
func (m *Manager) readFiles(pid uint32, entries []proc.MapsEntry) map[[2]uint64]*execinfo.File {
	read := map[[2]uint64]*execinfo.File{}
	tried := map[[2]uint64]bool{}
	for i := range entries {
		e := &entries[i]
		key := [2]uint64{e.Dev, e.Inode}
		switch {
		case e.IsFile() && !tried[key]:
			tried[key] = true
			if f, err := m.files.ForMapping(m.source, pid, e); err == nil && f != nil {
				read[key] = f
			}
		case e.IsVDSO() && read[vdsoReadKey] == nil:
			if f, err := m.files.VDSOForMapping(m.source, pid, e); err == nil && f != nil {
				read[vdsoReadKey] = f
			}
		}
	}
	return read
}

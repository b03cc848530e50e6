package processmanager

import (
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
)

// GoHeapTargets are the live processes whose executable is a Go program:
// those whose heap profile can be read (goheap.Reader.Collect).
func (m *Manager) GoHeapTargets() []goheap.Target {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []goheap.Target
	for _, p := range m.procs {
		if !p.vanished.IsZero() || p.info == nil {
			continue
		}
		for _, mp := range p.mappings {
			if mp.file != nil && mp.file.ELF != nil && mp.file.ELF.Go && mp.entry.Path == p.info.ExecutablePath {
				out = append(out, goheap.Target{PID: libpf.PID(p.pid), Process: p.info, Executable: mp.pf})
				break
			}
		}
	}
	return out
}

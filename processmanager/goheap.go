package processmanager

import (
	"context"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
)

// GoHeapTargets are the live processes whose executable is a Go program,
// in no fixed order: those whose heap profile can be read
// (goheap.Reader.Collect); isGo says which are Go programs. A Go program
// the manager has not set up (one idle since the daemon started) is
// described from procfs alone: setting it up (its files' symbols, its
// stack deltas) would cost the daemon what its first sample costs, for
// every idle program on the host.
func (m *Manager) GoHeapTargets(ctx context.Context, isGo func(pid uint32) bool) []goheap.Target {
	var out []goheap.Target
	m.mu.Lock()
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
	m.mu.Unlock()
	pids, err := m.source.PIDs()
	if err != nil {
		return out
	}
	for _, pid := range pids {
		if ctx.Err() != nil {
			break
		}
		if pid == m.self || m.Tracks(libpf.PID(pid)) || !isGo(pid) {
			continue
		}
		out = append(out, goheap.Target{PID: libpf.PID(pid), Process: m.source.Info(pid, "")})
	}
	return out
}

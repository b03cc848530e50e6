package processmanager

import (
	"context"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
)

// maxGoHeapSetUps bounds the Go programs GoHeapTargets sets up in one
// call: a host that starts hundreds at once has them all within a few
// rounds.
const maxGoHeapSetUps = 64

// GoHeapTargets are the live processes whose executable is a Go program,
// in no fixed order: those whose heap profile can be read
// (goheap.Reader.Collect). A Go
// program that was not sampled yet (one idle since the daemon started) is
// set up first, as its first sample would have, so that its profile is
// reported with its process's attributes; isGo says which are Go
// programs.
func (m *Manager) GoHeapTargets(ctx context.Context, isGo func(pid uint32) bool) []goheap.Target {
	if pids, err := m.source.PIDs(); err == nil {
		setUp := 0
		for _, pid := range pids {
			if ctx.Err() != nil || setUp >= maxGoHeapSetUps {
				break
			}
			if pid == m.self || m.Tracks(libpf.PID(pid)) || !isGo(pid) {
				continue
			}
			done := m.prepare(pid, "", true)
			m.RefreshMappings(libpf.PID(pid))
			done()
			setUp++
		}
	}
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

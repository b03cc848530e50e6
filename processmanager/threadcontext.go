package processmanager

import (
	"errors"

	"github.com/hostprof/ebpf-profiler/processmanager/threadctx"
	"github.com/hostprof/ebpf-profiler/support"
)

// threadContextSchemas are the process contexts' thread context schemas
// whose records BPF reads: OTEP 4947 names "tlsdesc_v1_dev", to become
// "tls_v1".
var threadContextSchemas = map[string]bool{"tlsdesc_v1_dev": true, "tls_v1": true}

// findThreadContext tells BPF where a process's threads keep their
// OpenTelemetry thread context, once its process context announced them
// (OTEP 4947 has readers wait for the schema), from the first of its
// mapped files that defines the pointer; and forgets it when the process
// context no longer announces them. A slot the loader has not filled yet
// is looked at again with the process's next maps read. The caller holds
// m.mu.
func (m *Manager) findThreadContext(p *process) {
	if m.unwind == nil || m.unwinding.ThreadCtx == nil {
		return
	}
	announced := p.procCtx != nil && threadContextSchemas[p.procCtx.ctx.SchemaVersion]
	if !announced {
		m.dropThreadContext(p)
		return
	}
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.ELF == nil || mp.file.ELF.ThreadCtx == nil || mp.pf == nil {
			continue
		}
		mem, err := m.processMem(p)
		if err != nil {
			return
		}
		// Looked at again with each maps read: a descriptor the loader
		// resolves lazily changes at the variable's first use.
		index, offset, gotPair, err := mp.file.ELF.ThreadCtx.Where(mem, mp.pf.Bias)
		tp := support.ThreadCtxProc{TLSIndex: index, TLSOffset: offset}
		if gotPair {
			tp.GOTPair = 1
		}
		if err == nil && p.threadCtxInBPF && tp == p.threadCtx {
			return
		}
		if err == nil {
			err = m.unwinding.ThreadCtx.SetThreadCtxProc(p.pid, tp)
		}
		if err != nil {
			if !errors.Is(err, threadctx.ErrNotResolved) {
				m.counters.threadContextErrors++
				m.log.WithError(err).Debugf("process %d: thread context in %s", p.pid, mp.entry.Path)
			}
			return
		}
		if !p.threadCtxInBPF {
			m.counters.threadContexts++
		}
		p.threadCtxInBPF, p.threadCtx = true, tp
		return
	}
}

// dropThreadContext forgets what BPF knew of a process's thread context.
// The caller holds m.mu.
func (m *Manager) dropThreadContext(p *process) {
	if !p.threadCtxInBPF {
		return
	}
	if err := m.unwinding.ThreadCtx.DeleteThreadCtxProc(p.pid); err != nil {
		m.log.WithError(err).Debugf("process %d: removing its thread context", p.pid)
	}
	p.threadCtxInBPF = false
}

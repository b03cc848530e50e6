package processmanager

import (
	"errors"
	"fmt"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

// How often an APM agent's process is looked at again, while it is being
// sampled, until its TLS descriptor is resolved and its process storage
// published: from apmRetryMin, doubling up to apmRetryMax. A try reads a
// word or two of the process's memory; the agent waits for the
// registration the storage leads to.
const (
	apmRetryMin = 100 * time.Millisecond
	apmRetryMax = time.Second
)

// apmProcess is what the manager knows of a process's APM agent.
type apmProcess struct {
	lib  *tracecorr.Library
	bias uint64
	// tlsOffset is set (inBPF) once the TLS descriptor was resolved.
	tlsOffset int64
	inBPF     bool
	// storage is nil until the agent published it.
	storage *tracecorr.ProcessStorage
	retry   libpf.Backoff
}

// pending says something of the agent is still to be read.
func (a *apmProcess) pending() bool { return a != nil && (!a.inBPF || a.storage == nil) }

// findAPMAgent notices an APM agent library among a process's mappings.
// Call it after they change. The caller holds m.mu.
func (m *Manager) findAPMAgent(p *process) {
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.ELF == nil || mp.file.ELF.APM == nil || mp.pf == nil {
			continue
		}
		if p.apm == nil || p.apm.lib != mp.file.ELF.APM {
			m.dropAPM(p)
			p.apm = &apmProcess{lib: mp.file.ELF.APM, bias: mp.pf.Bias, retry: libpf.NewBackoff(apmRetryMin, apmRetryMax)}
			m.counters.apmAgents++
		}
		p.apm.retry.Reset()
		m.readAPMAgent(p)
		return
	}
}

// readAPMAgent reads what is still missing of a process's agent, paced:
// the TLS offset, which BPF needs, and the process storage. The agent
// publishes both after it starts, so neither is given up on. The caller
// holds m.mu.
func (m *Manager) readAPMAgent(p *process) {
	a := p.apm
	if !a.pending() || !a.retry.Ready(m.now()) {
		return
	}
	err := m.tryReadAPMAgent(p)
	if !a.pending() {
		return
	}
	wait := a.retry.Failed(m.now())
	if err != nil && !errors.Is(err, tracecorr.ErrNotResolved) && !errors.Is(err, tracecorr.ErrNotPublished) {
		m.counters.apmErrors++
		m.log.WithError(err).Debugf("process %d: APM agent not readable yet (next try in %v)", p.pid, wait)
	}
}

func (m *Manager) tryReadAPMAgent(p *process) error {
	a := p.apm
	mem, err := m.processMem(p)
	if err != nil {
		return err
	}
	if !a.inBPF {
		off, err := tracecorr.TLSOffset(mem, a.lib.TLSDescriptor+a.bias)
		if err != nil {
			return err
		}
		a.tlsOffset = off
		if m.unwind != nil && m.unwinding.APM != nil {
			if err := m.unwinding.APM.SetAPMProc(p.pid, support.APMProc{TLSOffset: off}); err != nil {
				return fmt.Errorf("writing the APM map: %w", err)
			}
		}
		a.inBPF = true
	}
	if a.storage == nil {
		st, err := tracecorr.ReadProcessStorage(mem, a.lib.ProcessStorage+a.bias)
		if err != nil {
			return err
		}
		a.storage = st
		info := *p.info
		info.ServiceName, info.DeploymentEnvironment = st.ServiceName, st.Environment
		p.info = &info
		p.gen = m.newGeneration()
		if m.corr != nil {
			m.corr.SetAgent(p.pid, tracecorr.Agent{SocketPath: st.SocketPath, Generation: p.gen})
		}
		m.log.Debugf("process %d: APM agent of service %q (%s), socket %s", p.pid, st.ServiceName, st.Environment, st.SocketPath)
	}
	return nil
}

// recheckAPMAgent reads the agent's process storage again if the agent
// published a new one, and goes on reading what is still missing. The
// caller holds m.mu.
func (m *Manager) recheckAPMAgent(p *process) {
	a := p.apm
	if a.storage != nil {
		mem, err := m.processMem(p)
		if err != nil {
			return
		}
		addr, err := tracecorr.ReadStoragePointer(mem, a.lib.ProcessStorage+a.bias)
		if err == nil && addr == a.storage.Addr {
			return
		}
		a.storage = nil
		a.retry.Reset()
	}
	m.readAPMAgent(p)
}

// dropAPM forgets a process's APM agent. The caller holds m.mu.
func (m *Manager) dropAPM(p *process) {
	a := p.apm
	if a == nil {
		return
	}
	if a.inBPF && m.unwind != nil && m.unwinding.APM != nil {
		if err := m.unwinding.APM.DeleteAPMProc(p.pid); err != nil {
			m.log.WithError(err).Debugf("process %d: removing it from the APM map", p.pid)
		}
	}
	if m.corr != nil {
		m.corr.RemoveAgent(p.pid)
	}
	p.apm = nil
}

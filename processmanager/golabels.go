package processmanager

import (
	"github.com/hostprof/ebpf-profiler/processmanager/golabels"
	"github.com/hostprof/ebpf-profiler/support"
)

// findGoProgram tells BPF how to read the goroutine labels of a Go
// program's threads, once its executable's mapping is known, and forgets
// it when the process no longer maps one. Call it after the mappings
// change. The caller holds m.mu.
func (m *Manager) findGoProgram(p *process) {
	if m.unwind == nil || m.unwinding.GoLabels == nil {
		return
	}
	var layout *golabels.Layout
	for _, mp := range p.mappings {
		if mp.file != nil && mp.file.ELF != nil && mp.file.ELF.GoLabels != nil {
			layout = mp.file.ELF.GoLabels
			break
		}
	}
	if layout == p.goLabels {
		return
	}
	m.dropGoProgram(p)
	if layout == nil {
		return
	}
	err := m.unwinding.GoLabels.SetGoProc(p.pid, goProc(layout))
	if err != nil {
		m.counters.goLabelErrors++
		m.log.WithError(err).Debugf("process %d: writing the Go programs' map", p.pid)
		return
	}
	p.goLabels = layout
	m.counters.goPrograms++
}

// dropGoProgram forgets what BPF knew of a Go program. The caller holds
// m.mu.
func (m *Manager) dropGoProgram(p *process) {
	if p.goLabels == nil {
		return
	}
	if err := m.unwinding.GoLabels.DeleteGoProc(p.pid); err != nil {
		m.log.WithError(err).Debugf("process %d: removing it from the Go programs' map", p.pid)
	}
	p.goLabels = nil
}

func goProc(l *golabels.Layout) support.GoProc {
	gp := support.GoProc{TLSOffset: l.TLSOffset, GM: l.GM, MCurg: l.MCurg, GLabels: l.GLabels}
	if l.GInRegister {
		gp.GInRegister = 1
	}
	if l.LabelsMap {
		gp.LabelsMap = 1
	}
	return gp
}

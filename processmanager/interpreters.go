package processmanager

import (
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter/python"
)

// pythonProcess is what the manager knows of a process that runs CPython.
type pythonProcess struct {
	interp  *python.Interpreter
	offsets *python.Offsets
}

// findInterpreters notices the language runtime a process's mappings hold.
// Call it after they change; a process without one costs a scan of its
// mappings.
func (m *Manager) findInterpreters(p *process) {
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.elf == nil || mp.file.elf.python == nil || mp.pf == nil {
			continue
		}
		in := mp.file.elf.python
		if p.python != nil && p.python.interp == in {
			return
		}
		offsets, err := python.OffsetsFor(in.Version)
		if err != nil {
			m.counters.interpreterErrors++
			m.log.WithError(err).Debugf("process %d: not unwinding its Python", p.pid)
			return
		}
		p.python = &pythonProcess{interp: in, offsets: offsets}
		info := *p.info
		info.RuntimeName, info.RuntimeVersion = "CPython", pythonVersion(in)
		p.info = &info
		return
	}
}

// pythonVersion is the release an interpreter states, as Python prints it.
func pythonVersion(in *python.Interpreter) string {
	if in.Micro < 0 {
		return in.Version.String()
	}
	return fmt.Sprintf("%v.%d", in.Version, in.Micro)
}

package processmanager

import (
	"errors"
	"fmt"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/python"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// InterpreterMaps writes the BPF maps the interpreter unwinders read; the
// tracer implements it.
type InterpreterMaps interface {
	SetPythonProc(pid uint32, p support.PythonProc) error
	DeletePythonProc(pid uint32) error
}

// How often a CPython process is looked at again until it can be described
// to the unwinder (its C library is not mapped, its memory could not be
// opened): from pythonRetryMin, doubling up to pythonRetryMax.
const (
	pythonRetryMin = 50 * time.Millisecond
	pythonRetryMax = 30 * time.Second
)

// pythonProcess is what the manager knows of a process that runs CPython.
type pythonProcess struct {
	bin *python.Binary
	// bias is the load bias of the interpreter's file.
	bias uint64
	// proc symbolizes the process's frames; nil until the process could be
	// described to BPF (see attachPython).
	proc *python.Process
	// inBPF says the unwinder's map has the process.
	inBPF bool
	// retry paces attempts while proc is nil.
	retry libpf.Backoff
}

// pending says the process waits to be described to the unwinder.
func (pp *pythonProcess) pending() bool {
	return pp != nil && pp.proc == nil && pp.bin.Err == nil
}

// findInterpreters notices the language runtime a process's mappings hold.
// Call it after they change; a process without one costs a scan of its
// mappings.
func (m *Manager) findInterpreters(p *process) {
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.elf == nil || mp.file.elf.python == nil || mp.pf == nil {
			continue
		}
		bin := mp.file.elf.python
		if p.python != nil && p.python.bin == bin {
			// New mappings may be what it lacked (its C library).
			p.python.retry.Reset()
			m.attachPython(p)
			return
		}
		m.dropPython(p)
		p.python = &pythonProcess{bin: bin, bias: mp.pf.Bias, retry: libpf.NewBackoff(pythonRetryMin, pythonRetryMax)}
		info := *p.info
		info.RuntimeName, info.RuntimeVersion = "CPython", pythonVersion(bin.Interpreter)
		p.info = &info
		// Conversions cached so far carry the old process info.
		p.gen = m.newGeneration()
		if bin.Err != nil {
			m.counters.interpreterErrors++
			m.log.WithError(bin.Err).Debugf("process %d: not unwinding its Python", p.pid)
			return
		}
		m.attachPython(p)
		return
	}
}

// attachPython describes a CPython process to the BPF unwinder, or retries
// (paced) where that failed. The caller holds m.mu.
func (m *Manager) attachPython(p *process) {
	pp := p.python
	if pp == nil || pp.proc != nil || pp.bin.Err != nil || !pp.retry.Ready(m.now()) {
		return
	}
	err := m.newPythonProc(p)
	if err == nil {
		m.counters.pythonAttached++
		m.log.Debugf("process %d: unwinding its CPython %s", p.pid, pythonVersion(pp.bin.Interpreter))
		return
	}
	wait := pp.retry.Failed(m.now())
	m.counters.interpreterErrors++
	m.log.WithError(err).Debugf("process %d: cannot unwind its Python yet (next try in %v)", p.pid, wait)
}

func (m *Manager) newPythonProc(p *process) error {
	pp := p.python
	tsd, err := m.processTSD(p)
	if err != nil {
		return err
	}
	mem, err := m.processMem(p)
	if err != nil {
		return err
	}
	proc, err := pp.bin.NewProcess(mem, pp.bias, *tsd)
	if err != nil {
		return err
	}
	if m.unwind != nil && m.unwind.u.Interpreters != nil {
		if err := m.unwind.u.Interpreters.SetPythonProc(p.pid, proc.Unwinder()); err != nil {
			return fmt.Errorf("writing the Python unwinder's map: %w", err)
		}
		pp.inBPF = true
	}
	pp.proc = proc
	return nil
}

// processTSD finds the thread-specific data layout of the C library a
// process maps.
func (m *Manager) processTSD(p *process) (*python.TSDLayout, error) {
	var decodeErr error
	for _, mp := range p.mappings {
		if mp.file == nil || mp.file.elf == nil {
			continue
		}
		if mp.file.elf.tsd != nil {
			return mp.file.elf.tsd, nil
		}
		if mp.file.elf.tsdErr != nil {
			decodeErr = fmt.Errorf("%s: %w", mp.entry.path, mp.file.elf.tsdErr)
		}
	}
	if decodeErr != nil {
		return nil, decodeErr
	}
	return nil, errors.New("no mapped C library defines pthread_getspecific")
}

// dropPython forgets a process's CPython state. The caller holds m.mu.
func (m *Manager) dropPython(p *process) {
	pp := p.python
	if pp == nil {
		return
	}
	if pp.inBPF {
		if err := m.unwind.u.Interpreters.DeletePythonProc(p.pid); err != nil {
			m.log.WithError(err).Debugf("process %d: removing it from the Python unwinder's map", p.pid)
		}
	}
	p.python = nil
}

// pythonFrame symbolizes a Python frame of p: the code object at code
// running the instruction at byte offset.
func (m *Manager) pythonFrame(p *process, code uint64, offset uint32) libpf.Frame {
	f := libpf.Frame{Kind: libpf.FramePython, FunctionName: unknownPythonFrame}
	if p.python == nil || p.python.proc == nil {
		m.counters.pythonFrameErrors++
		return f
	}
	pf, err := p.python.proc.Frame(code, offset)
	if err != nil {
		m.counters.pythonFrameErrors++
		return f
	}
	f.FunctionName, f.SourceFile = pf.FunctionName, pf.FileName
	if pf.Line > 0 {
		f.SourceLine = uint32(pf.Line)
	}
	return f
}

// unknownPythonFrame names Python frames that could not be symbolized: the
// process exited, or its code object was freed, before we read it.
const unknownPythonFrame = "[unknown Python frame]"

// pythonVersion is the release an interpreter states, as Python prints it.
func pythonVersion(in *python.Interpreter) string {
	if in.Micro < 0 {
		return in.Version.String()
	}
	return fmt.Sprintf("%v.%d", in.Version, in.Micro)
}

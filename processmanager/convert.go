package processmanager

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ConvertTrace turns a raw BPF trace into a user-space trace: kernel frames
// first, then user frames, each leaf first. The returned trace and process
// info are shared and must not be modified.
//
// A process that is already gone still gets a trace: its kernel frames are
// symbolized and its user frames carry absolute addresses without mappings.
func (m *Manager) ConvertTrace(raw *support.Trace) (*libpf.Trace, *libpf.ProcessInfo, error) {
	c, err := m.convert(raw)
	return c.trace, c.info, err
}

// conversion is a converted trace and how long it may be cached.
type conversion struct {
	trace *libpf.Trace
	info  *libpf.ProcessInfo
	// gen is the generation of the process state the trace was converted
	// with; 0 when it must not be cached.
	gen uint64
	// retryAt is set when some address was outside every known mapping:
	// from then on a maps re-read is allowed again, and converting anew may
	// resolve the address (code mapped since).
	retryAt time.Time
}

// convert is ConvertTrace that also says how long the result may be cached.
func (m *Manager) convert(raw *support.Trace) (conversion, error) {
	if raw == nil {
		return conversion{}, errors.New("converting trace: nil trace")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counters.tracesConverted++
	p := m.processFor(raw.PID, raw.Comm)

	frames := make([]libpf.Frame, 0, min(len(raw.KernelStack)+len(raw.Frames), libpf.MaxFrames))
	for i, addr := range raw.KernelStack {
		if addr != 0 {
			// Every kernel frame but the interrupted one is a return address.
			frames = append(frames, m.kernel.frame(addr, i > 0))
		}
	}
	var retryAt time.Time
	if len(raw.Frames) > 0 {
		m.ensureMaps(p)
		m.attachPython(p)
		if p.apm != nil {
			m.readAPMAgent(p)
		}
		nKernel := len(frames)
		for attempt := 0; ; attempt++ {
			var unknown, unattributed int
			frames, unknown, unattributed = m.appendUserFrames(frames[:nKernel], p, raw.Frames)
			// An unknown address may be in code mapped since we last looked.
			if unknown == 0 || attempt > 0 || !m.rereadMaps(p) {
				m.counters.unmappedFrames += uint64(unattributed)
				if unknown > 0 {
					retryAt = p.lastMapsRead.Add(m.rereadWait(p))
				}
				break
			}
		}
	}

	if hasPythonFrames(frames) {
		// Symbolizing checks that each code object is still the one it
		// names; a cached trace would not.
		if at := m.now().Add(pythonTraceRecheck); retryAt.IsZero() || at.Before(retryAt) {
			retryAt = at
		}
	}
	truncated := raw.Truncated
	if len(frames) > libpf.MaxFrames {
		frames = frames[:libpf.MaxFrames]
		truncated = true
	}
	if truncated {
		m.counters.truncatedTraces++
	}
	t := &libpf.Trace{
		Hash:      m.hashTrace(raw.PID, frames, truncated),
		Frames:    frames,
		Truncated: truncated,
	}
	c := conversion{trace: t, info: p.info, gen: p.gen, retryAt: retryAt}
	if m.procs[p.pid] != p || p.python.pending() || p.apm.pending() {
		// Not cached: the next trace must come here to retry.
		c.gen = 0
	}
	return c, nil
}

// appendUserFrames converts user frames. It returns how many addresses were
// outside every known mapping (unknown) and how many frames could not be
// attributed to a file (unattributed: unknown ones and anonymous memory).
func (m *Manager) appendUserFrames(frames []libpf.Frame, p *process, raw []support.Frame) (
	out []libpf.Frame, unknown, unattributed int) {
	for _, rf := range raw {
		switch rf.Kind {
		case libpf.FrameAbort:
			frames = append(frames, libpf.Frame{Kind: libpf.FrameAbort, Address: rf.Addr})
			continue
		case libpf.FramePython:
			frames = append(frames, m.pythonFrame(p, rf.FileID, uint32(rf.Addr)))
			continue
		}
		addr := rf.Addr
		if rf.ReturnAddress && addr > 0 {
			// Point inside the call, not at the instruction after it, which
			// may belong to the next function or line.
			addr--
		}
		kind := rf.Kind
		if kind == libpf.FrameUnknown {
			kind = libpf.FrameNative
		}
		f := libpf.Frame{Kind: kind, Address: addr}

		var mp *mapping
		if rf.FileID != 0 {
			// BPF resolved the file: addr is already file-relative.
			if mp = p.findFile(rf.FileID); mp == nil {
				mp, _ = m.byFileID.Get(rf.FileID)
			}
		} else if mp = p.findMapping(addr); mp != nil && mp.pf != nil {
			f.Address = addr - mp.pf.Bias
		}
		switch {
		case mp == nil:
			unknown++
			unattributed++
		case mp.pf == nil:
			// Anonymous executable memory: JIT code whose runtime has no
			// unwinder here. Its frames (the frame-pointer walk went on
			// through them) show as one labelled frame.
			unattributed++
			if n := len(frames); n > 0 && frames[n-1].FunctionName == anonymousCode && frames[n-1].Mapping == nil {
				continue
			}
			f.FunctionName = anonymousCode
		default:
			f.Mapping = mp.pf
			if mp.file != nil && mp.file.elf != nil {
				f.FunctionName, _ = mp.file.elf.symbols.lookup(f.Address)
			}
		}
		frames = append(frames, f)
	}
	return frames, unknown, unattributed
}

// pythonTraceRecheck is how long a converted trace with Python frames is
// served from the cache: a code object may be freed and its address
// reused by another with the same offsets.
const pythonTraceRecheck = 10 * time.Second

func hasPythonFrames(frames []libpf.Frame) bool {
	for i := range frames {
		if frames[i].Kind == libpf.FramePython {
			return true
		}
	}
	return false
}

// anonymousCode names frames in anonymous executable memory.
const anonymousCode = "[anonymous executable memory]"

// hashTrace computes the 128-bit trace hash: xxh3 over each frame's kind,
// file id and address. User frames without a file id have process-specific
// addresses, so the pid is mixed in for them; kernel addresses are the same
// in every process. Python frames are what they run: function, file and
// line, the same in every process. A truncated trace differs from a
// complete one of the same frames.
func (m *Manager) hashTrace(pid uint32, frames []libpf.Frame, truncated bool) libpf.TraceHash {
	buf := m.hashBuf[:0]
	for i := range frames {
		f := &frames[i]
		if f.Kind == libpf.FramePython {
			buf = append(buf, byte(f.Kind))
			buf = append(buf, f.FunctionName...)
			buf = append(buf, 0)
			buf = append(buf, f.SourceFile...)
			buf = append(buf, 0)
			buf = binary.LittleEndian.AppendUint32(buf, f.SourceLine)
			continue
		}
		var id libpf.FileID
		if f.Mapping != nil {
			id = f.Mapping.FileID
		}
		buf = append(buf, byte(f.Kind))
		buf = append(buf, id[:]...)
		buf = binary.LittleEndian.AppendUint64(buf, f.Address)
		if id.IsZero() && f.Kind != libpf.FrameKernel {
			buf = binary.LittleEndian.AppendUint32(buf, pid)
		}
	}
	if truncated {
		buf = append(buf, 1)
	}
	m.hashBuf = buf
	h := xxh3.Hash128(buf)
	return libpf.TraceHash{Hi: h.Hi, Lo: h.Lo}
}

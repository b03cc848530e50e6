package processmanager

import (
	"errors"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	"github.com/hostprof/ebpf-profiler/support"
)

// ConvertTrace turns a raw BPF trace into a user-space trace: kernel frames
// first, then user frames, each leaf first. The returned trace and process
// info are shared and must not be modified. It does a sample's lifecycle
// work first (see sampled), as HandleTrace does.
//
// A process that is already gone still gets a trace: its kernel frames are
// symbolized and its user frames carry absolute addresses without mappings.
func (m *Manager) ConvertTrace(raw *support.Trace) (*libpf.Trace, *libpf.ProcessInfo, error) {
	if raw == nil {
		return nil, nil, errors.New("converting trace: nil trace")
	}
	p, _ := m.sampled(raw)
	c := m.convertRetrying(raw, p)
	return c.trace, c.info, nil
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
	// linesSettled, when not zero, is one more than the count of settled
	// debug files (lineSymbolizer.settledFiles) when the trace was
	// converted while some of its files' lines were being read: convert
	// it again once the count has changed.
	linesSettled uint64
	// unknown counts addresses outside every known mapping, unattributed
	// the frames not attributed to a file (unknown ones and anonymous
	// memory).
	unknown, unattributed int
}

// convertRetrying converts a trace of p and, where some address was in no
// known mapping, re-reads p's mappings (rate-limited: lifecycle work the
// conversion itself does not do) and converts it again if they changed.
func (m *Manager) convertRetrying(raw *support.Trace, p *process) conversion {
	c := m.convert(raw, p)
	if c.unknown > 0 && m.rereadAfterMiss(p) {
		c = m.convert(raw, p)
	}
	m.countUnattributed(c)
	return c
}

// countUnattributed counts the frames of a conversion that is kept which
// were not attributed to a file.
func (m *Manager) countUnattributed(c conversion) {
	m.mu.Lock()
	m.counters.unmappedFrames += uint64(c.unattributed)
	m.mu.Unlock()
}

// rereadAfterMiss re-reads a process's mappings after a conversion met an
// address outside them all, if the rate limit allows; it reports whether
// they changed.
func (m *Manager) rereadAfterMiss(p *process) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rereadMaps(p)
}

// convert converts a trace of p, reading only the state the process's
// lifecycle built (sampled): mappings, files, attached runtimes.
func (m *Manager) convert(raw *support.Trace, p *process) conversion {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.counters.tracesConverted++

	frames := make([]libpf.Frame, 0, min(len(raw.KernelStack)+len(raw.Frames), libpf.MaxFrames))
	for i, addr := range raw.KernelStack {
		if addr != 0 {
			// Every kernel frame but the interrupted one is a return address.
			frames = append(frames, m.kernel.frame(addr, i > 0))
		}
	}
	if raw.OffCPU {
		frames = append(frames[:0], frames[tracingFrames(frames):]...)
	}
	c := conversion{info: p.info, gen: p.gen}
	var missed bool
	m.linesRetryAt, m.linesOpening = time.Time{}, false
	var settled uint64
	if m.lines != nil {
		settled = m.lines.settledFiles() // before the lookups: no opening ends unseen
	}
	frames, c.unknown, c.unattributed, missed = m.appendUserFrames(frames, p, raw.Frames)
	if m.linesOpening {
		c.linesSettled = settled + 1
	}
	if c.unknown > 0 {
		c.retryAt = p.lastMapsRead.Add(m.rereadWait(p))
	}
	// A file whose lines are fetched, or wait for room in the queue:
	// convert again then.
	if at := m.linesRetryAt; !at.IsZero() && (c.retryAt.IsZero() || at.Before(c.retryAt)) {
		c.retryAt = at
	}
	recheck := p.runtimeTraceRecheck(frames)
	if missed && (recheck == 0 || recheck > minRuntimeUpdate) {
		// Code a runtime claimed but could not name yet.
		recheck = minRuntimeUpdate
	}
	if recheck > 0 {
		// Symbolizing checks that each object is still the one it names;
		// a cached trace would not.
		if at := m.now().Add(recheck); c.retryAt.IsZero() || at.Before(c.retryAt) {
			c.retryAt = at
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
	c.trace = &libpf.Trace{
		Hash:      m.hashTrace(raw.PID, frames, truncated),
		Frames:    frames,
		Truncated: truncated,
	}
	if m.procs[p.pid] != p || p.runtimesPending() || p.apm.pending() {
		// Not cached: the next trace must come here to retry.
		c.gen = 0
	}
	return c
}

// appendUserFrames converts user frames. It returns how many addresses were
// outside every known mapping (unknown), how many frames could not be
// attributed to a file (unattributed: unknown ones and anonymous memory),
// and whether a runtime could not name code it claimed (missed).
func (m *Manager) appendUserFrames(frames []libpf.Frame, p *process, raw []support.Frame) (
	out []libpf.Frame, unknown, unattributed int, missed bool) {
	for _, rf := range raw {
		switch {
		case rf.Kind == libpf.FrameAbort:
			frames = append(frames, libpf.Frame{Kind: libpf.FrameAbort, Address: rf.Addr})
			continue
		case rf.Kind.IsRuntime():
			frames = m.runtimeFrames(p, rf, frames)
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
		// own says mp is one of p's mappings, through which its file
		// can be opened.
		own := true
		if rf.FileID != 0 {
			// BPF resolved the file: addr is already file-relative.
			if mp = p.findFile(rf.FileID); mp == nil {
				mp, _ = m.byFileID.Get(rf.FileID)
				own = false
			}
		} else if mp = p.findMapping(addr); mp != nil && mp.pf != nil {
			f.Address = addr - mp.pf.Bias
			if m.unwind != nil && !mp.attached && m.live(p) {
				// Sampled in a mapping not handed to the unwinder
				// (MaxEagerMappings, a full queue): now it is.
				m.attachMapping(p.pid, mp)
			}
		}
		switch {
		case mp == nil:
			unknown++
			unattributed++
		case mp.pf == nil:
			// Anonymous executable memory: JIT code. A runtime that
			// claimed it may name it; else its frames (the
			// frame-pointer walk went on through them) show as one
			// labelled frame.
			if named, ok := p.symbolizeAnonymous(addr); ok {
				frames = append(frames, named)
				continue
			}
			missed = missed || p.claimed(addr)
			unattributed++
			if n := len(frames); n > 0 && frames[n-1].FunctionName == anonymousCode && frames[n-1].Mapping == nil {
				continue
			}
			f.FunctionName = anonymousCode
		default:
			f.Mapping = mp.pf
			if mp.file != nil && mp.file.ELF != nil {
				f.FunctionName, _ = mp.file.ELF.Lookup(f.Address)
				frames = m.appendNativeFrame(frames, p, mp, own, f)
				continue
			}
		}
		frames = append(frames, f)
	}
	return frames, unknown, unattributed, missed
}

// appendNativeFrame appends frame f of file mp: first the calls the
// compiler inlined at its address, where the file's debug information
// has them, then f itself with its source line; names readable. f's name
// is its symbol's, else the debug information's.
func (m *Manager) appendNativeFrame(frames []libpf.Frame, p *process, mp *mapping, own bool, f libpf.Frame) []libpf.Frame {
	var src []debuginfo.Frame
	if m.lines != nil {
		pid := uint32(0) // files of other processes: cached answers only
		if own {
			pid = p.pid
		}
		var retry time.Time
		var opening bool
		src, retry, opening = m.lines.frames(m.source, pid, mp, f.Address)
		if !retry.IsZero() && (m.linesRetryAt.IsZero() || retry.Before(m.linesRetryAt)) {
			m.linesRetryAt = retry
		}
		m.linesOpening = m.linesOpening || opening
	}
	if n := len(src); n > 0 {
		for _, s := range src[:n-1] {
			in := f
			in.FunctionName, in.SystemName = m.readableName(s.Function)
			in.SourceFile, in.SourceLine, in.Inlined = s.File, s.Line, true
			frames = append(frames, in)
		}
		if f.FunctionName == "" {
			f.FunctionName = src[n-1].Function
		}
		f.SourceFile, f.SourceLine = src[n-1].File, src[n-1].Line
	}
	f.FunctionName, f.SystemName = m.readableName(f.FunctionName)
	n := &m.counters.native
	n.Frames++
	n.Inlined += uint64(max(len(src)-1, 0))
	if f.FunctionName != "" {
		n.Named++
	}
	if f.SystemName != "" {
		n.Demangled++
	}
	if f.SourceLine != 0 {
		n.WithLine++
	}
	return append(frames, f)
}

// readableName returns a native function's name as shown and its system
// name: the mangled one where it demangles, else "".
func (m *Manager) readableName(sym string) (name, system string) {
	if readable, ok := m.demangler.Name(sym); ok {
		return readable, sym
	}
	return sym, ""
}

// anonymousCode names frames in anonymous executable memory.
const anonymousCode = "[anonymous executable memory]"

// hashTrace is libpf.HashTrace with the manager's buffer.
func (m *Manager) hashTrace(pid uint32, frames []libpf.Frame, truncated bool) libpf.TraceHash {
	var h libpf.TraceHash
	h, m.hashBuf = libpf.HashTrace(m.hashBuf, pid, frames, truncated)
	return h
}

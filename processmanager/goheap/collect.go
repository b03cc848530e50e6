package goheap

import (
	"context"
	"errors"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Target is a Go process whose heap profile is to be read.
type Target struct {
	PID     libpf.PID
	Process *libpf.ProcessInfo
	// Executable is the program's file as its frames refer to it; nil
	// leaves the frames without a mapping.
	Executable *libpf.Mapping
}

// Stats count what Collect did since the Reader was made.
type Stats struct {
	// Reads counts heap profiles read, Sites the allocation sites in
	// them, SitesSkipped the sites left out because their counts kept
	// reading torn.
	Reads, Sites, SitesSkipped uint64
	// ProfilingOff counts reads of programs that keep no profile;
	// Unsupported those of programs whose profile cannot be found (a
	// release or build the reader does not know, a file that only looks
	// like Go); Damaged those whose memory did not read as the runtime's
	// bucket list (overwritten, or not Go at all); Vanished those of
	// processes that exited meanwhile; Errors the other failures.
	ProfilingOff, Unsupported, Damaged, Vanished, Errors uint64
	// ReadTime is the time the reads took.
	ReadTime time.Duration
}

// collectState is the Reader's counters and the executables it has
// reported as unreadable, guarded by its mutex.
type collectState struct {
	mu       sync.Mutex
	stats    Stats
	reported map[exeKey]bool
}

// Stats returns the Reader's counters.
func (r *Reader) Stats() Stats {
	r.col.mu.Lock()
	defer r.col.mu.Unlock()
	return r.col.stats
}

// Collect reads the heap profile of each target, one after the other,
// until ctx ends, and returns those read. Failures are counted (Stats);
// a program whose profile cannot be found or read is reported once per
// executable.
func (r *Reader) Collect(ctx context.Context, targets []Target, log *logrus.Entry) []*libpf.HeapProfile {
	var out []*libpf.HeapProfile
	for _, t := range targets {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		p, key, err := r.read(int(t.PID))
		took := time.Since(t0)
		r.col.mu.Lock()
		st := &r.col.stats
		st.ReadTime += took
		var warn bool
		switch {
		case err == nil:
			st.Reads++
			st.Sites += uint64(len(p.Samples))
			st.SitesSkipped += uint64(p.Skipped)
		case errors.Is(err, ErrProfilingOff):
			st.ProfilingOff++
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH):
			st.Vanished++
		case errors.Is(err, ErrDamaged):
			st.Damaged++
			warn = true
		case errors.Is(err, errUnsupported):
			st.Unsupported++
			warn = true
		default:
			st.Errors++
			warn = true
		}
		if warn && !r.col.reported[key] {
			if r.col.reported == nil {
				r.col.reported = map[exeKey]bool{}
			}
			r.col.reported[key] = true
			path := ""
			if t.Process != nil {
				path = t.Process.ExecutablePath
			}
			log.WithError(err).Infof("Go heap profile of process %d (%s) not read; not reported again for this executable",
				t.PID, path)
		}
		r.col.mu.Unlock()
		if err != nil {
			continue
		}
		hp := &libpf.HeapProfile{Process: t.Process, Time: time.Now(), Period: p.Rate,
			Samples: make([]libpf.HeapSample, 0, len(p.Samples)), Symbolize: symbolizer(p.Resolve, t)}
		for _, s := range p.Samples {
			hp.Samples = append(hp.Samples, libpf.HeapSample{Stack: s.Stack, AllocObjects: s.AllocObjects,
				AllocBytes: s.AllocBytes, InUseObjects: s.InUseObjects, InUseBytes: s.InUseBytes})
		}
		out = append(out, hp)
	}
	return out
}

// symbolizer makes the traces of a target's heap profile: native frames of
// its executable, named by resolve.
func symbolizer(resolve func(uint64) Frame, t Target) func(stack []uint64) *libpf.Trace {
	return func(stack []uint64) *libpf.Trace {
		frames := make([]libpf.Frame, len(stack))
		for i, addr := range stack {
			f := resolve(addr)
			frames[i] = libpf.Frame{Kind: libpf.FrameNative, Address: addr, Mapping: t.Executable}
			if f.Function != "?" {
				frames[i].FunctionName, frames[i].SourceFile, frames[i].SourceLine = f.Function, f.File, uint32(f.Line)
			}
		}
		tr := &libpf.Trace{Frames: frames}
		tr.Hash, _ = libpf.HashTrace(nil, uint32(t.PID), frames, false)
		return tr
	}
}

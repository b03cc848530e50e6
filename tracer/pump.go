package tracer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Handler receives what BPF reports. Its methods are called from one
// goroutine, in the order BPF emitted the events.
type Handler interface {
	// HandleTrace is given a trace that is only valid during the call.
	HandleTrace(trace *support.Trace)
	ProcessExited(pid libpf.PID)
	// ProcessExeced says pid replaced its image: all its mappings changed.
	// program is the file it now runs (zero if BPF could not read it).
	ProcessExeced(pid libpf.PID, program support.FileKey)
	// UnknownPC says pc of pid was in no mapping loaded into BPF (pc 0: a
	// runtime's code ran where it was not described to BPF).
	UnknownPC(pid libpf.PID, pc uint64)
	// ExecMapped says pid mapped a file executable.
	ExecMapped(pid libpf.PID, m support.ExecMapping)
}

// pollInterval bounds how long a trace waits in the ring buffer: BPF wakes
// the reader only when the buffer is half full. Waking once a second
// instead of five times cut the daemon's CPU time at 20 Hz by a quarter
// (55 ms to 40 ms per 30 s, measured from schedstat, when each wait was a
// blocking syscall).
const pollInterval = time.Second

// TraceWakeupLatency bounds the wait of traces with interpreter frames or
// an APM trace context instead (BPF wakes the reader for them at most this
// often). Interpreter frames are symbolized from the process's memory, so
// the samples a process takes in its last TraceWakeupLatency before exiting
// may stay unnamed; APM agents wait for their correlation messages.
const TraceWakeupLatency = 200 * time.Millisecond

// Run pumps events to h until ctx is done, then hands h what is left in
// the ring buffer and returns. Detach before cancelling ctx to lose no
// sample. One goroutine reads the ring buffer into the event queue, this
// one hands the queued events to h.
func (t *Tracer) Run(ctx context.Context, h Handler) error {
	t.queue.open()
	read := make(chan error, 1)
	go func() {
		read <- t.read(ctx)
		t.queue.close()
	}()
	var trace support.Trace
	for {
		raw, ok := t.queue.pop()
		if !ok {
			return <-read
		}
		t.dispatch(raw, &trace, h)
		t.queue.release(raw)
	}
}

// read copies the ring buffer's records into the event queue until ctx is
// done, then what is left.
//
// BPF wakes the reader for a trace that WakesEarly at most once per
// TraceWakeupLatency, so such traces that follow a wake-up within that time
// wake no one: while they come, the reader polls every TraceWakeupLatency
// itself, and otherwise every pollInterval.
func (t *Tracer) read(ctx context.Context) error {
	var rec ringbuf.Record
	early, earlySincePoll := false, false
	stop := context.AfterFunc(ctx, t.wake.interrupt)
	defer stop()
	for {
		// Drain without waiting: the records BPF emitted without waking
		// anyone are there too.
		t.reader.SetDeadline(time.Now())
		for {
			err := t.reader.ReadInto(&rec)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			if err != nil {
				return err
			}
			isTrace := t.shared.RecordIsTrace(rec.RawSample)
			if isTrace && t.shared.RecordWakesEarly(rec.RawSample) {
				earlySincePoll = true
			}
			t.queue.push(rec.RawSample, isTrace)
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := pollInterval
		if early {
			wait = TraceWakeupLatency
		}
		woken, err := t.wake.wait(ctx, time.Now().Add(wait), func() bool { return t.reader.AvailableBytes() > 0 })
		if err != nil {
			return err
		}
		if !woken {
			early, earlySincePoll = earlySincePoll, false
		}
	}
}

// dispatch decodes one record and hands it to h.
func (t *Tracer) dispatch(raw []byte, trace *support.Trace, h Handler) {
	ev, err := t.shared.DecodeEvent(raw, trace)
	if err != nil {
		t.malformed.Add(1)
		log.Debugf("Dropping BPF event: %v", err)
		return
	}
	switch ev.Kind {
	case support.EventTrace:
		if ev.Trace.OffCPU {
			if t.offCPUPending != nil {
				t.offCPUPending.hold(ev.Trace, raw)
			}
			return
		}
		h.HandleTrace(ev.Trace)
	case support.EventOffCPUEnd:
		t.endOffCPU(ev, trace, h)
	case support.EventProcessExec:
		h.ProcessExeced(ev.PID, ev.Program)
	case support.EventProcessExit:
		h.ProcessExited(ev.PID)
	case support.EventUnknownPC:
		h.UnknownPC(ev.PID, ev.Addr)
	case support.EventExecMapped:
		h.ExecMapped(ev.PID, ev.Mapping)
	}
}

// endOffCPU hands h the trace of the wait ev ends, with how long it was.
func (t *Tracer) endOffCPU(ev support.Event, trace *support.Trace, h Handler) {
	if t.offCPUPending == nil {
		return
	}
	// A wait under the minimum ends only to free its trace.
	short := ev.Duration < t.cfg.OffCPU.MinWait
	raw, ok := t.offCPUPending.take(ev, !short)
	if !ok || short {
		return
	}
	if _, err := t.shared.DecodeEvent(raw, trace); err != nil {
		t.malformed.Add(1)
		return
	}
	trace.Waited = ev.Duration
	h.HandleTrace(trace)
}

// ringWaiter parks the pump in Go's network poller until BPF wakes the
// ring buffer's readers or a deadline passes. The ring buffer reader's own
// wait is a blocking epoll_wait: while a goroutine blocks in a syscall,
// Go's sysmon thread retakes its P and polls every 20 µs for about a
// millisecond after, which on a host with 50 execs a second (each an
// urgent event) was 43% of the daemon's CPU time (perf, 20 Hz).
type ringWaiter struct {
	f  *os.File // a non-blocking duplicate of the ring buffer's fd
	rc syscall.RawConn
}

func newRingWaiter(fd int) (*ringWaiter, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicating the ring buffer's fd: %w", err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("ring buffer fd: %w", err)
	}
	f := os.NewFile(uintptr(dup), "events ring buffer")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	// A file the poller does not take cannot have a deadline: the wait
	// would block for good.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("the ring buffer's fd cannot be polled: %w", err)
	}
	return &ringWaiter{f: f, rc: rc}, nil
}

// wait returns when ready() holds (woken), at the deadline or once ctx is
// done (not woken). ready is asked first, and again after each wake-up.
// ctx must interrupt the wait when done (Run arranges it).
func (w *ringWaiter) wait(ctx context.Context, deadline time.Time, ready func() bool) (woken bool, err error) {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, nil // done before the deadline was set: its interrupt was overwritten
	}
	err = w.rc.Read(func(uintptr) bool { return ready() })
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, nil
	}
	return err == nil, err
}

// interrupt ends a wait at once.
func (w *ringWaiter) interrupt() { w.f.SetReadDeadline(time.Now()) }

func (w *ringWaiter) close() { w.f.Close() }

// MalformedEvents is how many ring buffer records did not decode.
func (t *Tracer) MalformedEvents() uint64 { return t.malformed.Load() }

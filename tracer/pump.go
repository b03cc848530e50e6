package tracer

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Handler receives what BPF reports. Its methods are called from the one
// goroutine running Run, in the order BPF emitted the events.
type Handler interface {
	// HandleTrace is given a trace that is only valid during the call.
	HandleTrace(trace *support.Trace)
	ProcessExited(pid libpf.PID)
	// ProcessExeced says pid replaced its image: all its mappings changed.
	ProcessExeced(pid libpf.PID)
	// UnknownPC says a PC of pid was in no mapping loaded into BPF.
	UnknownPC(pid libpf.PID)
	// ExecMapped says pid mapped a file executable.
	ExecMapped(pid libpf.PID, m support.ExecMapping)
}

// pollInterval bounds how long a trace waits in the ring buffer: BPF wakes
// the reader only when the buffer is half full. Each wait is a blocking
// syscall that keeps Go's sysmon thread busy until it returns, so waking
// once a second instead of five times cut the daemon's CPU time at 20 Hz by
// a quarter (55 ms to 40 ms per 30 s, measured from schedstat).
const pollInterval = time.Second

// TraceWakeupLatency bounds the wait of traces with interpreter frames or
// an APM trace context instead (BPF wakes the reader for them at most this
// often). Interpreter frames are symbolized from the process's memory, so
// the samples a process takes in its last TraceWakeupLatency before exiting
// may stay unnamed; APM agents wait for their correlation messages.
const TraceWakeupLatency = 200 * time.Millisecond

// Run pumps events to h until ctx is done, then reads what is left in the
// ring buffer and returns. Detach before cancelling ctx to lose no sample.
//
// BPF wakes the reader for a trace that WakesEarly at most once per
// TraceWakeupLatency, so such traces that follow a wake-up within that time
// wake no one: while they come, the reader polls every TraceWakeupLatency
// itself, and otherwise every pollInterval.
func (t *Tracer) Run(ctx context.Context, h Handler) error {
	var rec ringbuf.Record
	var trace support.Trace
	early, earlySincePoll := false, false
	for {
		wait := pollInterval
		if early {
			wait = TraceWakeupLatency
		}
		deadline := time.Now().Add(wait)
		if ctx.Err() != nil {
			deadline = time.Now() // drain without waiting
		}
		t.reader.SetDeadline(deadline)
		err := t.reader.ReadInto(&rec)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return nil
			}
			early, earlySincePoll = earlySincePoll, false
			continue
		case errors.Is(err, ringbuf.ErrClosed):
			return nil
		case err != nil:
			return err
		}
		ev, err := t.shared.DecodeEvent(rec.RawSample, &trace)
		if err != nil {
			t.malformed.Add(1)
			log.Debugf("Dropping BPF event: %v", err)
			continue
		}
		switch ev.Kind {
		case support.EventTrace:
			if ev.Trace.WakesEarly() {
				early, earlySincePoll = true, true
			}
			h.HandleTrace(ev.Trace)
		case support.EventProcessExec:
			h.ProcessExeced(ev.PID)
		case support.EventProcessExit:
			h.ProcessExited(ev.PID)
		case support.EventUnknownPC:
			h.UnknownPC(ev.PID)
		case support.EventExecMapped:
			h.ExecMapped(ev.PID, ev.Mapping)
		}
	}
}

// MalformedEvents is how many ring buffer records did not decode.
func (t *Tracer) MalformedEvents() uint64 { return t.malformed.Load() }

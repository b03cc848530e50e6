package processmanager

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
)

// A daemon that starts on a busy host would otherwise read each process
// when its first sample arrives, and BPF, which unwinds at sample time,
// would meanwhile stop at the first frame whose file's deltas are not
// loaded: seconds of incomplete stacks for every process that was already
// running. So the processes that use the CPU while the BPF programs load
// are set up before sampling starts (PrepareBusy). The daemon itself is
// left to its first sample: it is busy now with the start-up, and reading
// its own large binary first would delay everyone else's stacks.

// CPUTimes is the CPU time each process had used at one moment, for
// PrepareBusy to tell which processes were busy since.
type CPUTimes struct {
	at    time.Time
	procs map[uint32]procCPU
}

type procCPU struct{ startTime, ticks uint64 }

// ReadCPUTimes reads the CPU time of every process in procFS ("/proc"
// when empty). Processes that cannot be read are left out.
func ReadCPUTimes(procFS string) CPUTimes {
	return readCPUTimes(proc.FS{Mount: cmp.Or(procFS, "/proc")})
}

func readCPUTimes(src proc.Source) CPUTimes {
	t := CPUTimes{at: time.Now(), procs: map[uint32]procCPU{}}
	pids, err := src.PIDs()
	if err != nil {
		return t
	}
	for _, pid := range pids {
		if st, err := src.Stat(pid); err == nil {
			t.procs[pid] = procCPU{st.StartTime, st.CPUTicks}
		}
	}
	return t
}

// minBusyWindow is the least time over which processes are found busy: a
// clock tick is 10 ms, and a process must use a few to count.
const minBusyWindow = 250 * time.Millisecond

// busyWindow is how long PrepareBusy looks for busy processes: where many
// share few CPUs, each gets a tick now and then, and one that got none in
// the first quarter second is found in a later look.
const busyWindow = time.Second

// busySince returns the processes that used CPU time since before, the
// busiest first.
func busySince(before, now CPUTimes) []uint32 {
	type busy struct {
		pid   uint32
		ticks uint64
	}
	var out []busy
	for pid, c := range now.procs {
		b, ok := before.procs[pid]
		switch {
		case !ok || b.startTime != c.startTime:
			// Started since: its whole CPU time is recent.
			if c.ticks > 0 {
				out = append(out, busy{pid, c.ticks})
			}
		case c.ticks > b.ticks:
			out = append(out, busy{pid, c.ticks - b.ticks})
		}
	}
	slices.SortFunc(out, func(a, b busy) int {
		return cmp.Or(cmp.Compare(b.ticks, a.ticks), cmp.Compare(a.pid, b.pid))
	})
	pids := make([]uint32, len(out))
	for i, b := range out {
		pids[i] = b.pid
	}
	return pids
}

// StartupPreparation says what PrepareBusy did.
type StartupPreparation struct {
	// Busy processes were found, Prepared of them were set up (not the
	// rest: ctx ended first, or they exited).
	Busy, Prepared int
	// Complete says whether all their files' deltas were loaded before
	// ctx ended.
	Complete bool
	Took     time.Duration
}

// PrepareBusy sets up the processes that used CPU time since before, the
// busiest first: reads their mappings and files, attaches their runtimes
// and APM agents, and loads their files' stack deltas. It returns once all
// of that is done or ctx ends; call it before sampling starts.
func (m *Manager) PrepareBusy(ctx context.Context, before CPUTimes) StartupPreparation {
	start := time.Now()
	res := StartupPreparation{}
	found := map[uint32]bool{}
	// Each look sets up the processes busy since before that earlier looks
	// did not find, the busiest first; the set-up of one takes long enough
	// for the next look to see the others.
	for wait := minBusyWindow; ctx.Err() == nil; wait = busyWindow {
		if d := wait - time.Since(before.at); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		now := readCPUTimes(m.source)
		var fresh []uint32
		for _, pid := range busySince(before, now) {
			if !found[pid] {
				found[pid] = true
				fresh = append(fresh, pid)
			}
		}
		if len(fresh) == 0 && now.at.Sub(before.at) >= busyWindow {
			break
		}
		res.Prepared += m.setUpBusy(ctx, fresh)
	}
	res.Busy = len(found)
	read := time.Now()
	res.Complete = m.waitUnwind(ctx)
	m.log.Debugf("Busy processes read in %v, their stack deltas loaded %v later",
		read.Sub(start).Round(time.Millisecond), time.Since(read).Round(time.Millisecond))
	res.Took = time.Since(start)
	return res
}

// setUpBusy sets up pids, the busiest first, a few side by side: one
// process's set-up waits on its files and runtime as much as it computes,
// and most of it (the reads before the manager's lock) runs in parallel.
// It returns how many it set up.
func (m *Manager) setUpBusy(ctx context.Context, pids []uint32) int {
	next := make(chan uint32)
	var prepared atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), maxStartupWorkers) {
		wg.Go(func() {
			for pid := range next {
				began := time.Now()
				done := m.prepare(pid, "", true)
				m.RefreshMappings(libpf.PID(pid))
				done()
				if m.Tracks(libpf.PID(pid)) {
					prepared.Add(1)
					m.log.Debugf("Set up process %d in %v", pid, time.Since(began).Round(time.Millisecond))
				}
			}
		})
	}
	for _, pid := range pids {
		if ctx.Err() != nil || pid == m.self {
			continue
		}
		next <- pid
	}
	close(next)
	wg.Wait()
	return int(prepared.Load())
}

// maxStartupWorkers bounds the processes set up at once before sampling.
const maxStartupWorkers = 4

// waitUnwind waits until the delta loader has done every job queued so far,
// or ctx ends; it reports whether it was done.
func (m *Manager) waitUnwind(ctx context.Context) bool {
	if m.unwind == nil {
		return true
	}
	done := make(chan struct{})
	go func() {
		m.unwind.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

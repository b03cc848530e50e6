package reporter

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// SyntheticLoad describes a made-up busy host, for benchmarks and tests of
// the web view: Processes programs whose call trees branch like real ones,
// sampled at SamplesPerSecond for Duration, with at least Stacks distinct
// stacks.
type SyntheticLoad struct {
	Processes        int
	Stacks           int
	SamplesPerSecond int
	Duration         time.Duration
	Interval         time.Duration
	Seed             uint64
}

// BusyHour is one hour of a busy host: 64 CPUs at 20 Hz (4.6 million
// samples), 100,000 distinct stacks of 40 processes, 5 s intervals.
var BusyHour = SyntheticLoad{Processes: 40, Stacks: 100_000, SamplesPerSecond: 1280,
	Duration: time.Hour, Interval: 5 * time.Second, Seed: 1}

// FillSynthetic adds the intervals of load to h, ending at end.
func FillSynthetic(h *History, load SyntheticLoad, end time.Time) {
	rng := rand.New(rand.NewPCG(load.Seed, 1))
	kinds := []libpf.FrameKind{libpf.FrameNative, libpf.FrameKernel, libpf.FirstRuntimeKind}
	procs := make([]*libpf.ProcessInfo, load.Processes)
	for i := range procs {
		procs[i] = &libpf.ProcessInfo{PID: libpf.PID(1000 + i), ExecutableName: fmt.Sprintf("service-%02d", i%12)}
	}
	// A stack is a walk from a process's entry point: at each depth one of
	// a few callees of the caller, so that stacks share prefixes.
	seen := make(map[[2]uint64]bool)
	traces := make([]*libpf.Trace, 0, load.Stacks)
	owner := make([]*libpf.ProcessInfo, 0, load.Stacks)
	for len(traces) < load.Stacks {
		p := rng.IntN(len(procs))
		depth := 12 + rng.IntN(30)
		fns := make([]uint64, depth)
		fn := uint64(p)
		for d := range fns {
			fn = fn*31 + uint64(rng.IntN(2+d/3))
			fns[d] = fn
		}
		key := [2]uint64{fn, uint64(p)<<32 | uint64(depth)}
		if seen[key] {
			continue
		}
		seen[key] = true
		t := &libpf.Trace{Hash: libpf.TraceHash{Hi: uint64(len(traces)) + 1, Lo: fn}}
		for d := depth - 1; d >= 0; d-- {
			kind := kinds[0]
			switch {
			case d >= depth-3 && fns[d]%2 == 0:
				kind = kinds[1]
			case d > 2 && d < depth/2:
				kind = kinds[2]
			}
			// A host runs some 50,000 functions.
			f := fns[d] % 50_000
			t.Frames = append(t.Frames, libpf.Frame{
				Kind: kind, FunctionName: fmt.Sprintf("fn_%x", f),
				SourceFile: fmt.Sprintf("src/mod%d.c", f%97), SourceLine: uint32(f % 500),
			})
		}
		traces = append(traces, t)
		owner = append(owner, procs[p])
	}
	intervals := int(load.Duration / load.Interval)
	perInterval := int(float64(load.SamplesPerSecond) * load.Interval.Seconds())
	next := 0
	for i := range intervals {
		start := end.Add(-time.Duration(intervals-i) * load.Interval)
		a := newAggregator(start, defaultMaxSamplesPerInterval)
		for s := range perInterval {
			// Every stack comes up in turn, half the samples go to a few
			// hot ones.
			j := next % len(traces)
			if s%2 == 0 {
				j = rng.IntN(min(50, len(traces)))
			} else {
				next++
			}
			ts := start.Add(time.Duration(s) * load.Interval / time.Duration(perInterval))
			p := owner[j]
			a.add(traces[j], &libpf.SampleMeta{Time: ts, TID: libpf.TID(p.PID), ThreadName: p.ExecutableName, Process: p},
				uint64(ts.UnixNano()))
		}
		h.add(a.swap(start.Add(load.Interval)), int64(time.Second)/int64(max(load.SamplesPerSecond, 1)))
	}
}

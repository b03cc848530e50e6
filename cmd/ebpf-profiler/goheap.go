package main

import (
	"context"
	"fmt"
	"time"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
	"github.com/hostprof/ebpf-profiler/reporter"
)

// runGoHeaps reads the heap profile of every Go program being profiled
// each interval, until ctx ends, and hands them to the reporter. A round
// that takes longer than the interval is cut short; the targets come in
// no fixed order, so the next does not miss the same ones.
func runGoHeaps(ctx context.Context, interval time.Duration, r *goheap.Reader, pm *processmanager.Manager,
	rep *reporter.Reporter) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	entry := log.WithField("component", "go-heap")
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		targets := pm.GoHeapTargets(ctx, func(pid uint32) bool { return r.IsGo(int(pid)) })
		round, cancel := context.WithTimeout(ctx, interval)
		profiles := r.Collect(round, targets, entry)
		cancel()
		for _, hp := range profiles {
			rep.ReportHeap(hp)
		}
	}
}

// goHeapStatus is what the interval's heap reads did: profiles read, their
// allocation sites, and the reads that failed, by reason; "" without any.
func goHeapStatus(prev, cur goheap.Stats) string {
	if cur.Reads == prev.Reads && cur.ProfilingOff == prev.ProfilingOff && cur.Vanished == prev.Vanished &&
		cur.Errors+cur.Damaged+cur.Unsupported == prev.Errors+prev.Damaged+prev.Unsupported {
		return ""
	}
	return fmt.Sprintf("reads=%d sites=%d torn_sites=%d ms=%d profiling_off=%d unsupported=%d damaged=%d vanished=%d errors=%d",
		cur.Reads-prev.Reads, cur.Sites-prev.Sites, cur.SitesSkipped-prev.SitesSkipped,
		(cur.ReadTime - prev.ReadTime).Milliseconds(), cur.ProfilingOff-prev.ProfilingOff,
		cur.Unsupported-prev.Unsupported, cur.Damaged-prev.Damaged, cur.Vanished-prev.Vanished, cur.Errors-prev.Errors)
}

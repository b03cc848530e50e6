package reporter

import (
	"bufio"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// WritePprof writes the selected samples as a gzipped pprof profile, by the
// reporter's builder. The samples keep their process, pid and thread name;
// the history keeps no tids, CPUs or times within the profile, and
// symbolized frames lose their addresses (their locations have the
// mapping's start).
func (h *History) WritePprof(w io.Writer, sel Selection) error {
	iv := h.selectionInterval(&sel)
	return buildPprof(iv, h.period.Load()).Write(w)
}

func (h *History) selectionInterval(sel *Selection) *interval {
	h.mu.RLock()
	defer h.mu.RUnlock()
	type key struct{ meta, stack uint32 }
	traces := make(map[uint32]*libpf.Trace)
	procs := make(map[uint32]*libpf.ProcessInfo)
	groups := make(map[key]*sampleGroup)
	iv := newInterval(time.Time{})
	cpuWeight := h.cpuWeight(sel.Measure)
	h.each(sel, func(sr *histSeries, count uint64, sec int64) {
		k := key{sr.meta, sr.stack}
		g := groups[k]
		if g == nil {
			g = &sampleGroup{trace: traces[sr.stack]}
			if g.trace == nil {
				s := &h.tab.stacks[sr.stack]
				t := &libpf.Trace{Frames: make([]libpf.Frame, len(s.frames)), Truncated: s.truncated}
				for i, f := range s.frames {
					t.Frames[i] = h.tab.frames[f]
				}
				g.trace, traces[sr.stack] = t, t
			}
			m := &h.tab.metas[sr.meta]
			p := procs[sr.meta]
			if p == nil {
				p = &libpf.ProcessInfo{PID: m.pid, ExecutableName: m.process, ContainerID: m.container,
					ContainerName: m.containerName, Namespace: m.namespace, ServiceName: m.service}
				if _, name, ok := strings.Cut(m.pod, "/"); ok {
					p.PodName = name
				}
				procs[sr.meta] = p
			}
			g.key = sampleKey{pid: m.pid, process: p, threadName: m.thread, labels: m.labels,
				hash: libpf.TraceHash{Lo: uint64(sr.stack)}, offCPU: m.offCPU}
			groups[k] = g
			iv.groups[g.key] = g
		}
		if g.key.offCPU {
			// Waits without their times: one per second, its total.
			g.waits = append(g.waits, int64(count)*int64(OffCPUUnit))
			iv.waits++
		} else {
			g.summed += int(count / cpuWeight)
			iv.samples += int(count / cpuWeight)
		}
		t := time.Unix(sec, 0)
		if iv.start.IsZero() || t.Before(iv.start) {
			iv.start = t
		}
		if end := t.Add(time.Second); end.After(iv.end) {
			iv.end = end
		}
	})
	return iv
}

// WriteCollapsed writes the selected samples as collapsed stacks, one line
// per call path of functions, "process;outermost;...;leaf count", as
// flamegraph.pl and speedscope read them. Names lose the separators ';'
// and newline.
func (h *History) WriteCollapsed(w io.Writer, sel Selection) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	self := h.nodeCounts(&sel)
	clean := strings.NewReplacer(";", ":", "\n", " ", "\r", " ")
	bw := bufio.NewWriter(w)
	var path []string
	for n, count := range self {
		if count == 0 || n == 0 {
			continue
		}
		path = path[:0]
		for a := uint32(n); a != 0; a = h.tab.tree[a].parent {
			path = append(path, clean.Replace(h.tab.funcs[h.tab.tree[a].function()].name))
		}
		slices.Reverse(path)
		bw.WriteString(strings.Join(path, ";"))
		bw.WriteByte(' ')
		bw.WriteString(strconv.FormatUint(count, 10))
		if _, err := bw.WriteString("\n"); err != nil {
			return err
		}
	}
	return bw.Flush()
}

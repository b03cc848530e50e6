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
	if sel.Measure.memory() {
		iv := &interval{heaps: h.selectionHeaps(&sel)}
		if len(iv.heaps) == 0 {
			// An empty profile of the heap's sample types.
			iv.heaps = []*libpf.HeapProfile{{Time: sel.To}}
		}
		return buildHeapPprof(iv).Write(w)
	}
	iv := h.selectionInterval(&sel)
	return buildPprof(iv, h.period.Load()).Write(w)
}

// selectionHeaps are the last heap profile of each process in the
// selection's range, with only the selected stacks.
func (h *History) selectionHeaps(sel *Selection) []*libpf.HeapProfile {
	h.mu.RLock()
	defer h.mu.RUnlock()
	s := h.selector(sel)
	var out []*libpf.HeapProfile
	// A sample's stack is its stack's index in the tables: the traces
	// are made here, under the lock.
	traces := map[uint64]*libpf.Trace{}
	symbolize := func(stack []uint64) *libpf.Trace { return traces[stack[0]] }
	for _, hh := range h.lastHeaps(s) {
		var hp *libpf.HeapProfile
		for i, sr := range hh.series {
			if !s.series(sr) {
				continue
			}
			series := &h.tab.series[sr]
			if hp == nil {
				m := &h.tab.metas[series.meta]
				hp = &libpf.HeapProfile{Time: hh.at, Symbolize: symbolize, Process: &libpf.ProcessInfo{PID: m.pid,
					ExecutableName: m.process, ContainerID: m.container, ContainerName: m.containerName,
					Namespace: m.namespace, ServiceName: m.service}}
			}
			if traces[uint64(series.stack)] == nil {
				traces[uint64(series.stack)] = h.tab.trace(series.stack)
			}
			hp.Samples = append(hp.Samples, libpf.HeapSample{Stack: []uint64{uint64(series.stack)},
				InUseBytes: int64(hh.inuse[i]), AllocBytes: int64(hh.alloc[i])})
		}
		if hp != nil {
			out = append(out, hp)
		}
	}
	return out
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
				g.trace = h.tab.trace(sr.stack)
				traces[sr.stack] = g.trace
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

// trace rebuilds a stack's trace from the tables.
func (t *histTables) trace(stack uint32) *libpf.Trace {
	s := &t.stacks[stack]
	tr := &libpf.Trace{Frames: make([]libpf.Frame, len(s.frames)), Truncated: s.truncated}
	for i, f := range s.frames {
		tr.Frames[i] = t.frames[f]
	}
	return tr
}

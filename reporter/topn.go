package reporter

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// topEntry is one line of the summary: a leaf function in one executable
// and how many of the interval's samples it was running in.
type topEntry struct {
	function, process string
	samples           int
}

// topFunctions ranks (leaf function, executable) pairs by self samples, the
// n highest first; ties are broken by name so output is deterministic.
func topFunctions(iv *interval, n int) []topEntry {
	counts := make(map[[2]string]int)
	for _, g := range iv.groups {
		if g.key.offCPU {
			continue // the summary ranks CPU samples
		}
		proc := "unknown"
		if g.key.process != nil && g.key.process.ExecutableName != "" {
			proc = g.key.process.ExecutableName
		}
		counts[[2]string{leafName(g.trace), proc}] += g.count()
	}
	entries := make([]topEntry, 0, len(counts))
	for k, c := range counts {
		entries = append(entries, topEntry{function: k[0], process: k[1], samples: c})
	}
	slices.SortFunc(entries, func(a, b topEntry) int {
		return cmp.Or(
			cmp.Compare(b.samples, a.samples),
			cmp.Compare(a.function, b.function),
			cmp.Compare(a.process, b.process),
		)
	})
	return entries[:min(n, len(entries))]
}

func leafName(t *libpf.Trace) string {
	if len(t.Frames) == 0 {
		return "[empty stack]"
	}
	return frameName(&t.Frames[0])
}

// frameName is how the summary shows a frame: its symbol, or file+offset
// when unsymbolized, which is enough to look the address up later.
func frameName(f *libpf.Frame) string {
	if name := symbolName(f); name != "" {
		// A kernel module's function with its module, as perf shows it:
		// "nft_do_chain [nf_tables]".
		if f.Kind == libpf.FrameKernel && f.Mapping != nil && strings.HasPrefix(f.Mapping.Path, "[") {
			return name + " " + f.Mapping.Path
		}
		return name
	}
	if f.Mapping != nil && f.Mapping.Path != "" {
		return fmt.Sprintf("%s+0x%x", path.Base(f.Mapping.Path), f.Address)
	}
	return fmt.Sprintf("0x%x", f.Address)
}

// formatTopN renders the summary: a header, then one line per entry as
// "function (process) pct%" with pct the share of all total samples.
func formatTopN(entries []topEntry, total int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "top %d functions by self samples (of %d samples):", len(entries), total)
	for _, e := range entries {
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(e.samples) / float64(total)
		}
		fmt.Fprintf(&sb, "\n%s (%s) %.1f%%", e.function, e.process, pct)
	}
	return sb.String()
}

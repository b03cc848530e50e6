package ruby

import (
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// minJITArea is the least size of the anonymous area taken for YJIT's
// code: YJIT maps its whole code area at start, executable (3.1: 256 MiB
// by default) or reserved inaccessible with its executable pages made so
// as code is written (3.2+: 64-128 MiB), while the trampolines of libffi
// and the like are a page or a few (internals.md §8).
const minJITArea = 1 << 20

// jitAreas finds YJIT's code areas among a process's mappings (sorted by
// address): runs of adjacent anonymous mappings, executable or
// inaccessible, that start executable and span minJITArea, or that are
// named for YJIT. The whole run is claimed, so code YJIT writes into its
// reserve later is claimed already.
func jitAreas(ms []interpreter.Mapping) []interpreter.Region {
	var out []interpreter.Region
	var run interpreter.Region
	named, inRun := false, false
	flush := func() {
		if inRun && (run.End-run.Start >= minJITArea || named) {
			out = append(out, run)
		}
		inRun, named = false, false
	}
	for _, m := range ms {
		switch {
		case m.Anonymous() && inRun && m.Start == run.End && (m.Executable || m.Inaccessible):
			run.End = m.End
		case m.Anonymous() && m.Executable:
			flush()
			run, inRun = interpreter.Region{Start: m.Start, End: m.End, Unwind: true}, true
		default:
			flush()
			continue
		}
		named = named || strings.Contains(m.Path, "yjit")
	}
	flush()
	return out
}

package ruby

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// minJITArea is the least size of the anonymous area taken for YJIT's
// code: YJIT maps its whole code area at start, executable (3.1: 256 MiB
// by default) or reserved inaccessible with its executable pages made so
// as code is written (3.2+: 64-128 MiB), while the trampolines of libffi
// and the like are a page or a few (internals.md §8).
const minJITArea = 1 << 20

// maxMapsLines bounds the /proc/PID/maps lines read.
const maxMapsLines = 1 << 20

// jitAreas finds YJIT's code areas in a /proc/PID/maps listing: runs of
// adjacent anonymous mappings, executable or inaccessible, that start
// executable and span minJITArea, or that are named for YJIT. The whole
// run is claimed, so code YJIT writes into its reserve later is claimed
// already.
func jitAreas(maps io.Reader) ([]interpreter.Region, error) {
	var out []interpreter.Region
	var run interpreter.Region
	named, inRun := false, false
	flush := func() {
		if inRun && (run.End-run.Start >= minJITArea || named) {
			out = append(out, run)
		}
		inRun, named = false, false
	}
	sc := bufio.NewScanner(maps)
	for n := 0; sc.Scan(); n++ {
		if n == maxMapsLines {
			return nil, fmt.Errorf("more than %d mappings", maxMapsLines)
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("malformed maps line %q", sc.Text())
		}
		path := strings.Join(fields[5:], " ")
		anonymous := fields[4] == "0" && (path == "" || strings.HasPrefix(path, "[anon:"))
		perms := fields[1]
		switch {
		case anonymous && inRun && start == run.End && (perms == "r-xp" || perms == "---p"):
			run.End = end
		case anonymous && perms == "r-xp":
			flush()
			run, inRun = interpreter.Region{Start: start, End: end, Unwind: true}, true
		default:
			flush()
			continue
		}
		named = named || strings.Contains(path, "yjit")
	}
	flush()
	return out, sc.Err()
}

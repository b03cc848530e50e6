package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/ruby"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// rubyWorkload returns the path of rbworkload.rb and the lines of its
// "# hot: NAME" marks.
func rubyWorkload(t *testing.T) (string, map[string]uint32) {
	_, here, _, _ := runtime.Caller(0)
	path, err := filepath.Abs(filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", "ruby", "rbworkload.rb"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for n := uint32(1); sc.Scan(); n++ {
		if _, name, ok := strings.Cut(sc.Text(), "# hot: "); ok {
			lines[strings.TrimSpace(name)] = n
		}
	}
	return path, lines
}

// runRuby runs the workload in one mode for d.
func runRuby(t *testing.T, rb, script, mode string, d time.Duration) pythonRun {
	t.Helper()
	cmd := exec.Command(rb, script, mode, formatSeconds(d))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", rb, mode, err, out)
	}
	return pythonRun{pid: cmd.Process.Pid, hotFrom: hotFrom(t, string(out))}
}

// rubyFrames returns a trace's Ruby frames, leaf first.
func rubyFrames(tr *libpf.Trace) []libpf.Frame {
	var out []libpf.Frame
	for _, f := range tr.Frames {
		if f.Kind == ruby.Kind {
			out = append(out, f)
		}
	}
	return out
}

// rubyStack is a trace's frames as the failure messages show them: Ruby
// frames with their line, native frames by name.
func rubyStack(tr *libpf.Trace) string {
	var names []string
	for _, f := range tr.Frames {
		switch {
		case f.Kind == ruby.Kind:
			names = append(names, fmt.Sprintf("rb:%s:%d", f.FunctionName, f.SourceLine))
		case f.FunctionName != "":
			names = append(names, f.FunctionName)
		case f.Mapping != nil:
			names = append(names, fmt.Sprintf("%s+%#x", filepath.Base(f.Mapping.Path), f.Address))
		default:
			names = append(names, fmt.Sprintf("%v:%#x", f.Kind, f.Address))
		}
	}
	return strings.Join(names, " ")
}

// TestRubyStacks profiles the chain workload under each tested CRuby and
// checks its Ruby frames: leaf at its hot line, mid, the block in top,
// Hash#each_pair (a C function: its native frames lie between the block
// and it), top and <main>, each in the script at its line.
func TestRubyStacks(t *testing.T) {
	requireRoot(t)
	script, hot := rubyWorkload(t)
	results := map[string][]float64{}
	for _, v := range rubyfetch.Versions {
		t.Run("Ruby "+v, func(t *testing.T) {
			rb, err := rubyfetch.Ruby(v)
			if err != nil {
				t.Fatal(err)
			}
			s := startSession(t, testHz)
			run := runRuby(t, rb, script, "chain", 4*time.Second)
			logRuntimeMetrics(t, s, "ruby")
			s.stop(t)
			samples := run.hotSamples(t, s.rec)
			each := "Hash#each_pair"
			if v == "3.1" { // classes keep no readable path before 3.3
				each = "each_pair"
			}
			// leaf's loop is two lines: the jump back has the while's.
			want := []struct {
				name  string
				lines []uint32
			}{{"leaf", []uint32{hot["leaf"], hot["leaf loop"]}}, {"mid", []uint32{hot["mid"]}}, {"block in top", []uint32{hot["top"]}},
				{each, []uint32{0}}, {"top", []uint32{hot["top"]}}, {"<main>", []uint32{hot["main"]}}}
			ok := 0
			misses := map[string]int{}
			for _, smp := range samples {
				fs := rubyFrames(smp.trace)
				good := len(fs) == len(want)
				for i := 0; good && i < len(want); i++ {
					f := fs[i]
					good = f.FunctionName == want[i].name && slices.Contains(want[i].lines, f.SourceLine) &&
						(f.SourceLine == 0 || f.SourceFile == script)
				}
				if good {
					ok++
				} else {
					misses[rubyStack(smp.trace)]++
				}
			}
			share := share(ok, len(samples))
			results[v] = []float64{share}
			t.Logf("%d samples, %.1f%% with the chain at its lines", len(samples), 100*share)
			logTopStacks(t, misses, 4)
			if len(samples) < testHz || share < 0.95 {
				t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, len(samples))
			}
		})
	}
	logShareTable(t, "Ruby", rubyfetch.Versions, []string{"chain"}, results)
}

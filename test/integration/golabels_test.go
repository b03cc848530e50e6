package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
)

// goLabelBuild is one build of the golabels workload.
type goLabelBuild struct {
	version string
	// cgo links with the C linker: the runtime's g is then a TLS variable
	// the linker places (runtime.tlsg, runtime.tls_g), read from the
	// thread pointer on arm64 too.
	cgo bool
	// stripped drops the symbol table and DWARF (-ldflags=-s -w), as
	// release builds often do: the offsets come from the table alone.
	stripped bool
}

func (b goLabelBuild) name() string {
	n := "go" + b.version
	if b.cgo {
		n += "_cgo"
	}
	if b.stripped {
		n += "_stripped"
	}
	return n
}

// goLabelBuilds are every tested Go release built without cgo, and the
// machine's release with cgo and stripped.
func goLabelBuilds() []goLabelBuild {
	var bs []goLabelBuild
	for _, v := range gofetch.Versions {
		bs = append(bs, goLabelBuild{version: v})
	}
	return append(bs, goLabelBuild{version: gofetch.System, cgo: true},
		goLabelBuild{version: gofetch.System, cgo: true, stripped: true})
}

// buildGoLabels builds the golabels workload (its own module) for the
// target architecture.
func buildGoLabels(t *testing.T, b goLabelBuild) string {
	t.Helper()
	tc := targetToolchain(t)
	bin, build := workloadPath(t, "golabels", "go", b.name(), tc.goarch)
	if !build {
		return bin
	}
	goCmd, env, err := gofetch.Command(b.version)
	if err != nil {
		t.Fatal(err)
	}
	env = append(env, "GOARCH="+tc.goarch, "CGO_ENABLED=0")
	var ldflags []string
	if b.cgo {
		env = append(env, "CGO_ENABLED=1", "CC="+tc.cc)
		ldflags = append(ldflags, "-linkmode=external")
	}
	if b.stripped {
		ldflags = append(ldflags, "-s", "-w")
	}
	run(t, workloadDir("golabels"), env, goCmd, "build", "-ldflags="+strings.Join(ldflags, " "), "-o", bin, ".")
	return bin
}

// goLabelLoops are the workload's loops and the labels each runs under
// (nil: none), of which a sample carries keep.
var goLabelLoops = []struct {
	function string
	labels   map[string]string
	keep     int
}{
	{"main.alphaLoop", map[string]string{"tenant": "alpha", "endpoint": "/a"}, 2},
	{"main.betaLoop", map[string]string{"tenant": "beta", "endpoint": "/b"}, 2},
	{"main.plainLoop", nil, 0},
	// Ten of twelve: the first ten in key order from Go 1.24 on, ten in
	// the map's order before.
	{"main.manyLoop", manyLabels(), 10},
}

// manyLabels are manyLoop's labels as a sample carries them: k00's value
// cut to 48 bytes.
func manyLabels() map[string]string {
	m := map[string]string{}
	for i := range 12 {
		m[fmt.Sprintf("k%02d", i)] = fmt.Sprintf("v%02d", i)
	}
	m["k00"] = strings.Repeat("v", 48)
	return m
}

// TestGoLabels runs the golabels workload, built by every tested Go
// release, in which four goroutines spin under their own pprof labels
// (two tenants, none, twelve labels) and yield now and then, so that they
// move between threads. BPF follows the thread's g to the goroutine it
// runs and reads that goroutine's labels, so a loop's samples must carry
// its labels, and never another loop's.
func TestGoLabels(t *testing.T) {
	requireRoot(t)
	results := shareResults{m: map[string][]float64{}}
	var names []string
	// The builds run two at a time (pairUp) inside one group, so that the
	// table is logged once all have finished.
	t.Run("builds", func(t *testing.T) {
		for _, b := range goLabelBuilds() {
			names = append(names, b.name())
			t.Run(b.name(), func(t *testing.T) {
				pairUp(t)
				results.init(b.name(), len(goLabelLoops))
				runGoLabels(t, b, func(i int, share float64) { results.set(b.name(), i, share) })
			})
		}
	})
	logShareTable(t, "Go build: share of a loop's samples with its labels", names,
		[]string{"tenant alpha", "tenant beta", "no labels", "12 labels"}, results.m)
}

// runGoLabels profiles one build of the workload and checks each loop's
// samples from the process's first labelled one on: before it, the
// daemon did not know the program yet (its set-up at its first sample,
// counted as its warm-up).
func runGoLabels(t *testing.T, b goLabelBuild, result func(loop int, share float64)) {
	bin := buildGoLabels(t, b)
	s := startSession(t, testHz)
	pid, _ := runWorkload(t, bin, 4*time.Second)
	s.waitExited(t, pid)
	samples := s.rec.ofPID(pid)
	first := slices.IndexFunc(samples, func(smp sample) bool { return !smp.meta.Labels.IsZero() })
	if first < 0 || first > maxWarmupSamples {
		t.Fatalf("%d samples before the first with labels (-1: none of %d), want <= %d",
			first, len(samples), maxWarmupSamples)
	}
	t.Logf("%d of %d samples before the first with labels", first, len(samples))
	for i, loop := range goLabelLoops {
		share, wrong := goLabelShare(samples[first:], loop.function, loop.labels, loop.keep)
		result(i, share)
		if wrong != "" {
			t.Errorf("%s: %s", loop.function, wrong)
		}
		if share < 0.95 {
			t.Errorf("%s: %.1f%% of its samples carry %d of its labels %v, want >= 95%%",
				loop.function, 100*share, loop.keep, loop.labels)
		}
	}
}

// goLabelShare is the share of the samples in function that carry keep of
// the labels want and no others, and a description of the first that
// carries other labels, if one does.
func goLabelShare(samples []sample, function string, want map[string]string, keep int) (float64, string) {
	var in, right int
	var wrong string
	for _, smp := range samples {
		if !slices.Contains(functionNames(smp.trace), function) {
			continue
		}
		in++
		got := labelMap(smp.meta.Labels)
		switch {
		case len(got) == keep && isSubset(got, want):
			right++
		case len(got) > 0 && wrong == "":
			wrong = fmt.Sprintf("a sample carries %v, want %v", got, want)
		}
	}
	if in == 0 {
		return 0, "no samples"
	}
	return float64(right) / float64(in), wrong
}

func isSubset(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func labelMap(l libpf.Labels) map[string]string {
	m := map[string]string{}
	for k, v := range l.All() {
		m[k] = v
	}
	return m
}

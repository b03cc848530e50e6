package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// TestDaemonLocalOutput runs the daemon itself, built for the architecture
// the tests run on, with its local output (pprof files): it must pass its
// kernel check and start on this kernel, write the frame-pointer
// workload's chain and exit cleanly on SIGTERM. The kernel matrix runs it
// on every kernel, so the daemon, not only its packages, is tested there.
func TestDaemonLocalOutput(t *testing.T) {
	requireRoot(t)
	daemon := buildDaemon(t)
	// The daemon's own start-up delays the workload's unwind tables by
	// seconds under emulation: frame pointers carry it meanwhile.
	bin := buildWorkload(t, "fpchain", framePointers...)
	skipIfPreparing(t)

	out := t.TempDir()
	d := testenv.StartDaemon(t, nil, daemon, "-output-dir="+out, "-reporter-interval=1s",
		"-samples-per-second="+strconv.Itoa(testHz))
	// Loading the programs takes seconds under emulation.
	d.WaitForLog(t, "Sampling ", time.Minute)
	pid, cpu := runWorkload(t, bin, 3*time.Second)
	// On SIGTERM the daemon drains the ring buffer and writes the last
	// interval.
	d.Stop(t, time.Minute)

	samples, chains, misses := pprofSamplesOf(t, out, pid, []string{"cf_leaf", "cf_mid", "cf_top", "main"})
	logTopStacks(t, misses, 5)
	expected := cpu.Seconds() * testHz
	t.Logf("%d samples of the workload in the pprof files (%.0f expected from its CPU time), %d through cf_leaf → main",
		samples, expected, chains)
	if float64(samples) < 0.8*expected || float64(chains) < 0.9*float64(samples) {
		t.Errorf("%d samples, %d with the chain; want >= 80%% of %.0f, >= 90%% of them with it",
			samples, chains, expected)
	}
}

// buildDaemon builds cmd/ebpf-profiler for the architecture the tests run
// on, or takes the one make integration-test built.
func buildDaemon(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EBPF_PROFILER_TEST_BIN"); bin != "" && !preparing() && !inVM() {
		return bin
	}
	goarch := targetToolchain(t).goarch
	bin, build := workloadPath(t, "ebpf-profiler", "daemon", goarch)
	if build {
		run(t, filepath.Join(workloadDir(""), "..", ".."), []string{"CGO_ENABLED=0", "GOARCH=" + goarch},
			"go", "build", "-trimpath", "-o", bin, "./cmd/ebpf-profiler")
	}
	return bin
}

// readPprofFiles parses the pprof files the daemon wrote to dir.
func readPprofFiles(t *testing.T, dir string) []*profile.Profile {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "profile-*.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*profile.Profile
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, p)
	}
	return out
}

// pprofSamplesOf counts the samples of process pid in the pprof files in
// dir, and those whose stack holds chain (leaf first); misses counts the
// others by stack.
func pprofSamplesOf(t *testing.T, dir string, pid int, chain []string) (samples, chains int64, misses map[string]int) {
	t.Helper()
	misses = map[string]int{}
	profiles := readPprofFiles(t, dir)
	if len(profiles) == 0 {
		t.Fatalf("no pprof files in %s", dir)
	}
	for _, p := range profiles {
		for _, s := range p.Sample {
			if pids := s.NumLabel["pid"]; len(pids) != 1 || pids[0] != int64(pid) {
				continue
			}
			var names []string
			for _, loc := range s.Location {
				for _, line := range loc.Line {
					names = append(names, line.Function.Name)
				}
			}
			samples += s.Value[0]
			if hasChain(names, chain) {
				chains += s.Value[0]
			} else {
				misses[strings.Join(names, ";")] += int(s.Value[0])
			}
		}
	}
	return samples, chains, misses
}

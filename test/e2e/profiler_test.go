package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

const (
	envProfilerBin = "EBPF_PROFILER_TEST_BIN"
	profilerPkg    = "./cmd/ebpf-profiler"

	workloadDuration     = 6 * time.Second
	profilerDrainWait    = 1500 * time.Millisecond // > one reporter interval
	profilerStopTimeout  = 30 * time.Second
	profilerBuildTimeout = 10 * time.Minute
)

// profilerBinary returns $EBPF_PROFILER_TEST_BIN, or builds ./cmd/ebpf-profiler
// into a temp dir. It skips the test while that package does not exist yet.
func profilerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envProfilerBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", envProfilerBin, err)
		}
		return p
	}
	root := repoRoot(t)
	if m, _ := filepath.Glob(filepath.Join(root, profilerPkg, "*.go")); len(m) == 0 {
		t.Skipf("profiler daemon not available: %s has no Go files and %s is unset", profilerPkg, envProfilerBin)
	}
	out := filepath.Join(t.TempDir(), "ebpf-profiler")
	ctx, cancel := context.WithTimeout(context.Background(), profilerBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, profilerPkg)
	cmd.Dir = root
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", profilerPkg, err, b)
	}
	t.Logf("built %s in %s", profilerPkg, time.Since(start).Round(100*time.Millisecond))
	return out
}

// exportedTotals is the sum over the daemon's `msg="exported profiles"` log lines.
type exportedTotals struct {
	Lines, Samples, Profiles int64
}

var (
	exportedMsg   = regexp.MustCompile(`(^|\s)msg="?exported profiles"?(\s|$)`)
	samplesField  = regexp.MustCompile(`(^|\s)samples="?(\d+)"?(\s|$)`)
	profilesField = regexp.MustCompile(`(^|\s)profiles="?(\d+)"?(\s|$)`)
)

// parseExportLog sums samples= and profiles= over the daemon's (logrus text
// format) "exported profiles" lines, e.g.
//
//	time="2026-01-02T03:04:05Z" level=info msg="exported profiles" profiles=3 samples=120
func parseExportLog(path string) (exportedTotals, error) {
	f, err := os.Open(path)
	if err != nil {
		return exportedTotals{}, err
	}
	defer f.Close()
	var tot exportedTotals
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !exportedMsg.MatchString(line) {
			continue
		}
		s := samplesField.FindStringSubmatch(line)
		p := profilesField.FindStringSubmatch(line)
		if s == nil || p == nil {
			return tot, fmt.Errorf("export line without samples=/profiles=: %q", line)
		}
		ns, _ := strconv.ParseInt(s[2], 10, 64)
		np, _ := strconv.ParseInt(p[2], 10, 64)
		tot.Lines++
		tot.Samples += ns
		tot.Profiles += np
	}
	return tot, sc.Err()
}

// startWorkload builds utils/workloads/fpchain.c with frame pointers and
// runs it for d: a process whose hot chain the exported stacks must show.
func startWorkload(t *testing.T, d time.Duration) *exec.Cmd {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fpchain")
	src := filepath.Join(repoRoot(t), "utils", "workloads", "fpchain.c")
	if out, err := exec.Command("gcc", "-O0", "-fno-omit-frame-pointer", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("building the workload: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting workload: %v", err)
	}
	return cmd
}

// startDaemon starts the daemon with args and waits until it samples (it
// loads its programs and sets up the busy processes first); the test fails
// if it exits meanwhile.
func startDaemon(t *testing.T, args ...string) *testenv.Daemon {
	t.Helper()
	return startDaemonVia(t, nil, profilerBinary(t), args...)
}

// startDaemonVia is startDaemon with bin started through a wrapper command
// (e.g. setpriv with its options), if any.
func startDaemonVia(t *testing.T, wrapper []string, bin string, args ...string) *testenv.Daemon {
	t.Helper()
	d := testenv.StartDaemon(t, wrapper, bin, args...)
	d.WaitForLog(t, "Sampling ", time.Minute)
	return d
}

// TestProfilerExportsToCollector runs the daemon against the real collector
// and checks that every sample the daemon reports as exported arrives.
func TestProfilerExportsToCollector(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	c := startCollector(t)
	out := filepath.Join(t.TempDir(), "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t,
		"-collection-agent="+c.Addr,
		"-disable-tls",
		"-reporter-interval=1s",
		"-samples-per-second=100",
		"-output-dir="+out,
	)

	pid, pds := exportWorkload(t, c, d, workloadDuration)
	checkExportedContent(t, pds, pid)
}

// exportWorkload runs the frame-pointer workload for d while the daemon
// exports to c, stops both, and checks that the collector received exactly
// the samples the daemon says it exported, and some. It returns the
// workload's pid and what the collector received.
func exportWorkload(t *testing.T, c *collector.Collector, dmn *testenv.Daemon, d time.Duration) (int, []*profilespb.ProfilesData) {
	t.Helper()
	workload := startWorkload(t, d)
	if err := workload.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	time.Sleep(profilerDrainWait)
	dmn.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	exported, err := parseExportLog(dmn.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	pds, err := collector.ReadOutput(c.OutPath, false)
	if err != nil {
		t.Fatal(err)
	}
	got := statsOf(pds)
	t.Logf("daemon reported: %d export lines, samples=%d profiles=%d", exported.Lines, exported.Samples, exported.Profiles)
	t.Logf("collector received: %s", got)
	if got.Profiles < 1 || exported.Samples <= 0 {
		t.Errorf("collector received %d profiles and the daemon exported %d samples, want some", got.Profiles, exported.Samples)
	}
	if got.Samples != exported.Samples {
		t.Errorf("collector received %d samples, daemon reported %d exported (must match exactly)", got.Samples, exported.Samples)
	}
	return workload.Process.Pid, pds
}

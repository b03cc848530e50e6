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
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	envProfilerBin = "EBPF_PROFILER_BIN"
	profilerPkg    = "./cmd/ebpf-profiler"

	profilerStartGrace   = 2 * time.Second // let the daemon load its eBPF programs
	workloadDuration     = 6 * time.Second
	profilerDrainWait    = 1500 * time.Millisecond // > one reporter interval
	profilerStopTimeout  = 30 * time.Second
	profilerBuildTimeout = 10 * time.Minute
)

// profilerBinary returns $EBPF_PROFILER_BIN, or builds ./cmd/ebpf-profiler
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

// TestProfilerExportsToCollector runs the daemon against the real collector
// and checks that every sample the daemon reports as exported arrives.
func TestProfilerExportsToCollector(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	bin := profilerBinary(t)
	c := startCollector(t)

	dir := t.TempDir()
	logPath := filepath.Join(dir, "ebpf-profiler.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	args := []string{
		"-collection-agent=" + c.Addr,
		"-disable-tls",
		"-reporter-interval=1s",
		"-samples-per-second=100",
		"-output-dir=" + filepath.Join(dir, "out"),
	}
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(bin, args...)
	daemon.Stdout, daemon.Stderr = logFile, logFile
	daemon.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Logf("starting %s %s", bin, strings.Join(args, " "))
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	daemonDone := false
	t.Cleanup(func() {
		if !daemonDone {
			_ = daemon.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", tailFile(logPath, 60))
		}
	})

	select {
	case err := <-exited:
		daemonDone = true
		t.Fatalf("daemon exited during startup: %v", err)
	case <-time.After(profilerStartGrace):
	}

	workload := startWorkload(t, workloadDuration)
	if err := workload.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	time.Sleep(profilerDrainWait)

	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM daemon: %v", err)
	}
	select {
	case err := <-exited:
		daemonDone = true
		if code := exitCode(err); code != 0 {
			t.Errorf("daemon exit after SIGTERM: %v (code %d), want 0", err, code)
		}
	case <-time.After(profilerStopTimeout):
		t.Fatalf("daemon did not exit within %s of SIGTERM", profilerStopTimeout)
	}

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	exported, err := parseExportLog(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pds, err := readFileExporterOutput(c.OutPath, false)
	if err != nil {
		t.Fatal(err)
	}
	got := statsOf(pds)
	t.Logf("daemon reported: %d export lines, samples=%d profiles=%d", exported.Lines, exported.Samples, exported.Profiles)
	t.Logf("collector received: %s", got)

	if got.Profiles < 1 {
		t.Errorf("collector received %d profiles, want >= 1", got.Profiles)
	}
	if exported.Samples <= 0 {
		t.Errorf("daemon reported %d exported samples, want > 0", exported.Samples)
	}
	if got.Samples != exported.Samples {
		t.Errorf("collector received %d samples, daemon reported %d exported (must match exactly)", got.Samples, exported.Samples)
	}
	checkExportedContent(t, pds, workload.Process.Pid)
}

package testenv

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Daemon is a profiler daemon a test runs, its output in a log file. It is
// killed when the test ends unless Stop saw it exit, and when the test
// binary dies (a go test timeout).
type Daemon struct {
	Cmd     *exec.Cmd
	LogPath string
	exited  chan error
	done    bool
}

// StartDaemon starts bin with args, through wrapper (a command and its
// options, such as setpriv's) if not empty. Unless args name them, the
// daemon's on-disk caches are new and empty, as on a fresh machine: a
// cache that earlier runs warmed would hide a slow cold start.
func StartDaemon(t testing.TB, wrapper []string, bin string, args ...string) *Daemon {
	t.Helper()
	args = withEmptyCaches(t, args)
	d := &Daemon{LogPath: filepath.Join(t.TempDir(), "ebpf-profiler.log"), exited: make(chan error, 1)}
	logFile, err := os.Create(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	argv := append(append(slices.Clone(wrapper), bin), args...)
	d.Cmd = exec.Command(argv[0], argv[1:]...)
	d.Cmd.Stdout, d.Cmd.Stderr = logFile, logFile
	d.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t.Logf("starting %s %s", bin, strings.Join(args, " "))
	if err := d.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.Cmd.Wait() }()
	t.Cleanup(func() {
		if !d.done {
			_ = d.Cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("daemon log (tail):\n%s", TailFile(d.LogPath, 60))
		}
	})
	return d
}

// cacheFlags are the daemon's flags naming its on-disk caches.
var cacheFlags = []string{"delta-cache", "debuginfo-inflate-dir"}

// withEmptyCaches adds a new empty directory for each cache flag args do
// not set.
func withEmptyCaches(t testing.TB, args []string) []string {
	out := slices.Clone(args)
	for _, name := range cacheFlags {
		set := slices.ContainsFunc(args, func(a string) bool {
			a = strings.TrimLeft(a, "-")
			return a == name || strings.HasPrefix(a, name+"=")
		})
		if !set {
			out = append(out, "-"+name+"="+t.TempDir())
		}
	}
	return out
}

// Alive waits for d, failing the test if the daemon exits meanwhile.
func (d *Daemon) Alive(t testing.TB, wait time.Duration) {
	t.Helper()
	select {
	case err := <-d.exited:
		d.done = true
		t.Fatalf("daemon exited: %v", err)
	case <-time.After(wait):
	}
}

// WaitForLog waits until the daemon's log contains s.
func (d *Daemon) WaitForLog(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; {
		if b, _ := os.ReadFile(d.LogPath); strings.Contains(string(b), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not log %q within %v", s, timeout)
		}
		d.Alive(t, 100*time.Millisecond)
	}
}

// Stop sends SIGTERM and checks that the daemon exits with 0 within
// timeout.
func (d *Daemon) Stop(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := d.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM daemon: %v", err)
	}
	select {
	case err := <-d.exited:
		d.done = true
		if code := ExitCode(err); code != 0 {
			t.Errorf("daemon exit after SIGTERM: %v (code %d), want 0", err, code)
		}
	case <-time.After(timeout):
		t.Fatalf("daemon did not exit within %s of SIGTERM", timeout)
	}
}

// ExitCode is a finished command's exit code: 0 without error, -1 for an
// error that is not an exit status.
func ExitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TailFile returns the last n lines of a file (for failure diagnostics),
// holding at most 4n lines of it in memory.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = lines[len(lines)-n:]
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

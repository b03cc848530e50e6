// Package webdriver is a small client of the W3C WebDriver protocol for the
// project's browser tests. Start runs Debian's chromedriver on a loopback
// port and has it launch headless Chromium; the Browser then speaks
// WebDriver's JSON over HTTP to chromedriver: navigate, find elements, click
// and type, run scripts, pointer actions at viewport coordinates (to click,
// hover and drag on a <canvas>), screenshots and the browser's console log.
//
// It needs the Debian packages chromium and chromium-driver (make test-deps
// installs them). Every command is bounded by a timeout, so that a hung
// browser fails a test instead of hanging it.
package webdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of Options.
const (
	DefaultDriverPath     = "/usr/bin/chromedriver"
	DefaultBrowserPath    = "/usr/bin/chromium"
	DefaultWidth          = 1400
	DefaultHeight         = 1000
	DefaultStartTimeout   = 60 * time.Second
	DefaultCommandTimeout = 30 * time.Second
)

// Options says which chromedriver and Chromium to run and how.
type Options struct {
	// DriverPath is chromedriver's path (default /usr/bin/chromedriver).
	DriverPath string
	// BrowserPath is Chromium's path (default /usr/bin/chromium).
	BrowserPath string
	// Width and Height are the viewport's size in CSS pixels (default
	// 1400x1000), which is the screenshots' size too: the device scale
	// factor is forced to 1.
	Width, Height int
	// Args are more Chromium flags, after the ones Start passes.
	Args []string
	// DriverArgs are more chromedriver flags, e.g. "--verbose" (with Log
	// set, to see its log).
	DriverArgs []string
	// StartTimeout bounds Start: chromedriver becoming ready and the
	// session (Chromium's launch) being created (default 60 s).
	StartTimeout time.Duration
	// CommandTimeout bounds page loads and scripts in the browser; one HTTP
	// request to chromedriver may take up to 10 s more (as much more when
	// shorter), so that the browser's own timeout error comes back first
	// (default 30 s).
	CommandTimeout time.Duration
	// Log, if set, receives the output of chromedriver and Chromium. The
	// last 64 KiB of it are kept either way, for the errors of Start and
	// of commands that find chromedriver dead.
	Log io.Writer
}

func (o Options) withDefaults() Options {
	if o.DriverPath == "" {
		o.DriverPath = DefaultDriverPath
	}
	if o.BrowserPath == "" {
		o.BrowserPath = DefaultBrowserPath
	}
	if o.Width <= 0 {
		o.Width = DefaultWidth
	}
	if o.Height <= 0 {
		o.Height = DefaultHeight
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = DefaultCommandTimeout
	}
	return o
}

// requestSlack is how much longer one HTTP request may take than the
// browser's own page-load and script timeouts.
const requestSlack = 10 * time.Second

// Browser is one WebDriver session of a headless Chromium driven through
// its own chromedriver. Its methods may be called from several goroutines:
// the commands are sent one at a time.
type Browser struct {
	opts    Options
	base    string // chromedriver's URL, http://127.0.0.1:port
	session string // WebDriver session id
	client  *http.Client
	mu      sync.Mutex // one command at a time

	driver  *exec.Cmd
	exited  chan struct{} // closed when chromedriver has exited
	exitErr error         // chromedriver's exit, valid once exited is closed
	output  *tail         // chromedriver's and Chromium's output
	profile string        // Chromium's user data directory, removed by Close

	watchdog     *exec.Cmd // kills the process group if this process dies
	watchdogPipe *os.File  // its standard input's only writer

	closeOnce sync.Once
	closed    chan struct{} // closed by Close
}

// Start runs chromedriver on a free loopback port, waits until it is ready
// and creates a session, which launches headless Chromium. The caller must
// Close the Browser.
func Start(ctx context.Context, opts Options) (*Browser, error) {
	opts = opts.withDefaults()
	if err := checkExecutable(opts.DriverPath, "chromedriver", "chromium-driver"); err != nil {
		return nil, err
	}
	if err := checkExecutable(opts.BrowserPath, "chromium", "chromium"); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	// The free port is only free when it is picked: another process may
	// take it before chromedriver binds it, which then exits at once. Such
	// a start is tried again on another port.
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var b *Browser
		var early bool
		b, early, err = startDriver(ctx, opts)
		if err == nil {
			if err = b.newSession(ctx); err == nil {
				return b, nil
			}
			b.Close()
			return nil, fmt.Errorf("%w%s", err, b.output.quote())
		}
		if !early || ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// checkExecutable tells, naming the Debian package, when path is not an
// executable file.
func checkExecutable(path, what, pkg string) error {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("webdriver: %s not found at %s: install the Debian package %s (make test-deps)", what, path, pkg)
	}
	if err != nil {
		return fmt.Errorf("webdriver: %s: %w", what, err)
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("webdriver: %s at %s is not an executable file", what, path)
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startDriver runs chromedriver in its own process group and waits until
// its /status says it is ready. early is true when chromedriver exited
// before that, which a port taken in between causes.
func startDriver(ctx context.Context, opts Options) (b *Browser, early bool, err error) {
	port, err := freePort()
	if err != nil {
		return nil, false, fmt.Errorf("webdriver: no free loopback port: %w", err)
	}
	profile, err := os.MkdirTemp("", "webdriver-chromium-")
	if err != nil {
		return nil, false, fmt.Errorf("webdriver: %w", err)
	}
	b = &Browser{
		opts:    opts,
		base:    "http://127.0.0.1:" + strconv.Itoa(port),
		client:  newHTTPClient(),
		exited:  make(chan struct{}),
		closed:  make(chan struct{}),
		output:  &tail{tee: opts.Log},
		profile: profile,
	}
	cmd := exec.Command(opts.DriverPath, append([]string{"--port=" + strconv.Itoa(port)}, opts.DriverArgs...)...)
	cmd.Stdout = b.output
	cmd.Stderr = b.output
	// Its own process group, so that Close kills Chromium's processes with
	// it; and killed if this process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Chromium's processes inherit the output pipe: Wait must not wait for
	// them should one outlive chromedriver.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		os.RemoveAll(profile)
		return nil, false, fmt.Errorf("webdriver: starting %s: %w", opts.DriverPath, err)
	}
	b.driver = cmd
	go func() {
		b.exitErr = cmd.Wait()
		close(b.exited)
	}()
	if err := b.startWatchdog(); err != nil {
		b.Close()
		return nil, false, err
	}

	if err := b.waitReady(ctx); err != nil {
		select {
		case <-b.exited:
			early = true
		default:
		}
		b.Close()
		return nil, early, fmt.Errorf("%w%s", err, b.output.quote())
	}
	return b, false, nil
}

// watchdogScript waits for the end of its standard input, which is the
// end of this process, then kills chromedriver's process group ($1) and
// removes Chromium's profile ($2). It ignores the signals a terminal's ^C
// and the like send to this process's group, which it is in, so as to
// outlive this process. (dash's kill takes no "--".)
const watchdogScript = `trap '' HUP INT QUIT TERM; read -r _; kill -9 -"$1" 2>/dev/null; rm -rf -- "$2"`

// startWatchdog starts a shell that kills chromedriver's process group
// when this process dies without Close: chromedriver dies with it
// (Pdeathsig) but its Chromium would not, nor would any of them get a
// terminal's ^C, in a process group of their own. The shell reads a pipe
// whose only writer is this process, so it reads its end when this
// process exits, however it exits (a test's timeout panic too).
func (b *Browser) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("webdriver: watchdog: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "webdriver-watchdog",
		strconv.Itoa(b.driver.Process.Pid), b.profile)
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("webdriver: watchdog: %w", err)
	}
	b.watchdog, b.watchdogPipe = cmd, w
	return nil
}

// waitReady polls chromedriver's /status until it says ready.
func (b *Browser) waitReady(ctx context.Context) error {
	var last error
	for {
		ready, err := b.status(ctx)
		if ready {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-b.exited:
			return fmt.Errorf("webdriver: chromedriver exited before it was ready (%v)", b.exitErr)
		case <-ctx.Done():
			return fmt.Errorf("webdriver: chromedriver not ready after %v (%v)", b.opts.StartTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// status asks chromedriver whether it takes new sessions.
func (b *Browser) status(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var st struct {
		Ready   bool   `json:"ready"`
		Message string `json:"message"`
	}
	if err := b.do(ctx, http.MethodGet, "/status", nil, &st); err != nil {
		return false, err
	}
	if !st.Ready {
		return false, fmt.Errorf("not ready: %s", st.Message)
	}
	return true, nil
}

// newSession creates the session, which launches Chromium.
func (b *Browser) newSession(ctx context.Context) error {
	args := []string{
		"--headless=new",
		"--no-sandbox", // root has no sandbox
		"--disable-gpu",
		"--disable-dev-shm-usage",
		fmt.Sprintf("--window-size=%d,%d", b.opts.Width, b.opts.Height),
		"--force-device-scale-factor=1",
		"--user-data-dir=" + b.profile,
	}
	// Chromium's crash handlers (chrome_crashpad_handler) leave the process
	// group, but they exit with Chromium. They are not to be turned off
	// with --disable-crashpad-for-testing: Chromium 156's network service
	// then crashes in a loop ("FD ownership violation") and every command
	// times out.
	args = append(args, b.opts.Args...)
	ms := b.opts.CommandTimeout.Milliseconds()
	caps := map[string]any{
		"capabilities": map[string]any{
			"alwaysMatch": map[string]any{
				"goog:chromeOptions": map[string]any{
					"binary": b.opts.BrowserPath,
					"args":   args,
					// Start on about:blank. Debian's Chromium starts on
					// its new tab page, which it loads up to 5 s late,
					// and until then every command waits for that
					// navigation.
					"prefs": map[string]any{"session": map[string]any{
						"restore_on_startup": 4, // the startup URLs
						"startup_urls":       []string{"about:blank"},
					}},
				},
				"goog:loggingPrefs": map[string]string{"browser": "ALL"},
				"timeouts": map[string]int64{
					"implicit": 0,
					"pageLoad": ms,
					"script":   ms,
				},
			},
		},
	}
	var created struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.do(ctx, http.MethodPost, "/session", caps, &created); err != nil {
		return err
	}
	if created.SessionID == "" {
		return errors.New("webdriver: chromedriver created a session without an id")
	}
	b.session = created.SessionID
	return b.fitViewport(ctx)
}

// fitViewport makes the viewport Width x Height: headless Chromium's
// --window-size is the outer size, and it keeps room for a toolbar that it
// does not draw (143 px in Chromium 156), so the window is grown by what the
// viewport lacks. A resize may take a moment to reach the page.
func (b *Browser) fitViewport(ctx context.Context) error {
	var sz struct{ InnerW, InnerH, OuterW, OuterH int }
	measure := func() error {
		raw, err := b.exec(ctx, "return {InnerW: innerWidth, InnerH: innerHeight, OuterW: outerWidth, OuterH: outerHeight}", nil)
		if err == nil {
			err = json.Unmarshal(raw, &sz)
		}
		if err != nil {
			return fmt.Errorf("webdriver: measuring the viewport: %w", err)
		}
		return nil
	}
	if err := measure(); err != nil {
		return err
	}
	fits := func() bool { return sz.InnerW == b.opts.Width && sz.InnerH == b.opts.Height }
	for resize := 0; resize < 3 && !fits(); resize++ {
		rect := map[string]int{
			"width":  b.opts.Width + sz.OuterW - sz.InnerW,
			"height": b.opts.Height + sz.OuterH - sz.InnerH,
		}
		if err := b.commandCtx(ctx, http.MethodPost, "/window/rect", rect, nil); err != nil {
			return fmt.Errorf("webdriver: sizing the window: %w", err)
		}
		for wait := 0; wait < 20; wait++ {
			if err := measure(); err != nil {
				return err
			}
			if fits() || sz.OuterW == rect["width"] && sz.OuterH == rect["height"] {
				break
			}
			time.Sleep(pollInterval)
		}
	}
	if !fits() {
		return fmt.Errorf("webdriver: the viewport is %dx%d in a %dx%d window, not %dx%d",
			sz.InnerW, sz.InnerH, sz.OuterW, sz.OuterH, b.opts.Width, b.opts.Height)
	}
	return nil
}

// Close deletes the session, which quits Chromium, then kills
// chromedriver's process group, which holds whatever of Chromium is left.
// It may be called more than once; the later calls do nothing.
func (b *Browser) Close() error {
	var err error
	b.closeOnce.Do(func() {
		if b.session != "" && b.driverRunning() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = b.do(ctx, http.MethodDelete, "/session/"+b.session, nil, nil)
			cancel()
		}
		close(b.closed)
		if b.driver != nil {
			if kerr := syscall.Kill(-b.driver.Process.Pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) && err == nil {
				err = fmt.Errorf("webdriver: killing chromedriver: %w", kerr)
			}
			if left := waitGroupGone(b.driver.Process.Pid, b.exited, 5*time.Second); left != "" && err == nil {
				err = fmt.Errorf("webdriver: still running 5 s after SIGKILL: %s", left)
			}
		}
		// Killed before its pipe is closed, so that it cannot kill a new
		// process group that took chromedriver's number.
		if b.watchdog != nil {
			b.watchdog.Process.Kill()
			b.watchdog.Wait()
			b.watchdogPipe.Close()
		}
		if b.profile != "" {
			os.RemoveAll(b.profile)
		}
	})
	return err
}

// waitGroupGone waits until chromedriver has been reaped (exited is closed)
// and no live process is left in its process group, and returns, if it
// times out, what is left. Zombies do not count: Chromium's orphans are
// reaped by init, which may take its time.
func waitGroupGone(pgid int, exited <-chan struct{}, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		reaped := false
		select {
		case <-exited:
			reaped = true
		default:
		}
		left := liveInGroup(pgid)
		if !reaped {
			left = append([]string{"chromedriver"}, left...)
		}
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(left, ", ")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveInGroup lists the processes of a process group that are not zombies,
// as "pid (name)", from /proc.
func liveInGroup(pgid int) []string {
	dirs, _ := os.ReadDir("/proc")
	var live []string
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == pgid {
			continue
		}
		stat, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		s := string(stat)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 3 || f[0] == "Z" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		live = append(live, s[:end+1])
	}
	return live
}

func (b *Browser) driverRunning() bool {
	if b.exited == nil {
		return true // no process of ours: a test's fake driver
	}
	select {
	case <-b.exited:
		return false
	default:
		return true
	}
}

// tail keeps the last bytes written to it and copies them to tee.
type tail struct {
	mu  sync.Mutex
	buf []byte
	tee io.Writer
}

const tailSize = 64 << 10

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tee != nil {
		t.tee.Write(p)
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

// quote returns the output for an error message: its last lines, indented,
// or nothing.
func (t *tail) quote() string {
	t.mu.Lock()
	out := bytes.TrimSpace(t.buf)
	t.mu.Unlock()
	if len(out) == 0 {
		return ""
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "\nchromedriver's output (last lines):\n\t" + strings.Join(lines, "\n\t")
}

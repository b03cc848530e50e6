// Package collector runs the OpenTelemetry Collector built by build.sh
// (otelcol-e2e: OTLP receiver, file and debug exporters) and reads what its
// file exporter writes, for the end-to-end tests (test/e2e) and the
// benchmark tool (utils/bench).
package collector

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// EnvBinary names a collector binary to use instead of running build.sh.
	EnvBinary = "OTELCOL_BIN"

	// ProfilesGate is the collector feature gate that enables the profiles
	// signal. At v0.159.0 it is alpha (off by default) and required.
	ProfilesGate = "service.profilesSupport"

	startTimeout  = 30 * time.Second
	stopTimeout   = 20 * time.Second
	buildTimeout  = 15 * time.Minute
	startAttempts = 3
)

var build struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the collector to run: $OTELCOL_BIN, or the binary produced
// (or found in the cache) by <repoRoot>/utils/collector/build.sh, which runs
// at most once per process.
func Binary(repoRoot string) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", EnvBinary, err)
		}
		return p, nil
	}
	build.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, "utils/collector/build.sh"))
		cmd.Dir = repoRoot
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			build.err = fmt.Errorf("utils/collector/build.sh: %w\nstderr:\n%s", err, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		build.path = strings.TrimSpace(lines[len(lines)-1])
	})
	return build.path, build.err
}

type gateArgs struct {
	args []string
	note string
}

var gateArgsCache sync.Map // binary path -> gateArgs

// GateArgs returns the command line flags that enable profiles in the given
// collector, and a note on the gate's status. It asks the binary for its
// feature gates (once per binary), so that a later collector in which the
// gate went stable (always on) or was removed still works.
func GateArgs(bin string) (args []string, note string, err error) {
	if v, ok := gateArgsCache.Load(bin); ok {
		g := v.(gateArgs)
		return g.args, g.note, nil
	}
	out, err := exec.Command(bin, "featuregate").CombinedOutput()
	if err != nil {
		return nil, "", fmt.Errorf("%s featuregate: %w\n%s", bin, err, out)
	}
	args, note = gateArgsFromListing(string(out))
	gateArgsCache.Store(bin, gateArgs{args, note})
	return args, note, nil
}

// gateArgsFromListing parses the table printed by `otelcol featuregate`:
//
//	ID                       Enabled  Stage  Description
//	service.profilesSupport  false    Alpha  Controls whether ...
func gateArgsFromListing(listing string) (args []string, note string) {
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != ProfilesGate {
			continue
		}
		switch stage := strings.ToLower(f[2]); stage {
		case "stable":
			return nil, "stable (always enabled), flag not needed"
		case "deprecated":
			return nil, "deprecated (behaviour is final), flag not passed"
		default:
			if f[1] == "true" {
				return nil, stage + ", already enabled by default"
			}
			return []string{"--feature-gates=+" + ProfilesGate}, stage + ", enabling with --feature-gates=+" + ProfilesGate
		}
	}
	return nil, "not registered in this collector (gate removed: profiles need no flag)"
}

// TLS are the PEM files of a collector's TLS listener; with ClientCAFile it
// requires client certificates signed by that CA.
type TLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// Collector is a running collector process.
type Collector struct {
	Addr    string // host:port of the OTLP gRPC receiver
	OutPath string // file exporter output (JSON lines)
	LogPath string // collector stdout+stderr

	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	stopped bool
	// how it was started, for Restart
	bin, dir, verbosity string
	gate                []string
	tls                 *TLS
	starts              int
}

// Start starts bin (with the gate flags from GateArgs) on a free loopback
// port, with its config, output and log in dir, and waits until the OTLP
// receiver accepts connections. It tries another port when the one it
// picked was taken meanwhile. tls, if not nil, makes the receiver a TLS
// listener; debugVerbosity is the debug exporter's (basic when empty). The
// collector gets SIGKILL when this process dies; Stop ends it.
func Start(bin string, gate []string, dir string, tls *TLS, debugVerbosity string) (*Collector, error) {
	if debugVerbosity == "" {
		debugVerbosity = "basic"
	}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		var c *Collector
		if c, err = tryStart(bin, gate, dir, attempt, tls, debugVerbosity); err == nil {
			return c, nil
		}
		if c == nil {
			return nil, err
		}
		log, _ := os.ReadFile(c.LogPath)
		err = fmt.Errorf("%w\ncollector log %s (tail):\n%s", err, c.LogPath, lastLines(string(log), 40))
		if !bytes.Contains(log, []byte("address already in use")) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("port taken %d times: %w", startAttempts, err)
}

// tryStart is one attempt of Start. It returns the collector, for its log,
// with an error that happened once the log file existed.
func tryStart(bin string, gate []string, dir string, attempt int, tls *TLS, debugVerbosity string) (*Collector, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return startAt(bin, gate, dir, fmt.Sprint(attempt), net.JoinHostPort("127.0.0.1", fmt.Sprint(port)), tls, debugVerbosity)
}

// Restart starts a stopped collector again on the same address, with a
// new output file (OutPath; Outputs lists them all), as a redeployed
// collector would come back.
func (c *Collector) Restart() error {
	if !c.stopped {
		return fmt.Errorf("collector on %s is running", c.Addr)
	}
	c.starts++
	n, err := startAt(c.bin, c.gate, c.dir, fmt.Sprintf("restart%d", c.starts), c.Addr, c.tls, c.verbosity)
	if n != nil {
		starts := c.starts
		*c = *n
		c.starts = starts
	}
	return err
}

// startAt starts bin listening on addr, its files named with suffix.
func startAt(bin string, gate []string, dir, suffix, addr string, tls *TLS, debugVerbosity string) (*Collector, error) {
	c := &Collector{
		Addr:    addr,
		OutPath: filepath.Join(dir, fmt.Sprintf("profiles-%s.jsonl", suffix)),
		LogPath: filepath.Join(dir, fmt.Sprintf("collector-%s.log", suffix)),
		done:    make(chan struct{}),
		bin:     bin, gate: gate, dir: dir, tls: tls, verbosity: debugVerbosity,
	}
	cfgPath := filepath.Join(dir, fmt.Sprintf("config-%s.yaml", suffix))
	if err := os.WriteFile(cfgPath, []byte(Config(c.Addr, c.OutPath, debugVerbosity, tls)), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(c.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child keeps its own descriptor

	c.cmd = exec.Command(bin, append([]string{"--config=" + cfgPath}, gate...)...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return c, err
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.done)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-c.done:
			c.stopped = true
			return c, fmt.Errorf("collector exited during startup: %v", c.waitErr)
		default:
		}
		conn, err := net.DialTimeout("tcp", c.Addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return c, nil
		}
		if time.Now().After(deadline) {
			_ = c.Stop()
			return c, fmt.Errorf("collector not listening on %s after %s", c.Addr, startTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop sends SIGTERM and waits for a clean exit (the file exporter flushes
// on shutdown); it kills the collector if it does not exit in time. Calling
// it more than once is fine.
func (c *Collector) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(stopTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("collector did not exit within %s of SIGTERM, killed", stopTimeout)
	}
	if c.waitErr != nil {
		return fmt.Errorf("collector exit: %w", c.waitErr)
	}
	return nil
}

// Config renders a profiles-only pipeline: OTLP/gRPC in on addr (over TLS
// with tls), file exporter (JSON lines to outPath) and debug exporter out.
// Internal telemetry metrics are off so that no fixed port (8888) is bound.
func Config(addr, outPath, debugVerbosity string, tls *TLS) string {
	tlsYAML := ""
	if tls != nil {
		tlsYAML = fmt.Sprintf("\n        tls:\n          cert_file: %q\n          key_file: %q", tls.CertFile, tls.KeyFile)
		if tls.ClientCAFile != "" {
			tlsYAML += fmt.Sprintf("\n          client_ca_file: %q", tls.ClientCAFile)
		}
	}
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %q%s
exporters:
  file:
    path: %q
    format: json
    flush_interval: 100ms
  debug:
    verbosity: %s
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file, debug]
`, addr, tlsYAML, outPath, debugVerbosity)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

package e2e

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
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

const (
	envCollectorBin   = "OTELCOL_BIN"
	envCollectorDebug = "OTELCOL_E2E_DEBUG"

	// profilesGate is the collector feature gate that enables the profiles
	// signal. At v0.159.0 it is alpha (off by default) and required.
	profilesGate = "service.profilesSupport"

	collectorStartTimeout = 30 * time.Second
	collectorStopTimeout  = 20 * time.Second
	collectorBuildTimeout = 15 * time.Minute
)

var collectorBuild struct {
	once sync.Once
	path string
	err  error
}

// collectorBinary returns the collector to run: $OTELCOL_BIN, or the binary
// produced (or found in the cache) by utils/collector/build.sh.
func collectorBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envCollectorBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", envCollectorBin, err)
		}
		return p
	}
	root := repoRoot(t)
	collectorBuild.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), collectorBuildTimeout)
		defer cancel()
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "utils/collector/build.sh"))
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			collectorBuild.err = fmt.Errorf("utils/collector/build.sh: %w\nstderr:\n%s", err, stderr.String())
			return
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		collectorBuild.path = strings.TrimSpace(lines[len(lines)-1])
		t.Logf("collector binary %s (build.sh took %s)", collectorBuild.path, time.Since(start).Round(time.Second))
	})
	if collectorBuild.err != nil {
		t.Fatal(collectorBuild.err)
	}
	return collectorBuild.path
}

var gateArgsCache sync.Map // binary path -> []string

// profilesGateArgs returns the command line flags that enable profiles in the
// given collector. It asks the binary for its feature gates, so that a later
// collector in which the gate went stable (always on) or was removed still
// works.
func profilesGateArgs(t *testing.T, bin string) []string {
	t.Helper()
	if v, ok := gateArgsCache.Load(bin); ok {
		return v.([]string)
	}
	out, err := exec.Command(bin, "featuregate").CombinedOutput()
	if err != nil {
		t.Fatalf("%s featuregate: %v\n%s", bin, err, out)
	}
	args, note := gateArgsFromListing(string(out))
	t.Logf("collector feature gate %s: %s", profilesGate, note)
	gateArgsCache.Store(bin, args)
	return args
}

// gateArgsFromListing parses the table printed by `otelcol featuregate`:
//
//	ID                       Enabled  Stage  Description
//	service.profilesSupport  false    Alpha  Controls whether ...
func gateArgsFromListing(listing string) (args []string, note string) {
	for _, line := range strings.Split(listing, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != profilesGate {
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
			return []string{"--feature-gates=+" + profilesGate}, stage + ", enabling with --feature-gates=+" + profilesGate
		}
	}
	return nil, "not registered in this collector (gate removed: profiles need no flag)"
}

// collector is a running otelcol-e2e process.
type collector struct {
	Addr    string // host:port of the OTLP gRPC receiver
	OutPath string // file exporter output (JSON lines)
	LogPath string // collector stdout+stderr

	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	stopped bool
}

// startCollector starts the collector on a free loopback port with a config
// in a temp dir and waits until the OTLP receiver accepts connections. The
// collector is stopped when the test ends.
func startCollector(t *testing.T) *collector {
	t.Helper()
	return startCollectorTLS(t, nil)
}

// collectorTLS are the PEM files of a collector's TLS listener; with
// ClientCAFile it requires client certificates signed by that CA.
type collectorTLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// startCollectorTLS is startCollector with a TLS listener when tc is not
// nil.
func startCollectorTLS(t *testing.T, tc *collectorTLS) *collector {
	t.Helper()
	bin := collectorBinary(t)
	gate := profilesGateArgs(t, bin)
	dir := t.TempDir()
	var lastLog string
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := tryStartCollector(t, bin, gate, dir, attempt, tc)
		if err == nil {
			t.Cleanup(func() {
				if err := c.Stop(); err != nil {
					t.Errorf("stopping collector: %v", err)
				}
				if t.Failed() {
					t.Logf("collector log (tail):\n%s", testenv.TailFile(c.LogPath, 60))
				}
			})
			return c
		}
		lastLog = testenv.TailFile(c.LogPath, 40)
		if !strings.Contains(lastLog, "address already in use") {
			t.Fatalf("starting collector: %v\ncollector log (tail):\n%s", err, lastLog)
		}
		t.Logf("collector port was taken, retrying (attempt %d)", attempt)
	}
	t.Fatalf("could not start collector:\n%s", lastLog)
	return nil
}

func tryStartCollector(t *testing.T, bin string, gate []string, dir string, attempt int, tc *collectorTLS) (*collector, error) {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{
		Addr:    net.JoinHostPort("127.0.0.1", fmt.Sprint(port)),
		OutPath: filepath.Join(dir, fmt.Sprintf("profiles-%d.jsonl", attempt)),
		LogPath: filepath.Join(dir, fmt.Sprintf("collector-%d.log", attempt)),
		done:    make(chan struct{}),
	}
	verbosity := os.Getenv(envCollectorDebug)
	if verbosity == "" {
		verbosity = "basic"
	}
	cfgPath := filepath.Join(dir, fmt.Sprintf("config-%d.yaml", attempt))
	if err := os.WriteFile(cfgPath, []byte(collectorConfig(c.Addr, c.OutPath, verbosity, tc)), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(c.LogPath)
	if err != nil {
		t.Fatal(err)
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

	deadline := time.Now().Add(collectorStartTimeout)
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
			return c, fmt.Errorf("collector not listening on %s after %s", c.Addr, collectorStartTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop sends SIGTERM and waits for a clean exit (the file exporter flushes
// on shutdown); it kills the collector if it does not exit in time. Calling
// it more than once is fine.
func (c *collector) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(collectorStopTimeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("collector did not exit within %s of SIGTERM, killed", collectorStopTimeout)
	}
	if c.waitErr != nil {
		return fmt.Errorf("collector exit: %w", c.waitErr)
	}
	return nil
}

// collectorConfig renders a profiles-only pipeline: OTLP/gRPC in (over
// TLS with tc), file exporter (JSON lines) and debug exporter out. Internal
// telemetry metrics are off so that no fixed port (8888) is bound.
func collectorConfig(addr, outPath, debugVerbosity string, tc *collectorTLS) string {
	tlsYAML := ""
	if tc != nil {
		tlsYAML = fmt.Sprintf("\n        tls:\n          cert_file: %q\n          key_file: %q", tc.CertFile, tc.KeyFile)
		if tc.ClientCAFile != "" {
			tlsYAML += fmt.Sprintf("\n          client_ca_file: %q", tc.ClientCAFile)
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

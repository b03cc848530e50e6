package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/collector"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

const envCollectorDebug = "OTELCOL_E2E_DEBUG"

// collectorBinary returns the collector to run: $OTELCOL_BIN, or the binary
// produced (or found in the cache) by utils/collector/build.sh.
func collectorBinary(t *testing.T) string {
	t.Helper()
	start := time.Now()
	bin, err := collector.Binary(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collector binary %s (%s)", bin, time.Since(start).Round(time.Second))
	return bin
}

// profilesGateArgs returns the command line flags that enable profiles in the
// given collector (see collector.GateArgs).
func profilesGateArgs(t *testing.T, bin string) []string {
	t.Helper()
	args, note, err := collector.GateArgs(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collector feature gate %s: %s", collector.ProfilesGate, note)
	return args
}

// startCollector starts the collector on a free loopback port with a config
// in a temp dir and waits until the OTLP receiver accepts connections. The
// collector is stopped when the test ends.
func startCollector(t *testing.T) *collector.Collector {
	t.Helper()
	return startCollectorTLS(t, nil)
}

// startCollectorTLS is startCollector with a TLS listener when tc is not
// nil. $OTELCOL_E2E_DEBUG sets the debug exporter's verbosity.
func startCollectorTLS(t *testing.T, tc *collector.TLS) *collector.Collector {
	t.Helper()
	bin := collectorBinary(t)
	c, err := collector.Start(bin, profilesGateArgs(t, bin), t.TempDir(), tc, os.Getenv(envCollectorDebug))
	if err != nil {
		t.Fatalf("starting collector: %v", err)
	}
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

package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		wantErr string
		check   func(*config) bool
	}{
		{name: "local default", check: func(c *config) bool {
			return c.outputDir == defaultOutputDir && c.samplesPerSecond == 20 &&
				c.reporterInterval == 5*time.Second && slices.Equal(c.tracers, slices.Sorted(slices.Values(interpreter.Names()))) &&
				c.mapScaleFactor == 0 && c.probabilisticThreshold == 100 && c.probabilisticInterval == time.Minute &&
				!c.noKernelVersionCheck && c.monitorInterval == time.Minute && len(c.warnings) == 0
		}},
		{name: "environment sets flags",
			env: []string{"PATH=/bin", "EBPF_PROFILER_COLLECTION_AGENT=collector:4317", "EBPF_PROFILER_DISABLE_TLS=true",
				"EBPF_PROFILER_SAMPLES_PER_SECOND=99", "EBPF_PROFILER_PROBABILISTIC_INTERVAL=2m30s",
				"EBPF_PROFILER_NO_KERNEL_VERSION_CHECK=1", "EBPF_PROFILER_TRACERS=native"},
			check: func(c *config) bool {
				return c.collectionAgent == "collector:4317" && c.disableTLS && c.samplesPerSecond == 99 &&
					c.probabilisticInterval == 150*time.Second && c.noKernelVersionCheck && c.outputDir == "" &&
					len(c.warnings) == 0
			}},
		{name: "environment output dir counts as set",
			env:   []string{"EBPF_PROFILER_COLLECTION_AGENT=collector:4317", "EBPF_PROFILER_OUTPUT_DIR=/tmp/p"},
			check: func(c *config) bool { return c.outputDir == "/tmp/p" }},
		{name: "command line wins over environment", args: []string{"-samples-per-second=50"},
			env: []string{"EBPF_PROFILER_SAMPLES_PER_SECOND=7"},
			check: func(c *config) bool {
				return c.samplesPerSecond == 50 && slices.Equal(c.warnings,
					[]string{"Ignoring EBPF_PROFILER_SAMPLES_PER_SECOND: -samples-per-second is on the command line"})
			}},
		{name: "unknown variable warns; test and version variables do not set flags",
			env: []string{"EBPF_PROFILER_SAMPLES_PER_SECNOD=7", "EBPF_PROFILER_TEST_E2E=1", "EBPF_PROFILER_VERSION=1.2",
				"EBPF_PROFILER_V=true", "OTHER_SAMPLES_PER_SECOND=3"},
			check: func(c *config) bool {
				return c.samplesPerSecond == 20 && !c.version && !c.verbose && slices.Equal(c.warnings, []string{
					"Ignoring EBPF_PROFILER_SAMPLES_PER_SECNOD: no flag -samples-per-secnod (see -help)",
					"Ignoring EBPF_PROFILER_VERSION: no flag -version (see -help)",
					"Ignoring EBPF_PROFILER_V: no flag -v (see -help)",
				})
			}},
		{name: "bad environment value names the variable", env: []string{"EBPF_PROFILER_SAMPLES_PER_SECOND=fast"},
			wantErr: `EBPF_PROFILER_SAMPLES_PER_SECOND="fast"`},
		{name: "invalid environment value is validated", env: []string{"EBPF_PROFILER_SAMPLES_PER_SECOND=0"},
			wantErr: "-samples-per-second=0: want 1 to 10000"},
		{name: "probabilistic", args: []string{"-probabilistic-threshold=50", "-probabilistic-interval=2m30s"},
			check: func(c *config) bool {
				return c.probabilisticThreshold == 50 && c.probabilisticInterval == 150*time.Second
			}},
		{name: "probabilistic threshold 0", args: []string{"-probabilistic-threshold=0"},
			wantErr: "-probabilistic-threshold=0: want 1 to 99, or 100"},
		{name: "probabilistic threshold 101", args: []string{"-probabilistic-threshold=101"},
			wantErr: "-probabilistic-threshold=101"},
		{name: "probabilistic interval too short", args: []string{"-probabilistic-interval=100ms"},
			wantErr: "-probabilistic-interval=100ms: want 1s to 24h"},
		{name: "TLS files", args: []string{"-collection-agent=c:4317", "-tls-ca-file=/ca.pem",
			"-tls-cert-file=/c.pem", "-tls-key-file=/k.pem"},
			check: func(c *config) bool {
				return c.tlsCAFile == "/ca.pem" && c.tlsCertFile == "/c.pem" && c.tlsKeyFile == "/k.pem"
			}},
		{name: "TLS files without TLS", args: []string{"-collection-agent=c:4317", "-disable-tls", "-tls-ca-file=/ca.pem"},
			wantErr: "need -collection-agent, with TLS"},
		{name: "TLS files without collector", args: []string{"-tls-ca-file=/ca.pem"},
			wantErr: "need -collection-agent, with TLS"},
		{name: "client certificate without key", args: []string{"-collection-agent=c:4317", "-tls-cert-file=/c.pem"},
			wantErr: "-tls-cert-file and -tls-key-file go together"},
		{name: "web view off by default", check: func(c *config) bool { return c.web.addr == "" }},
		{name: "web view from the environment", env: []string{"EBPF_PROFILER_HTTP=8230", "EBPF_PROFILER_HTTP_HISTORY=30m"},
			check: func(c *config) bool { return c.web.addr == "8230" && c.web.history == 30*time.Minute }},
		{name: "web view address", args: []string{"-http=a:b:c"}, wantErr: "-http: web view address"},
		{name: "web view history", args: []string{"-http=8230", "-http-history=10s"}, wantErr: "-http-history=10s: want 1m to 24h"},
		{name: "web view memory", args: []string{"-http=8230", "-http-history-mb=0"}, wantErr: "-http-history-mb=0"},
		{name: "web view auth without web view", args: []string{"-http-basic-auth-file=/f"}, wantErr: "-http-basic-auth-file needs -http"},
		{name: "web view client CA without HTTPS", args: []string{"-http=8230", "-http-client-ca-file=/ca"},
			wantErr: "-http-client-ca-file needs -http-tls-cert-file"},
		{name: "web view key without certificate", args: []string{"-http=8230", "-http-tls-key-file=/k"},
			wantErr: "-http-tls-cert-file and -http-tls-key-file go together"},
		{name: "largest map scale factor", args: []string{"-map-scale-factor=8"},
			check: func(c *config) bool { return c.mapScaleFactor == 8 }},
		{name: "collector turns off the default output dir",
			args:  []string{"-collection-agent=127.0.0.1:4317", "-disable-tls"},
			check: func(c *config) bool { return c.outputDir == "" && c.disableTLS }},
		{name: "collector with explicit output dir",
			args:  []string{"-collection-agent=collector:4317", "-output-dir=/tmp/x"},
			check: func(c *config) bool { return c.outputDir == "/tmp/x" }},
		{name: "short verbose", args: []string{"-v"}, check: func(c *config) bool { return c.verbose }},
		{name: "unknown flag", args: []string{"-frobnicate"}, wantErr: "not defined"},
		{name: "positional argument", args: []string{"extra"}, wantErr: "unexpected argument"},
		{name: "bad agent", args: []string{"-collection-agent=nohostport"}, wantErr: "not host:port"},
		{name: "agent without host", args: []string{"-collection-agent=:4317"}, wantErr: "has no host"},
		{name: "agent port out of range", args: []string{"-collection-agent=h:99999"}, wantErr: "invalid port"},
		{name: "zero rate", args: []string{"-samples-per-second=0"}, wantErr: "want 1 to 10000"},
		{name: "negative memory limit", args: []string{"-memory-limit-mb=-1"}, wantErr: "-memory-limit-mb=-1: want 0 (none)"},
		{name: "huge rate", args: []string{"-samples-per-second=20000"}, wantErr: "want 1 to 10000"},
		{name: "short interval", args: []string{"-reporter-interval=10ms"}, wantErr: "-reporter-interval=10ms"},
		{name: "bad monitor interval", args: []string{"-monitor-interval=2h"}, wantErr: "-monitor-interval=2h0m0s"},
		{name: "bad duration syntax", args: []string{"-reporter-interval=5"}, wantErr: "invalid value"},
		{name: "unknown tracer", args: []string{"-tracers=native,cobol"}, wantErr: `unknown tracer "cobol"`},
		{name: "runtime off", args: []string{"-tracers=native"}, check: func(c *config) bool {
			return slices.Equal(c.tracers, []string{"native"})
		}},
		{name: "one runtime", args: []string{"-tracers=cpython"}, check: func(c *config) bool {
			return slices.Equal(c.tracers, []string{"cpython", "native"})
		}},
		{name: "bad log level", args: []string{"-bpf-log-level=3"}, wantErr: "want 0, 1 or 2"},
		{name: "map scale factor too large", args: []string{"-map-scale-factor=9"}, wantErr: "-map-scale-factor=9: want 0 to 8"},
		{name: "negative map scale factor", args: []string{"-map-scale-factor=-1"}, wantErr: "invalid value"},
		{name: "nowhere to report", args: []string{"-output-dir="}, wantErr: "nothing to report to"},
		{name: "only the web view", args: []string{"-output-dir=", "-http=8230"}, check: func(c *config) bool { return c.web.addr == "8230" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, tt.env, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected config %+v", *c)
			}
		})
	}
}

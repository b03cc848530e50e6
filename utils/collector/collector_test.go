package collector

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGateArgsFromListing(t *testing.T) {
	for _, tc := range []struct {
		listing string
		want    int
	}{
		{"ID Enabled Stage Description\nservice.profilesSupport false Alpha Controls", 1},
		{"ID Enabled Stage Description\nservice.profilesSupport true Beta Controls", 0},
		{"ID Enabled Stage Description\nservice.profilesSupport true Stable Controls", 0},
		{"ID Enabled Stage Description\nother.gate false Alpha x", 0},
	} {
		if args, note := gateArgsFromListing(tc.listing); len(args) != tc.want {
			t.Errorf("%q: got %v (%s), want %d args", tc.listing, args, note, tc.want)
		}
	}
}

func TestConfigTLS(t *testing.T) {
	cfg := Config("127.0.0.1:4317", "/tmp/out.jsonl", "basic", &TLS{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"})
	for _, want := range []string{`endpoint: "127.0.0.1:4317"`, `cert_file: "c.pem"`, `key_file: "k.pem"`, `client_ca_file: "ca.pem"`, `path: "/tmp/out.jsonl"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s:\n%s", want, cfg)
		}
	}
}

// TestStartFailure runs a stand-in for the collector that exits at once:
// Start retries only when the port was taken, and its error carries the log.
func TestStartFailure(t *testing.T) {
	for _, tc := range []struct {
		log      string
		attempts int
	}{
		{"listen tcp 127.0.0.1:1: bind: address already in use", startAttempts},
		{"invalid configuration", 1},
	} {
		dir := t.TempDir()
		bin := filepath.Join(dir, "otelcol")
		script := fmt.Sprintf("#!/bin/sh\necho %q\nexit 1\n", tc.log)
		if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		c, err := Start(bin, nil, dir, nil, "")
		if err == nil {
			_ = c.Stop()
			t.Fatalf("%q: Start succeeded", tc.log)
		}
		if !strings.Contains(err.Error(), tc.log) {
			t.Errorf("%q: error lacks the log: %v", tc.log, err)
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "collector-*.log"))
		if len(logs) != tc.attempts {
			t.Errorf("%q: %d attempts (%v), want %d", tc.log, len(logs), logs, tc.attempts)
		}
	}
}

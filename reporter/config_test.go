package reporter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	valid := Config{CollectionAgent: "collector:4317", Interval: 5 * time.Second, SamplesPerSecond: 20}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"valid", func(*Config) {}, ""},
		{"summary only", func(c *Config) { c.CollectionAgent, c.TopN = "", 10 }, ""},
		{"ipv6 agent", func(c *Config) { c.CollectionAgent = "[::1]:4317" }, ""},
		{"zero interval", func(c *Config) { c.Interval = 0 }, "interval must be positive"},
		{"zero frequency", func(c *Config) { c.SamplesPerSecond = 0 }, "samples per second"},
		{"negative top-N", func(c *Config) { c.TopN = -1 }, "top-N must not be negative"},
		{"negative queue", func(c *Config) { c.MaxQueuedRequests = -1 }, "max queued requests"},
		{"negative sample cap", func(c *Config) { c.MaxSamplesPerInterval = -1 }, "max samples per interval"},
		{"negative flush timeout", func(c *Config) { c.FlushTimeout = -time.Second }, "flush timeout"},
		{"agent without port", func(c *Config) { c.CollectionAgent = "collector" }, "is not host:port"},
		{"agent without host", func(c *Config) { c.CollectionAgent = ":4317" }, "has no host"},
		{"agent bad port", func(c *Config) { c.CollectionAgent = "collector:otlp" }, "invalid port"},
		{"nothing to do", func(c *Config) { c.CollectionAgent = "" }, "no output configured"},
		{"all errors reported", func(c *Config) { c.Interval, c.SamplesPerSecond = 0, 0 },
			"got 0s\nsamples per second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.mutate(&cfg)
			_, err := New(cfg)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("New = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("New = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := Config{TopN: 1, Interval: time.Second, SamplesPerSecond: 19}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxQueuedRequests != defaultMaxQueuedRequests || cfg.MaxOutputFiles != defaultMaxOutputFiles ||
		cfg.MaxSamplesPerInterval != defaultMaxSamplesPerInterval || cfg.FlushTimeout != defaultFlushTimeout {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if got := cfg.period(); got != 52631578 {
		t.Errorf("period at 19 Hz = %d ns, want 52631578", got)
	}
}

func TestHostMetadata(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	id := write("machine-id", "0123456789abcdef\n")
	empty := write("empty", "\n")
	missing := filepath.Join(dir, "missing")
	tests := []struct {
		name    string
		paths   []string
		wantID  string
		wantErr bool
	}{
		{"first path", []string{id, missing}, "0123456789abcdef", false},
		{"falls back", []string{missing, empty, id}, "0123456789abcdef", false},
		{"none found", []string{missing, empty}, "", true},
	}
	wantName, _ := os.Hostname()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotID, gotName, err := hostMetadata(tt.paths)
			if gotID != tt.wantID || gotName != wantName || (err != nil) != tt.wantErr {
				t.Errorf("hostMetadata = %q, %q, %v; want %q, %q, error %v",
					gotID, gotName, err, tt.wantID, wantName, tt.wantErr)
			}
		})
	}
}

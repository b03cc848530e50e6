package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(*config) bool
	}{
		{name: "local default", check: func(c *config) bool {
			return c.outputDir == defaultOutputDir && c.samplesPerSecond == 20 &&
				c.reporterInterval == 5*time.Second && slices.Equal(c.tracers, []string{"native"}) &&
				c.mapScaleFactor == 0
		}},
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
		{name: "huge rate", args: []string{"-samples-per-second=20000"}, wantErr: "want 1 to 10000"},
		{name: "short interval", args: []string{"-reporter-interval=10ms"}, wantErr: "-reporter-interval=10ms"},
		{name: "bad monitor interval", args: []string{"-monitor-interval=2h"}, wantErr: "-monitor-interval=2h0m0s"},
		{name: "bad duration syntax", args: []string{"-reporter-interval=5"}, wantErr: "invalid value"},
		{name: "unknown tracer", args: []string{"-tracers=native,cobol"}, wantErr: `unknown tracer "cobol"`},
		{name: "bad log level", args: []string{"-bpf-log-level=3"}, wantErr: "want 0, 1 or 2"},
		{name: "map scale factor too large", args: []string{"-map-scale-factor=9"}, wantErr: "-map-scale-factor=9: want 0 to 8"},
		{name: "negative map scale factor", args: []string{"-map-scale-factor=-1"}, wantErr: "invalid value"},
		{name: "nowhere to report", args: []string{"-output-dir="}, wantErr: "nothing to report to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
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

package tracer

import (
	"slices"
	"strings"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"0", []int{0}},
		{"0-3", []int{0, 1, 2, 3}},
		{"0-1,4,6-7", []int{0, 1, 4, 6, 7}},
	}
	for _, tt := range tests {
		got, err := parseCPUList(tt.in)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "1,,2"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

func TestEventBufferBytes(t *testing.T) {
	tests := []struct {
		cpus, hz int
		want     uint32
	}{
		{2, 20, minEventBufferBytes},
		{2, 1000, 1 << 20},
		{64, 1000, 32 << 20},
		{1024, 10000, maxEventBufferBytes},
	}
	for _, tt := range tests {
		if got := eventBufferBytes(tt.cpus, tt.hz); got != tt.want {
			t.Errorf("eventBufferBytes(%d, %d) = %d, want %d", tt.cpus, tt.hz, got, tt.want)
		}
	}
}

func TestCheckKernelVersion(t *testing.T) {
	tests := []struct {
		release string
		refused bool
	}{
		{"5.10.0-28-amd64", false},
		{"5.10", false},
		{"6.1.0-18-arm64", false},
		{"6.18.0", false},
		{"7.2.0-rc1", false},
		{"5.9.16", true},
		{"5.4.0-150-generic", true},
		{"4.18.0-553.el8_10.x86_64", true},
		{"4.19.0", true},
		// Unparsable releases pass: loading reports what is missing.
		{"", false},
		{"unknown", false},
	}
	for _, tt := range tests {
		err := CheckKernelVersion(tt.release)
		if refused := err != nil; refused != tt.refused {
			t.Errorf("CheckKernelVersion(%q) = %v, want refused %v", tt.release, err, tt.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), tt.release) || !strings.Contains(err.Error(), MinKernel)) {
			t.Errorf("error %q should name the release and %s", err, MinKernel)
		}
	}
}

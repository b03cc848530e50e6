package tracer

import (
	"slices"
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

package reporter

import (
	"slices"
	"testing"

	"github.com/hostprof/ebpf-profiler/libpf"
)

func TestFormatTopN(t *testing.T) {
	tests := []struct {
		name    string
		entries []topEntry
		total   int
		want    string
	}{
		{
			name:  "no samples",
			total: 0,
			want:  "top 0 functions by self samples (of 0 samples):",
		},
		{
			name: "symbolized and not",
			entries: []topEntry{
				{function: "main.work", process: "app", samples: 2},
				{function: "libc.so.6+0x1a2b", process: "app", samples: 1},
			},
			total: 3,
			want: "top 2 functions by self samples (of 3 samples):\n" +
				"main.work (app) 66.7%\n" +
				"libc.so.6+0x1a2b (app) 33.3%",
		},
		{
			name:    "percent of all samples, not of those listed",
			entries: []topEntry{{function: "f", process: "p", samples: 1}},
			total:   8,
			want:    "top 1 functions by self samples (of 8 samples):\nf (p) 12.5%",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formatTopN(tt.entries, tt.total); got != tt.want {
				t.Errorf("formatTopN =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestTopFunctions(t *testing.T) {
	iv := newFixture().interval()
	// copy_user has 4 self samples in each process (in app-a across two
	// threads); equal counts are ordered by function, then process.
	all := []topEntry{
		{function: "copy_user", process: "app-a", samples: 4},
		{function: "copy_user", process: "app-b", samples: 4},
		{function: "app-a+0x600", process: "app-a", samples: 3},
		{function: "[unwinding aborted: error 3]", process: "app-b", samples: 2},
	}
	tests := []struct {
		n    int
		want []topEntry
	}{
		{n: 2, want: all[:2]},
		{n: 4, want: all},
		{n: 10, want: all},
	}
	for _, tt := range tests {
		if got := topFunctions(iv, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("topFunctions(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func TestFrameName(t *testing.T) {
	m := &libpf.Mapping{Path: "/usr/lib/libfoo.so.1"}
	tests := []struct {
		frame libpf.Frame
		want  string
	}{
		{libpf.Frame{Kind: libpf.FrameNative, Address: 0x10, Mapping: m, FunctionName: "foo"}, "foo"},
		{libpf.Frame{Kind: libpf.FrameNative, Address: 0x10, Mapping: m}, "libfoo.so.1+0x10"},
		{libpf.Frame{Kind: libpf.FrameNative, Address: 0x10}, "0x10"},
		{libpf.Frame{Kind: libpf.FrameAbort, Address: 7}, "[unwinding aborted: error 7]"},
		{libpf.Frame{Kind: libpf.FrameKernel, Address: 0x10, Mapping: &libpf.Mapping{Path: "[nf_tables]"},
			FunctionName: "nft_do_chain"}, "nft_do_chain [nf_tables]"},
		{libpf.Frame{Kind: libpf.FrameKernel, Address: 0x10, Mapping: &libpf.Mapping{Path: "vmlinux"},
			FunctionName: "schedule"}, "schedule"},
	}
	for _, tt := range tests {
		if got := frameName(&tt.frame); got != tt.want {
			t.Errorf("frameName(%+v) = %q, want %q", tt.frame, got, tt.want)
		}
	}
}

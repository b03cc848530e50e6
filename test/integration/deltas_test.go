package integration

import (
	"bufio"
	"bytes"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// nmSymbols are a binary's function symbols from nm, to name frames of a
// stripped copy of it.
type nmSymbols struct {
	addrs []uint64
	names []string
}

func readNM(t *testing.T, bin string) *nmSymbols {
	t.Helper()
	out, err := exec.Command("nm", "-n", "--defined-only", bin).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", bin, err)
	}
	s := &nmSymbols{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || (f[1] != "T" && f[1] != "t") {
			continue
		}
		addr, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			continue
		}
		s.addrs = append(s.addrs, addr)
		s.names = append(s.names, f[2])
	}
	return s
}

func (s *nmSymbols) lookup(addr uint64) string {
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > addr }) - 1
	if i < 0 {
		return ""
	}
	return s.names[i]
}

// namesVia names a trace's frames, using syms for frames of the file at
// path (a stripped binary) and the profiler's own names elsewhere.
func namesVia(tr *libpf.Trace, path string, syms *nmSymbols) []string {
	names := functionNames(tr)
	for i, f := range tr.Frames {
		if f.Mapping != nil && f.Mapping.Path == path {
			names[i] = syms.lookup(f.Address)
		}
	}
	return names
}

// TestStrippedWithoutFramePointers profiles a C workload built with
// -O2 -fomit-frame-pointer and stripped: only stack deltas from .eh_frame
// can unwind it.
func TestStrippedWithoutFramePointers(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "fpchain", "-O2", "-fomit-frame-pointer")
	syms := readNM(t, bin)
	if out, err := exec.Command("strip", "--strip-all", bin).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	s := startSession(t, testHz)
	pid, cpu := runWorkload(t, bin, 4*time.Second)
	metrics, _ := s.tr.Metrics()
	s.stop(t)

	chain := []string{"cf_leaf", "cf_mid", "cf_top", "main"}
	samples := s.rec.ofPID(pid)
	full, logged := 0, 0
	for _, smp := range samples {
		if hasChain(namesVia(smp.trace, bin, syms), chain) {
			full++
		} else if logged++; logged <= 5 {
			t.Logf("sample at +%v without the chain: %v", smp.meta.Time.Sub(samples[0].meta.Time), namesVia(smp.trace, bin, syms))
		}
	}
	if m := metrics; m != nil {
		t.Logf("BPF: %d delta frames, %d fp frames, no mapping %d, no deltas %d, stop %d, read errors %d",
			m["delta_frames"], m["fp_frames"], m["err_no_mapping"], m["err_no_deltas"], m["stop_deltas"], m["err_delta_read"])
	}
	share := float64(full) / float64(max(len(samples), 1))
	t.Logf("%d samples, %.1f%% with %v", len(samples), 100*share, chain)
	if float64(len(samples)) < 0.8*testHz*cpu.Seconds() || share < 0.95 {
		t.Errorf("%.1f%% of %d samples show the chain, want >= 95%%", 100*share, len(samples))
	}
}

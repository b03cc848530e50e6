package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// cppChain is cppchain.cpp's hot stack, leaf first, as -demangle
// simplified names it, and the mangled name of its leaf.
var cppChain = []string{"geo::operator+", "geo::Accumulator::add()::{lambda(unsigned long)#1}::operator()",
	"geo::Accumulator::add", "main"}

const cppLeafMangled = "_ZN3geoplERKNS_3VecES2_"

// TestNativeNames: a C++ workload's frames carry the names its source
// uses (an operator overload in a namespace, a class template's member, a
// lambda in it), the mangled name as the system name.
func TestNativeNames(t *testing.T) {
	requireRoot(t)
	skipIfPreparing(t)
	bin := filepath.Join(t.TempDir(), "cppchain")
	src := filepath.Join(workloadDir(""), "cppchain.cpp")
	if out, err := exec.Command("g++", "-O2", "-fno-omit-frame-pointer", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	s := startSession(t, testHz)
	w, _ := startWorkload(t, false, bin, "3")
	w.wait(t)
	s.stop(t)
	samples := s.rec.ofPID(w.pid)
	ok, misses := tally(samples, func(smp sample) bool {
		fs := smp.trace.Frames
		i := 0
		for i < len(fs) && fs[i].Kind != libpf.FrameNative {
			i++ // kernel frames
		}
		if len(fs)-i < len(cppChain) || fs[i].SystemName != cppLeafMangled {
			return false
		}
		for j, name := range cppChain {
			if fs[i+j].FunctionName != name {
				return false
			}
		}
		return true
	})
	t.Logf("%d samples, %.1f%% show %v, the leaf's system name %s", len(samples), 100*share(ok, len(samples)),
		cppChain, cppLeafMangled)
	logNamedMisses(t, misses)
	if share(ok, len(samples)) < 0.9 {
		t.Errorf("%.1f%% of samples with the demangled chain, want >= 90%%", 100*share(ok, len(samples)))
	}
}

// TestNativeNamesRustV0: a Rust workload built with the v0 mangling
// scheme (_R…) shows its functions by their paths, the mangled name as
// the system name.
func TestNativeNamesRustV0(t *testing.T) {
	requireRoot(t)
	skipIfPreparing(t)
	t.Setenv("RUSTFLAGS", "-C symbol-mangling-version=v0")
	bin, _ := buildRust(t)
	s := startSession(t, testHz)
	cmd := exec.Command(bin, "3")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	s.stop(t)
	samples := s.rec.ofPID(cmd.Process.Pid)
	chain := []string{"rustchain::rs_leaf", "rustchain::rs_mid", "rustchain::rs_top", "rustchain::main"}
	ok, misses := tally(samples, func(smp sample) bool {
		var fs []libpf.Frame
		for _, f := range smp.trace.Frames {
			if f.Kind == libpf.FrameNative {
				fs = append(fs, f)
			}
		}
		if len(fs) < len(chain) {
			return false
		}
		for i, name := range chain {
			if fs[i].FunctionName != name || !strings.HasPrefix(fs[i].SystemName, "_R") {
				return false
			}
		}
		return true
	})
	t.Logf("%d samples, %.1f%% show %v with v0 system names", len(samples), 100*share(ok, len(samples)), chain)
	logNamedMisses(t, misses)
	if share(ok, len(samples)) < 0.9 {
		t.Errorf("%.1f%% of samples with the demangled chain, want >= 90%%", 100*share(ok, len(samples)))
	}
}

// logNamedMisses logs the names and system names of a few samples.
func logNamedMisses(t *testing.T, misses []sample) {
	t.Helper()
	for _, m := range misses[:min(3, len(misses))] {
		var names []string
		for _, f := range m.trace.Frames {
			names = append(names, f.FunctionName+"|"+f.SystemName)
		}
		t.Logf("miss: %v", names)
	}
}

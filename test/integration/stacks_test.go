package integration

import (
	"math"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager"
)

const testHz = 100

// framePointers builds C with a frame record in every function: arm64 GCC
// leaves them out of leaves otherwise, and until a new process's unwind
// tables load, the frame-pointer walk skips the caller of a leaf without
// one (longer under emulation).
var framePointers = []string{"-O0", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"}

// TestFramePointerChain profiles a C workload built with frame pointers and
// checks the hot chain and the number of samples.
func TestFramePointerChain(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "fpchain", framePointers...)
	s := startSession(t, testHz)
	pid, cpu := runWorkload(t, bin, 4*time.Second)
	s.stop(t)

	samples := s.rec.ofPID(pid)
	expected := testHz * cpu.Seconds()
	t.Logf("%d samples for %.2f CPU-seconds at %d Hz (expected %.0f)", len(samples), cpu.Seconds(), testHz, expected)
	if math.Abs(float64(len(samples))-expected) > 0.2*expected {
		t.Errorf("got %d samples, want %.0f ± 20%%", len(samples), expected)
	}

	chain := []string{"cf_leaf", "cf_mid", "cf_top", "main"}
	full := 0
	for _, smp := range samples {
		if hasChain(functionNames(smp.trace), chain) {
			full++
		}
	}
	share := float64(full) / float64(max(len(samples), 1))
	t.Logf("%.1f%% of samples show %v", 100*share, chain)
	if share < 0.9 {
		t.Errorf("only %.1f%% of samples show the full chain, want >= 90%%", 100*share)
		for _, smp := range samples[:min(len(samples), 5)] {
			t.Logf("example: %v", functionNames(smp.trace))
		}
	}
	checkSampleMeta(t, samples, pid, "fpchain")
}

// checkSampleMeta checks what the reporter needs beside the frames, from
// the exec on: samples (in time order) of the forked child before it are
// the test binary's.
func checkSampleMeta(t *testing.T, samples []sample, pid int, exe string) {
	t.Helper()
	execed := slices.IndexFunc(samples, func(smp sample) bool { return smp.meta.ThreadName == exe })
	if execed < 0 {
		t.Fatalf("no sample of %s", exe)
	}
	for _, smp := range samples[execed:] {
		m := smp.meta
		if m.Process.ExecutableName != exe || int(m.TID) != pid || m.ThreadName != exe {
			t.Fatalf("sample metadata %+v (process %+v), want %s/%d", m, *m.Process, exe, pid)
		}
		if d := time.Since(m.Time); d < 0 || d > time.Minute {
			t.Fatalf("sample time %v is not recent", m.Time)
		}
		for _, f := range smp.trace.Frames {
			if f.Kind == libpf.FrameNative && f.Mapping != nil && f.Mapping.FileID.IsZero() {
				t.Fatalf("native frame %+v has a mapping without a file id", f)
			}
		}
	}
}

// TestKernelFramesAboveUser profiles a workload that lives in read(2): its
// samples must show kernel frames first, then its user frames.
func TestKernelFramesAboveUser(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "syscalls", "-O0", "-fno-omit-frame-pointer")
	s := startSession(t, testHz)
	pid, _ := runWorkload(t, bin, 3*time.Second)
	s.stop(t)

	samples := s.rec.ofPID(pid)
	if len(samples) < testHz {
		t.Fatalf("only %d samples of the syscall workload", len(samples))
	}
	// Before the process manager has read libc's unwind tables, a walk
	// that starts in libc's read wrapper may end there (the warm-up, as in
	// TestUnwindWithoutFramePointers).
	warmup := slices.IndexFunc(samples, func(smp sample) bool {
		return hasChain(functionNames(smp.trace), []string{"sc_top", "main"})
	})
	if warmup < 0 || warmup > maxWarmupSamples {
		t.Fatalf("%d samples before the first through sc_top → main, want <= %d", warmup, maxWarmupSamples)
	}
	samples = samples[warmup:]
	withKernel, ordered, readSyscall, stoppedAtCaller := 0, 0, 0, 0
	misses := map[string]int{}
	for _, smp := range samples {
		frames := smp.trace.Frames
		if len(frames) == 0 || frames[0].Kind != libpf.FrameKernel {
			continue
		}
		withKernel++
		// Kernel frames must all come before the first user frame.
		firstUser := len(frames)
		for i, f := range frames {
			if f.Kind != libpf.FrameKernel {
				firstUser = i
				break
			}
		}
		for _, f := range frames[firstUser:] {
			if f.Kind == libpf.FrameKernel {
				t.Fatalf("kernel frame after a user frame: %v", functionNames(smp.trace))
			}
		}
		// The libc wrapper sets up no frame, so sc_read (whose frame pointer
		// the walk starts from) is skipped: sc_top and main must follow.
		user := functionNames(smp.trace)[firstUser:]
		switch {
		case hasChain(user, []string{"sc_top", "main"}):
			ordered++
		case runtime.GOARCH == "arm64" && slices.Equal(user, []string{"__read", "sc_read"}):
			// A known defect on arm64 (seen under qemu in the kernel
			// matrix, 3-13% of samples): the walk stops at the
			// wrapper's caller. Counted apart until it is fixed.
			stoppedAtCaller++
			misses[stackString(smp.trace, "", nil)]++
		default:
			misses[stackString(smp.trace, "", nil)]++
		}
		for _, f := range frames[:firstUser] {
			if strings.HasSuffix(f.FunctionName, "sys_read") || f.FunctionName == "vfs_read" {
				readSyscall++
				break
			}
		}
	}
	logTopStacks(t, misses, 3)
	t.Logf("%d samples after %d of warm-up: %d with kernel frames, %d of those with sc_top → main below (%d stopped at sc_read), %d under vfs_read or *sys_read",
		len(samples), warmup, withKernel, ordered, stoppedAtCaller, readSyscall)
	if withKernel < len(samples)/2 {
		t.Errorf("only %d of %d samples have kernel frames", withKernel, len(samples))
	}
	if ordered+min(stoppedAtCaller, withKernel/5) < withKernel*9/10 {
		t.Errorf("only %d of %d kernel samples continue into sc_top → main", ordered, withKernel)
	}
	if readSyscall < withKernel*9/10 {
		t.Errorf("only %d of %d kernel samples are in a symbolized read function", readSyscall, withKernel)
	}
}

// TestProcessExitReported checks that the exit of a profiled process
// reaches the process manager once, after its last trace, and frees its
// state.
func TestProcessExitReported(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "fpchain", "-O0", "-fno-omit-frame-pointer")
	s := startSession(t, testHz)
	pid, _ := runWorkload(t, bin, time.Second)
	time.Sleep(500 * time.Millisecond) // the exit event waits for the next poll
	s.stop(t)
	checkExitedOnce(t, s, pid)
}

// maxTracesAfterExit allows for samples of the last thread while it runs
// the rest of do_exit() after the exit tracepoint.
const maxTracesAfterExit = 3

// checkExitedOnce checks a finished workload's events: traces, then exactly
// one exit, and no state left behind.
func checkExitedOnce(t *testing.T, s *session, pid int) {
	t.Helper()
	events := s.log.of(pid)
	traces, exits, late := 0, 0, 0
	for _, kind := range events {
		switch kind {
		case "exit":
			exits++
		case "trace":
			traces++
			if exits > 0 {
				late++
			}
		}
	}
	if traces == 0 || exits != 1 || late > maxTracesAfterExit {
		t.Errorf("workload events: %d traces (%d after the exit), %d exits; want traces, then one exit",
			traces, late, exits)
	}
	if s.pm.Tracks(libpf.PID(pid)) {
		t.Error("the process manager still tracks the exited workload")
	}
}

// TestLeaderExitsFirst runs a process whose main thread exits at once while
// another thread goes on: the process ends with its last thread, so the exit
// event must come then, not when the leader left. BPF sends every exit here:
// with its event filter on, it sends only those of processes the manager
// keeps state for, and the manager keeps none of a process it reads after
// the leader left (/proc/PID is the zombie leader's, with no mappings).
func TestLeaderExitsFirst(t *testing.T) {
	requireRoot(t)
	bin := buildWorkload(t, "leaderexit", "-O0", "-fno-omit-frame-pointer", "-pthread")
	s := startSessionWith(t, testHz, func(cfg *processmanager.Config) { cfg.Unwinding.Tracked = nil })
	pid, cpu := runWorkload(t, bin, 1500*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	s.stop(t)
	if n := len(s.rec.ofPID(pid)); float64(n) < 0.8*testHz*cpu.Seconds() {
		t.Errorf("%d samples for %.2f CPU-seconds", n, cpu.Seconds())
	}
	checkExitedOnce(t, s, pid)
}

// TestExecReplacesMappings runs a program that execs a copy of itself with
// renamed functions, with address randomization off: both images have all
// their code at the same addresses, so samples after the exec are only right
// if the exec event made the manager re-read the mappings.
func TestExecReplacesMappings(t *testing.T) {
	requireRoot(t)
	flags := []string{"-O0", "-fno-omit-frame-pointer", "-no-pie"}
	first := buildWorkload(t, "fpchain", flags...)
	second := buildWorkload(t, "fpchain", append(flags, "-Dcf_leaf=xf_leaf", "-Dcf_mid=xf_mid", "-Dcf_top=xf_top")...)
	s := startSession(t, testHz)
	cmd := exec.Command("setarch", "-R", first, "1.5", second, "1.5")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	s.stop(t)

	// setarch execs the first program, which execs the second: one pid.
	samples := s.rec.ofPID(cmd.Process.Pid)
	before, after := 0, 0
	for _, smp := range samples {
		names := functionNames(smp.trace)
		switch {
		case hasChain(names, []string{"cf_leaf", "cf_mid", "cf_top", "main"}):
			before++
		case hasChain(names, []string{"xf_leaf", "xf_mid", "xf_top", "main"}):
			after++
		}
	}
	t.Logf("%d samples: %d before the exec, %d after", len(samples), before, after)
	// Each side ran 1.5 s; a loaded machine gives it less CPU.
	if before < testHz/2 || after < testHz/2 {
		t.Errorf("want >= %d samples on both sides of the exec", testHz/2)
	}
	if before+after < len(samples)*9/10 {
		t.Errorf("only %d of %d samples attributed to the right program", before+after, len(samples))
	}
}

package integration

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/nodefetch"
)

// workloadRun is a workload process startWorkload started.
type workloadRun struct {
	cmd *exec.Cmd
	// pid is the workload's pid as the daemon sees it.
	pid int
}

// startPerfMapWorkload starts name with args and waits until it printed
// "ready" (its perf map is written); see startWorkload.
func startPerfMapWorkload(t *testing.T, namespaced bool, name string, args ...string) *workloadRun {
	t.Helper()
	r, line := startWorkload(t, namespaced, name, args...)
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("%s printed %q", name, line)
	}
	return r
}

// startWorkload starts name with args and returns once it printed its
// first line. In a namespace it runs as pid 1 of a pid namespace of its
// own, with a private tmpfs on /tmp in a mount namespace of its own: a
// file it writes to /tmp (a perf map, /tmp/perf-1.map) is invisible from
// the host's /tmp.
func startWorkload(t *testing.T, namespaced bool, name string, args ...string) (*workloadRun, string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if namespaced {
		// What the tmpfs hides (the workload, the checkout: either may
		// be under /tmp) stays reachable under /mnt.
		var nsArgs []string
		for _, a := range append([]string{name}, args...) {
			nsArgs = append(nsArgs, namespacedPath(a))
		}
		var err error
		if cmd, err = namespacedCommand(nsArgs...); err != nil {
			t.Fatal(err)
		}
	}
	cmd.Stderr = os.Stderr
	cmd.Dir = t.TempDir() // where node --perf-basic-prof writes its isolate logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if !namespaced {
			// node --perf-basic-prof leaves its perf map behind, where
			// a later process of the same pid would find it.
			os.Remove(fmt.Sprintf("/tmp/perf-%d.map", cmd.Process.Pid))
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s printed %q: %v", name, line, err)
	}
	r := &workloadRun{cmd: cmd, pid: cmd.Process.Pid}
	if namespaced {
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.pid))
		if !regexp.MustCompile(`(?m)^NSpid:\s+\d+\s+1$`).Match(status) {
			t.Fatalf("process %d is not pid 1 of its own namespace:\n%s", r.pid, status)
		}
	}
	return r, line
}

// namespacedPath is where a path under /tmp is inside the namespace of
// startPerfMapWorkload: under /mnt.
func namespacedPath(path string) string {
	if rest, ok := strings.CutPrefix(path, "/tmp/"); ok {
		return "/mnt/" + rest
	}
	return path
}

// waitAttached waits until the perf map reader attached to one more
// process than before and returns when: a process's JIT code is named from
// then on. The wait since the workload was ready is logged (a process
// first seen before its perf map was written is retried after
// RetryMin).
func waitAttached(t *testing.T, s *session, before uint64, ready time.Time) time.Time {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s.pm.Stats().RuntimeAttached["perfmap"] > before {
			at := time.Now()
			t.Logf("perf map reader attached %v after the workload was ready", at.Sub(ready).Round(time.Millisecond))
			return at
		}
	}
	t.Fatal("the perf map reader did not attach within 10 s")
	return time.Time{}
}

func (r *workloadRun) wait(t *testing.T) {
	t.Helper()
	if err := r.cmd.Wait(); err != nil {
		t.Fatalf("%v: %v", r.cmd.Args, err)
	}
}

// checkShare checks that, after a warm-up of at most maxWarmupSamples
// (until the daemon has read the process's files and its perf map), at
// least minShare of the process's samples match want.
func checkShare(t *testing.T, s *session, pid int, want *regexp.Regexp, minShare float64, from time.Time) {
	t.Helper()
	var samples []sample
	for _, smp := range s.rec.ofPID(pid) {
		if !smp.meta.Time.Before(from) {
			samples = append(samples, smp)
		}
	}
	warm := warmup(t, samples, "", nil, want)
	samples = samples[warm:]
	ok, misses := 0, map[string]int{}
	for _, smp := range samples {
		if stack := stackString(smp.trace, "", nil); want.MatchString(stack) {
			ok++
		} else {
			misses[stack]++
		}
	}
	logTopStacks(t, misses, 3)
	got := share(ok, len(samples))
	t.Logf("process %d: %d samples after %d of warm-up, %.1f%% show %s", pid, len(samples), warm, 100*got, want)
	if len(samples) < testHz || got < minShare {
		t.Errorf("%.1f%% of %d samples show %s, want >= %.0f%%", 100*got, len(samples), want, 100*minShare)
	}
}

// TestPerfMapJIT: a C program JIT-compiles a function into anonymous
// executable memory and names it in its perf map; its samples name it in
// its place between the C frames, also when the program runs in a mount
// and pid namespace of its own.
func TestPerfMapJIT(t *testing.T) {
	requireRoot(t)
	if runtime.GOARCH != "amd64" {
		t.Fatal("the JIT workload generates x86_64 code")
	}
	bin := buildWorkload(t, "jitmap", "-O2")
	want := userStack(`(jm_tick;)?jm_spin;jm_top;` + cRoot)
	for _, namespaced := range []bool{false, true} {
		t.Run(map[bool]string{false: "host", true: "namespaced"}[namespaced], func(t *testing.T) {
			s := startSession(t, testHz)
			before := s.pm.Stats().RuntimeAttached["perfmap"]
			r := startPerfMapWorkload(t, namespaced, bin, "4")
			attached := waitAttached(t, s, before, time.Now())
			r.wait(t)
			s.stop(t)
			checkShare(t, s, r.pid, want, 0.95, attached)
		})
	}
}

// TestPerfMapNode: a Node whose V8 the unwinder does not know (a
// metadata symbol renamed) runs with --perf-basic-prof: its optimized
// functions are named from its perf map instead; with inlining off, each
// of a three-function chain has a frame of its own, named in order.
func TestPerfMapNode(t *testing.T) {
	requireRoot(t)
	node := unknownV8Node(t)
	_, here, _, _ := runtime.Caller(0)
	script, err := filepath.Abs(filepath.Join(filepath.Dir(here), "..", "..", "utils", "workloads", "node", "chain.js"))
	if err != nil {
		t.Fatal(err)
	}
	for _, namespaced := range []bool{false, true} {
		t.Run(map[bool]string{false: "host", true: "namespaced"}[namespaced], func(t *testing.T) {
			path := script
			if namespaced {
				path = namespacedPath(script)
			}
			js := func(name string) string { return `JS:[*^~+]?` + name + ` ` + regexp.QuoteMeta(path) + `:\d+:\d+` }
			// Below top: the loop of the script and V8's entry, then
			// node's own frames down to the thread's root.
			want := userStack(js("leaf") + `;` + js("mid") + `;` + js("top") + `;.*`)
			s := startSession(t, testHz)
			before := s.pm.Stats().RuntimeAttached["perfmap"]
			r := startPerfMapWorkload(t, namespaced, node, "--perf-basic-prof", "--no-turbo-inlining", script, "5")
			attached := waitAttached(t, s, before, time.Now())
			r.wait(t)
			s.stop(t)
			if n := s.pm.Stats().RuntimeAttached["v8"]; n != 0 {
				t.Errorf("the V8 unwinder attached %d times to a V8 it does not know", n)
			}
			checkShare(t, s, r.pid, want, 0.9, attached)
		})
	}
}

// TestPerfMapHostile: perf maps that are a symlink out of the process's
// files, a 1 GiB file of garbage or a fifo are refused with their reason
// counted, without stalling the daemon, which keeps profiling the process
// (its JIT frame unnamed) and the others.
func TestPerfMapHostile(t *testing.T) {
	requireRoot(t)
	if runtime.GOARCH != "amd64" {
		t.Fatal("the JIT workload generates x86_64 code")
	}
	bin := buildWorkload(t, "jitmap", "-O2")
	other := buildWorkload(t, "fpchain", "-O0", "-fno-omit-frame-pointer")
	unnamed := userStack(`(jm_tick;)?\[anonymous executable memory\];jm_top;` + cRoot)
	for _, c := range []struct{ mode, reason string }{
		{"symlink", "symlink"},
		{"huge", "too_large"},
		{"fifo", "not_regular"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			s := startSession(t, testHz)
			r := startPerfMapWorkload(t, false, bin, "3", c.mode)
			otherPID, _ := runWorkload(t, other, 2*time.Second)
			r.wait(t)
			s.stop(t)
			if n := s.pm.Stats().RuntimeRefusals["perfmap/"+c.reason]; n != 1 {
				t.Errorf("refusals %v, want perfmap/%s = 1", s.pm.Stats().RuntimeRefusals, c.reason)
			}
			// Unclaimed anonymous code is found by re-reading the
			// process's maps, as in TestJITFrame: a few samples before
			// that show an address without a mapping.
			checkShare(t, s, r.pid, unnamed, 0.9, time.Time{})
			checkShare(t, s, otherPID, userStack(`cf_leaf;cf_mid;cf_top;`+cRoot), 0.95, time.Time{})
		})
	}
}

// unknownV8Node copies the machine's node into a temporary directory with
// one of V8's post-mortem metadata symbols renamed in .dynstr
// (v8dbg_off_fp_function, which nothing links against): a build whose
// layout the unwinder cannot complete, which runs as before.
func unknownV8Node(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(nodefetch.SystemNode)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	dynstr := f.Section(".dynstr")
	if dynstr == nil {
		t.Fatal("node has no .dynstr")
	}
	name := []byte("v8dbg_off_fp_function\x00")
	i := bytes.Index(data[dynstr.Offset:dynstr.Offset+dynstr.Size], name)
	if i < 0 {
		t.Fatalf("no %s in node's .dynstr", name)
	}
	copy(data[dynstr.Offset+uint64(i):], "v8dbg_off_fp_functioX")
	path := filepath.Join(t.TempDir(), "node")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

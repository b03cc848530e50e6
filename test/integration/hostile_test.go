package integration

import (
	"bufio"
	crand "crypto/rand"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/processmanager"
)

// hostileCase is a process built to hurt a profiler.
type hostileCase struct {
	name string
	// run runs the hostile process(es) for d, and says what they did.
	run func(t *testing.T, d time.Duration) string
	// counted names the counters (the status line's) that must have
	// moved, from the process manager's and BPF's counters before and
	// after; "" if none did.
	counted func(before, after processmanager.Stats, bpfBefore, bpfAfter map[string]uint64) string
}

// TestHostileHost runs, one at a time, processes built to hurt a profiler
// beside an ordinary one (fpchain): 100,000 mappings, code that moves every
// millisecond, a fake libpython and libjvm.so whose tables are random
// bytes, and a Python interpreter whose heap is overwritten with random
// bytes while it runs. The daemon must keep the ordinary process's profile
// (>= 95% of its samples whole), stay within its CPU and memory bounds,
// and count each case. (A 1 GiB perf map and other hostile perf maps:
// TestPerfMapHostile; agent sockets that escape their process's root:
// test/e2e's TestAPMCorrelation.)
func TestHostileHost(t *testing.T) {
	requireRoot(t)
	const run = 6 * time.Second
	other := buildWorkload(t, "fpchain", "-O0", "-fno-omit-frame-pointer")
	for _, c := range hostileCases(t) {
		t.Run(c.name, func(t *testing.T) {
			s := startSession(t, testHz)
			before, bpfBefore := s.pm.Stats(), bpfMetrics(t, s)
			var ru0, ru1 syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			rss0 := selfRSS(t)
			t0 := time.Now()
			done := make(chan string, 1)
			go func() { done <- c.run(t, run) }()
			otherPID, _ := runWorkload(t, other, run-time.Second)
			what := <-done
			wall := time.Since(t0)
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			rss1 := selfRSS(t)
			after, bpfAfter := s.pm.Stats(), bpfMetrics(t, s)
			s.stop(t)
			cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) + syscall.TimevalToNsec(ru1.Stime) -
				syscall.TimevalToNsec(ru0.Utime) - syscall.TimevalToNsec(ru0.Stime))
			t.Logf("%s; daemon (this test process) CPU %.1f%% of one CPU over %v, RSS %d -> %d MiB",
				what, 100*cpu.Seconds()/wall.Seconds(), wall.Round(100*time.Millisecond), rss0>>20, rss1>>20)
			counted := c.counted(before, after, bpfBefore, bpfAfter)
			if counted == "" {
				t.Errorf("nothing counted the hostile process (BPF errors %v)", counterDiff(bpfBefore, bpfAfter, "err_"))
			} else {
				t.Logf("counted: %s", counted)
			}
			checkShare(t, s, otherPID, userStack(`cf_leaf;cf_mid;cf_top;`+cRoot), 0.95, time.Time{})
			// The daemon's own bounds: a tenth of a CPU at 100 Hz on a
			// quiet host, tens of MiB; hostile input may cost more, not
			// without end.
			if cpu.Seconds() > 0.5*wall.Seconds() {
				t.Errorf("the daemon used %.0f%% of a CPU", 100*cpu.Seconds()/wall.Seconds())
			}
			if rss1 > rss0+256<<20 {
				t.Errorf("the daemon's RSS grew from %d to %d MiB", rss0>>20, rss1>>20)
			}
		})
	}
}

func hostileCases(t *testing.T) []hostileCase {
	return []hostileCase{{
		name: "100000 mappings",
		run: func(t *testing.T, d time.Duration) string {
			// Twice the mappings, and a margin, for the kernel's map count.
			defer setSysctl(t, "vm/max_map_count", "250000")()
			bin := buildWorkload(t, "manymaps", "-O0", "-fno-omit-frame-pointer")
			cmd := exec.Command(bin, formatSeconds(d), "100000")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("manymaps: %v\n%s", err, out)
			}
			return fmt.Sprintf("manymaps held 100000 mappings for %v", d)
		},
		counted: func(b, a processmanager.Stats, _, _ map[string]uint64) string {
			if n := a.DeltaMappingsDeferred - b.DeltaMappingsDeferred; n > 0 {
				return fmt.Sprintf("mappings_deferred=%d", n)
			}
			return ""
		},
	}, {
		name: "code moved every millisecond",
		run: func(t *testing.T, d time.Duration) string {
			bin := buildWorkload(t, "remapcode", "-O2", "-fno-omit-frame-pointer")
			out, err := exec.Command(bin, formatSeconds(d)).CombinedOutput()
			if err != nil {
				t.Errorf("remapcode: %v\n%s", err, out)
			}
			return "remapcode: " + strings.TrimSpace(string(out))
		},
		counted: func(b, a processmanager.Stats, _, _ map[string]uint64) string {
			if n := a.MapsRereadsLimited - b.MapsRereadsLimited; n > 0 {
				return fmt.Sprintf("maps re-reads limited=%d", n)
			}
			return ""
		},
	}, {
		name: "fake libpython and libjvm.so",
		run: func(t *testing.T, d time.Duration) string {
			dir := t.TempDir()
			py, jvm := filepath.Join(dir, "libpython3.11.so.1.0"), filepath.Join(dir, "libjvm.so")
			src := workloadDir("fakeruntimes")
			cc := targetToolchain(t).cc
			run(t, "", nil, cc, "-O2", "-shared", "-fPIC", "-o", py, filepath.Join(src, "fakepython.c"))
			run(t, "", nil, cc, "-O2", "-shared", "-fPIC", "-o", jvm, filepath.Join(src, "fakejvm.c"))
			bin := filepath.Join(dir, "fakeruntimes")
			run(t, "", nil, cc, "-O2", "-fno-omit-frame-pointer", "-o", bin, filepath.Join(src, "fakeruntimes.c"), "-ldl")
			if out, err := exec.Command(bin, formatSeconds(d), py, jvm).CombinedOutput(); err != nil {
				t.Errorf("fakeruntimes: %v\n%s", err, out)
			}
			return "fakeruntimes ran its fake libpython and libjvm.so"
		},
		counted: func(b, a processmanager.Stats, _, _ map[string]uint64) string {
			var moved []string
			for k, v := range a.RuntimeRefusals {
				if v > b.RuntimeRefusals[k] {
					moved = append(moved, fmt.Sprintf("refused %s=%d", k, v-b.RuntimeRefusals[k]))
				}
			}
			if n := a.InterpreterErrors - b.InterpreterErrors; n > 0 {
				moved = append(moved, fmt.Sprintf("interpreter_errors=%d", n))
			}
			slices.Sort(moved)
			return strings.Join(moved, " ")
		},
	}, {
		name: "Python heap overwritten while sampled",
		run: func(t *testing.T, d time.Duration) string {
			script, _ := pythonWorkload(t)
			py := pythonInterpreters(t)[0]
			var starts, writes int
			for end := time.Now().Add(d); time.Now().Before(end); {
				cmd := exec.Command(py.path, script, "chain", formatSeconds(time.Until(end)))
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				starts++
				exited := make(chan struct{})
				go func() { cmd.Wait(); close(exited) }()
				// Let it start, then write 64 random bytes somewhere in
				// its writable anonymous memory every 2 ms until it dies.
				time.Sleep(300 * time.Millisecond)
				for alive := true; alive; {
					select {
					case <-exited:
						alive = false
					case <-time.After(2 * time.Millisecond):
						if scribble(cmd.Process.Pid) {
							writes++
						}
					}
				}
			}
			return fmt.Sprintf("%d pythons, %d random writes into their memory", starts, writes)
		},
		counted: func(b, a processmanager.Stats, bb, ba map[string]uint64) string {
			var moved []string
			if n := a.RuntimeFrameErrors - b.RuntimeFrameErrors; n > 0 {
				moved = append(moved, fmt.Sprintf("runtime_frame_errors=%d", n))
			}
			if d := counterDiff(bb, ba, "err_python"); d != "" {
				moved = append(moved, d)
			}
			return strings.Join(moved, " ")
		},
	}}
}

// scribble writes 64 random bytes at a random place in one of pid's
// writable anonymous mappings (the heap, arenas; not its stacks).
func scribble(pid int) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return false
	}
	var regions [][2]uint64
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 || !strings.HasPrefix(fields[1], "rw") || fields[4] != "0" ||
			(len(fields) > 5 && fields[5] != "[heap]") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil && end-start >= 4096 {
			regions = append(regions, [2]uint64{start, end})
		}
	}
	f.Close()
	if len(regions) == 0 {
		return false
	}
	r := regions[rand.IntN(len(regions))]
	at := r[0] + rand.Uint64N(r[1]-r[0]-64)
	buf := make([]byte, 64)
	crand.Read(buf)
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_WRONLY, 0)
	if err != nil {
		return false
	}
	defer mem.Close()
	_, err = mem.WriteAt(buf, int64(at))
	return err == nil
}

// setSysctl sets /proc/sys/NAME and returns what restores it.
func setSysctl(t *testing.T, name, value string) func() {
	path := filepath.Join("/proc/sys", name)
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() { os.WriteFile(path, old, 0o644) }
}

// selfRSS is this process's resident set in bytes.
func selfRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

func bpfMetrics(t *testing.T, s *session) map[string]uint64 {
	m, err := s.tr.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return maps.Clone(m)
}

// counterDiff lists the counters with prefix that moved.
func counterDiff(before, after map[string]uint64, prefix string) string {
	var out []string
	for k, v := range after {
		if strings.HasPrefix(k, prefix) && v > before[k] {
			out = append(out, fmt.Sprintf("%s=+%d", k, v-before[k]))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

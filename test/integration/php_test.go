package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/php"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// phpWorkload returns the path of phpworkload.php and the lines of its
// "# hot: NAME" marks.
func phpWorkload(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "php", "phpworkload.php")
}

// phpBuild returns a tested release's build for the workloads'
// architecture, and lists it for the VM when the run prepares one.
func phpBuild(t *testing.T, v string) *phpfetch.Build {
	t.Helper()
	requireRuntime(t, func(arch string) ([]string, error) { return phpfetch.Tree(v, arch) },
		func() error { _, err := phpfetch.PHP(v); return err })
	b, err := phpfetch.For(v, targetArch())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runPHP runs the workload in one mode for d, with the interpreter's
// flags, and stops the session (its runtime counters returned) while the
// process holds after its work.
func runPHP(t *testing.T, b *phpfetch.Build, s *session, script, mode string, d time.Duration, flags ...string) (scriptRun, map[string]uint64) {
	t.Helper()
	var metrics map[string]uint64
	run := runScriptHeld(t, b.Command(append(flags, script, mode, formatSeconds(d))...), func() {
		metrics = logRuntimeMetrics(t, s, "php")
		s.stop(t)
	})
	return run, metrics
}

// phpFrame is a PHP frame a test expects: its function and the lines it
// may be at (0 for a C function, which has no file).
type phpFrame struct {
	name  string
	lines []uint32
}

// phpChain says whether fs, a sample's PHP frames, are the chain
// workload's: Shop\Cart::leaf at its loop, Shop\Cart::mid, array_map and
// Shop\top, then outer, each in the script at its line. Under the JIT
// leaf runs JIT code, which keeps no opline: it has no line, and the JIT
// tier; top, waiting in a call from its code, has it where the function
// JIT compiled it. Without the JIT no frame has a tier.
func phpChain(fs []libpf.Frame, script string, hot map[string]uint32, outer []phpFrame, jit bool) bool {
	leaf, leafTier := []uint32{hot["leaf"], hot["leaf loop"]}, ""
	if jit {
		leaf, leafTier = []uint32{0}, php.TierJIT
	}
	if len(fs) == 0 || fs[0].Tier != leafTier ||
		slices.ContainsFunc(fs[1:], func(f libpf.Frame) bool { return f.Tier != "" && !(jit && f.FunctionName == `Shop\top`) }) {
		return false
	}
	want := append([]phpFrame{{`Shop\Cart::leaf`, leaf},
		{`Shop\Cart::mid`, []uint32{hot["mid"]}}, {"array_map", []uint32{0}}, {`Shop\top`, []uint32{hot["top"]}}}, outer...)
	if len(fs) != len(want) {
		return false
	}
	for i, f := range fs {
		if f.FunctionName != want[i].name || !slices.Contains(want[i].lines, f.SourceLine) ||
			(want[i].name != "array_map" && f.SourceFile != script) {
			return false
		}
	}
	return true
}

// phpMain is the chain workload's {main}, at the chain mode's call.
func phpMain(hot map[string]uint32) []phpFrame {
	return []phpFrame{{"{main}", []uint32{hot["main"]}}}
}

// phpJIT are the interpreter flags of OPcache's JIT in a mode (tracing,
// function) on the CLI.
func phpJIT(b *phpfetch.Build, mode string) []string {
	return []string{"-d", "zend_extension=" + b.OPcache, "-d", "opcache.enable_cli=1", "-d", "opcache.jit=" + mode,
		"-d", "opcache.jit_buffer_size=64M"}
}

// TestPHPStacks profiles the chain workload under each tested PHP, with
// and without OPcache's JIT (tracing and function), and checks its PHP frames (phpChain;
// array_map is a C function that calls back into a second run of the VM).
func TestPHPStacks(t *testing.T) {
	requireRoot(t)
	results := map[string][]float64{}
	for _, v := range phpfetch.Versions {
		for _, jit := range []string{"", "tracing", "function"} {
			name := "PHP " + v
			if jit != "" {
				name += " " + jit + " JIT"
			}
			t.Run(name, func(t *testing.T) {
				b, flags := phpBuild(t, v), []string(nil)
				if jit != "" {
					flags = phpJIT(b, jit)
				}
				share, metrics, n := profilePHPChain(t, b, flags...)
				results[v] = append(results[v], share)
				if jit := metrics["php_jit_frames"]; flags != nil && jit < uint64(n)/2 {
					t.Errorf("%d samples in JIT code of %d, want at least half (is the JIT on? %s)", jit, n, b.CLI)
				}
			})
		}
	}
	logShareTable(t, "PHP", phpfetch.Versions, []string{"chain", "chain tracing JIT", "chain function JIT"}, results)
}

// profilePHPChain runs the chain workload under b with flags and returns
// the share of its samples that show the chain, the runtime's BPF
// counters and the number of samples.
func profilePHPChain(t *testing.T, b *phpfetch.Build, flags ...string) (float64, map[string]uint64, int) {
	t.Helper()
	script, hot := phpWorkload(t)
	s := startSession(t, testHz)
	run, metrics := runPHP(t, b, s, script, "chain", 4*time.Second, flags...)
	if flags != nil && !strings.Contains(run.output, "opcache on jit on") {
		t.Fatalf("OPcache's JIT is not on: the workload printed %q", run.output)
	}
	chain := func(smp sample) bool {
		return phpChain(framesOf(smp.trace, php.Kind), script, hot, phpMain(hot), flags != nil)
	}
	samples := warmSamples(t, run, s.rec, flags != nil, chain, php.Kind, "php")
	ok := 0
	misses := map[string]int{}
	var missedAt []string
	for _, smp := range samples {
		if chain(smp) {
			ok++
		} else {
			misses[stackOf(smp.trace, php.Kind, "php")]++
			missedAt = append(missedAt, fmt.Sprintf("%+d", smp.meta.Time.Sub(run.hotFrom).Milliseconds()))
		}
	}
	share := share(ok, len(samples))
	t.Logf("%d samples, %.1f%% with the chain at its lines", len(samples), 100*share)
	logTopStacks(t, misses, 4)
	if len(missedAt) > 0 {
		// When: a run of misses early in the hot phase is code not yet
		// mapped for the unwinder, which the unknown-PC reports show.
		t.Logf("misses at ms into the hot phase: %s", strings.Join(missedAt[:min(len(missedAt), 40)], " "))
		t.Logf("unknown-PC reports: %s", s.log.unknownPCs(run.pid, run.hotFrom))
	}
	if len(samples) < testHz || share < 0.95 {
		t.Errorf("%d of %d samples show the chain, want >= 95%% of at least %d", ok, len(samples), testHz)
	}
	return share, metrics, len(samples)
}

// phpFPM is a php-fpm pool serving the workload on a unix socket.
type phpFPM struct {
	sock string
	cmd  *exec.Cmd
}

// startFPM starts a pool of workers (pm = static) that are recycled
// after maxRequests requests each.
func startFPM(t *testing.T, b *phpfetch.Build, workers, maxRequests int) *phpFPM {
	t.Helper()
	dir := t.TempDir()
	f := &phpFPM{sock: filepath.Join(dir, "fpm.sock")}
	conf := filepath.Join(dir, "fpm.conf")
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`[global]
error_log = %s
daemonize = no
[test]
listen = %s
pm = static
pm.max_children = %d
pm.max_requests = %d
`, filepath.Join(dir, "fpm.log"), f.sock, workers, maxRequests)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// -R: workers may run as root, the tests' user. OPcache on, as
	// Debian's php-fpm has it: without it a request's code is freed when
	// it ends, often before the daemon reads it.
	f.cmd = exec.Command(b.FPM, "-n", "-F", "-R", "-y", conf, "-d", "zend_extension="+b.OPcache, "-d", "opcache.enable=1")
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.cmd.Process.Signal(syscall.SIGQUIT)
		done := make(chan error, 1)
		go func() { done <- f.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = f.cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(f.sock); err == nil {
			return f
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "fpm.log"))
			t.Fatalf("php-fpm did not listen on %s within 10 s:\n%s", f.sock, log)
		}
	}
}

// load sends requests for the workload's chain, each spinning ms
// milliseconds, from clients concurrent clients for d, and returns how many
// each worker (by pid) served.
func (f *phpFPM) load(t *testing.T, script string, clients int, d time.Duration, ms int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	served := map[int]int{}
	var errs []error
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				out, err := fcgiGet(f.sock, script, fmt.Sprintf("ms=%d", ms), 10*time.Second)
				var pid int
				if err == nil {
					_, err = fmt.Sscanf(out, "%d", &pid)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					served[pid]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d requests failed, the first: %v", len(errs), errs[0])
	}
	return served
}

// inRequest says whether a sample was taken while php-fpm ran a script:
// its native frames, which the PHP frames do not replace, show it.
func inRequest(tr *libpf.Trace) bool {
	// php_execute_script_ex from 8.3 on.
	return slices.ContainsFunc(tr.Frames, func(f libpf.Frame) bool { return strings.HasPrefix(f.FunctionName, "php_execute_script") })
}

// TestPHPFPM: a php-fpm pool of four workers recycled after 50 requests
// each, under a load loop of four clients: every worker's samples during
// its requests show the request's chain, after its warm-up (at most
// maxWarmupSamples).
func TestPHPFPM(t *testing.T) {
	requireRoot(t)
	script, hot := phpWorkload(t)
	outer := []phpFrame{{"{main}", []uint32{hot["request"]}}}
	for _, v := range phpfetch.Versions {
		t.Run("PHP "+v, func(t *testing.T) {
			b := phpBuild(t, v)
			skipIfPreparing(t)
			fpm := startFPM(t, b, 4, 50)
			s := startSession(t, testHz)
			served := fpm.load(t, script, 4, 6*time.Second, 20)
			s.stop(t)
			var requests, n, ok, warmup, thin int
			misses := map[string]int{}
			chain := func(smp sample) bool { return phpChain(framesOf(smp.trace, php.Kind), script, hot, outer, false) }
			for pid, r := range served {
				requests += r
				var in []sample
				for _, smp := range s.rec.ofPID(pid) {
					if inRequest(smp.trace) {
						in = append(in, smp)
					}
				}
				// A new worker's first samples may come before the daemon
				// has described it (a second's under emulation).
				warm := slices.IndexFunc(in, chain)
				if warm < 0 {
					warm = len(in)
				}
				warmup += warm
				wn, wok := len(in)-warm, 0
				for _, smp := range in[warm:] {
					if chain(smp) {
						wok++
					} else {
						misses[stackOf(smp.trace, php.Kind, "php")]++
					}
				}
				n, ok = n+wn, ok+wok
				// A worker that served half its 50 requests spun 0.5 s in
				// them: some 50 samples. The last ones started may serve
				// a few requests only.
				if (r >= 25 && len(in) < 10) || warm > maxWarmupSamples || (wn >= 10 && share(wok, wn) < 0.8) {
					thin++
					t.Logf("worker %d: %d requests, %d samples in them, %d of warm-up, %d with the chain", pid, r, len(in), warm, wok)
				}
			}
			t.Logf("%d workers served %d requests; %d samples in requests after %d of warm-up, %.1f%% with the chain",
				len(served), requests, n, warmup, 100*share(ok, n))
			logTopStacks(t, misses, 4)
			if len(served) < 8 || share(ok, n) < 0.95 || thin > 0 {
				t.Errorf("%d workers (want >= 8, recycled), %.1f%% of the samples in requests with the chain (want >= 95%%), %d workers with fewer than 10 samples in 25 requests, more than %d of warm-up or 80%% with the chain (want 0)",
					len(served), 100*share(ok, n), thin, maxWarmupSamples)
			}
		})
	}
}

// TestPHPFPMDaemonMemory runs the daemon itself for two and a half
// minutes beside a php-fpm pool whose four workers are recycled every 20
// requests (some thousand worker processes come and go) and checks
// that its resident memory stays flat: the last half minute's floor (the
// Go heap's after a collection; RSS rises to twice it between
// collections) within 25% of the second half minute's (the first is
// start-up). The traces of exited workers once stayed cached: +51% over
// a thousand workers; a transient peak can leave the floor a few MiB
// higher (+15% seen once), which the margin covers.
func TestPHPFPMDaemonMemory(t *testing.T) {
	requireRoot(t)
	const run, every, window = 150 * time.Second, 5 * time.Second, 30 * time.Second
	script, _ := phpWorkload(t)
	b, err := phpfetch.PHP(phpfetch.Versions[0])
	if err != nil {
		t.Fatal(err)
	}
	daemon := buildDaemon(t)
	skipIfPreparing(t)
	fpm := startFPM(t, b, 4, 20)
	// Without Go heap profiles: their first round, a minute in, reads
	// the host's Go programs once (this test's own binary among them)
	// and raised the floor 37 -> 48 MiB, a step, not the growth looked
	// for here.
	d := testenv.StartDaemon(t, nil, daemon, "-output-dir="+t.TempDir(), "-reporter-interval=10s",
		"-samples-per-second="+strconv.Itoa(testHz), "-go-heap-interval=0")
	d.WaitForLog(t, "Sampling ", time.Minute)
	served := make(chan map[int]int, 1)
	go func() { served <- fpm.load(t, script, 4, run, 20) }()
	var rss []float64 // MiB, one per interval
	for start := time.Now(); time.Since(start) < run; {
		time.Sleep(every)
		kib, err := residentKiB(d.Cmd.Process.Pid)
		if err != nil {
			t.Fatalf("reading the daemon's memory: %v", err)
		}
		rss = append(rss, float64(kib)/1024)
	}
	workers := <-served
	d.Stop(t, time.Minute)
	n := int(window / every)
	base, end := slices.Min(rss[n:2*n]), slices.Min(rss[len(rss)-n:])
	t.Logf("%d workers over %v; daemon RSS every %v (MiB): %.1f", len(workers), run, every, rss)
	t.Logf("floor: second %v %.1f MiB, last %v %.1f MiB (%+.1f%%)", window, base, window, end, 100*(end/base-1))
	if len(workers) < 1000 {
		t.Errorf("%d workers served requests, want >= 1000 (recycled every 20 requests)", len(workers))
	}
	if end > 1.25*base {
		t.Errorf("the daemon's RSS floor grew from %.1f to %.1f MiB, want within 25%%", base, end)
	}
}

// residentKiB reads a process's resident set size (VmRSS).
func residentKiB(pid int) (int, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int
			_, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib)
			return kib, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// TestPHPEval: the chain called from eval'd code in an included file:
// {eval} (named by PHP's own "file(line) : eval()'d code") above
// {include} above {main}.
func TestPHPEval(t *testing.T) {
	requireRoot(t)
	script, hot := phpWorkload(t)
	included, incHot := markedWorkload(t, "php", "included.php")
	b := phpBuild(t, phpfetch.Versions[len(phpfetch.Versions)-1])
	s := startSession(t, testHz)
	run, _ := runPHP(t, b, s, script, "eval", 3*time.Second)
	evalFile := fmt.Sprintf("%s(%d) : eval()'d code", included, incHot["eval"])
	good := func(smp sample) bool {
		fs := framesOf(smp.trace, php.Kind)
		return len(fs) == 7 && phpChain(fs[:4], script, hot, nil, false) &&
			fs[4] == libpf.Frame{Kind: php.Kind, FunctionName: "{eval}", SourceFile: evalFile, SourceLine: 1} &&
			fs[5] == libpf.Frame{Kind: php.Kind, FunctionName: "{include}", SourceFile: included, SourceLine: incHot["eval"]} &&
			fs[6] == libpf.Frame{Kind: php.Kind, FunctionName: "{main}", SourceFile: script, SourceLine: hot["require"]}
	}
	ok := 0
	misses := map[string]int{}
	samples := warmSamples(t, run, s.rec, false, good, php.Kind, "php")
	for _, smp := range samples {
		if good(smp) {
			ok++
		} else {
			misses[stackOf(smp.trace, php.Kind, "php")]++
		}
	}
	t.Logf("%d samples, %.1f%% with the chain under {eval}, {include}, {main}", len(samples), 100*share(ok, len(samples)))
	logTopStacks(t, misses, 4)
	if len(samples) < testHz || share(ok, len(samples)) < 0.95 {
		t.Errorf("%d of %d samples show the chain, want >= 95%%", ok, len(samples))
	}
}

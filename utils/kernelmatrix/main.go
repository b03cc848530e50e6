// Command kernelmatrix runs the BPF integration tests on every kernel the
// profiler supports: for each kernel series and architecture it boots
// Debian's kernel under qemu (software emulation) with an initramfs of
// its own (vminit as PID 1, the test binary built for the architecture,
// the workloads built ahead on this machine and the libraries they need)
// and prints a table of what each kernel did. It exits 1 if any kernel
// rejected a program or missed an expected stack.
//
//	go run ./utils/kernelmatrix [-kernels 5.10,6.1] [-arch arm64] [-run REGEX] [-v]
//
// Run it as root from the repository (make kernel-matrix): it fetches the
// kernels with utils/kernelmatrix/fetch-kernel.sh, which caches them.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Each VM runs a selection of test/integration's tests: every program
// loads and attaches, sampling switches off and on, the stacks of the
// frame-pointer C workload, the kernel, and the workloads without frame
// pointers whose unwinders need no runtime in the VM (stripped C, libc
// calling back, the vDSO, Go and cgo, and on arm64 C with signed return
// addresses), the APM trace context, OpenTelemetry thread contexts (static
// TLS, descriptors, __tls_get_addr) and goroutine labels read through the
// thread pointer, and the daemon itself. The arm64 VMs also run the runtime tests with the
// runtimes' arm64 builds (fetched on this machine, which runs only their
// x86_64 builds): every tested version on fullRuntimesKernel, one
// version of each on runtimeOneKernel. What the runtime unwinders need
// of a kernel is the same on every series (the programs load, which
// every VM checks, and the helpers the native unwinder's tests cover):
// the other arm64 kernels run the base tests only.
var (
	baseTests = []string{"TestProgramsLoad", "TestSamplingSwitch", "TestFramePointerChain", "TestKernelFramesAboveUser",
		"TestUnwindWithoutFramePointers", "TestAPMTraceContext", "TestDaemonLocalOutput"}
	baseSubtests = []string{"C_", "libc", "vDSO", "Go", "cgo"}
	// Goroutine labels: read through the thread pointer, or x28 on arm64
	// without cgo; from a map (Go 1.23) and a slice (1.26).
	goLabelTests = `^TestGoLabels$/^builds$/^go1\.(23|26|26_cgo)$`
	// OpenTelemetry thread contexts: every TLS access model.
	threadCtxTests = `^TestThreadContext$`
	// Off-CPU profiling: the sched_switch program and the unwinders' raw
	// tracepoint copies load, and a C thread's sleeps are attributed.
	offCPUTests = `^TestOffCPU$/^C$`
	// Go heap profiles: the reader on arm64 (x86_64 runs it on the host).
	goHeapTests = `^TestGoHeapReader$`
	perlTests   = `^(TestPerlStacks|TestPerlEval|TestPerlSort|TestPerlThreads|TestPerlForks|TestPerlRecursion)$`
	// Not TestPHPFPM: under emulation each request's own work (chdir,
	// compiling nothing, output) takes 4-6% of the samples in requests,
	// next to the 20 ms the chain spins (94.6-96.4% with the chain).
	phpTests = `^TestPHPStacks$`
	// Java: the chain (compiled leaf and top, interpreted mid) of one JDK
	// on every kernel, of every JDK on fullRuntimesKernel, and there the
	// other cases of the newest but recursion, which emulation skews to
	// the JIT's own work (counter overflows, compiles: 86-91%).
	javaChain = `^TestJavaStacks$/^JDK_%s$/^chain,_mid_interpreted$`
	javaRest  = `^TestJavaStacks$/^JDK_25$/^(chain,|inlined|4_threads|zlib)`
	// Ruby: threads, a forking server and a process started before the
	// daemon, with the newest version (the layouts they read are those
	// TestRubyStacks reads for every version).
	rubyRest = `^(TestRubyThreads|TestRubyForkingServer|TestRubyStartedBeforeProfiler)$`
	// Node: the chain in each tier but inlined TurboFan code, whose
	// samples emulation skews: the interrupted PC falls where qemu's
	// translated blocks begin, and in a loop inlined by TurboFan those
	// are mostly its interrupt checks, which carry the inlined function's
	// entry position, not its loop's line (Node 22 on 6.12: the default
	// chain 57-60%, --no-turbo-inlining, interpreted, baseline-only and
	// unoptimized tiers 96.6-100%). Optimized and baseline code on every
	// version, the interpreter and Maglev on one each, optimized code on
	// the other kernels. Not two versions at once: under emulation their
	// clock reads and recompiles take 5-6% of the samples.
	nodeChain = `^TestNodeStacks$/^Node_%s$/^chain,_(--no-turbo-inlining|Sparkplug_only)$`
	nodeOne   = `^TestNodeStacks$/^Node_22$/^chain,_--no-turbo-inlining$`
	nodeRest  = []string{`^TestNodeStacks$/^Node_22$/^chain,_--jitless$`, `^TestNodeStacks$/^Node_24$/^chain,_--no-turbofan$`}
	// LuaJIT: every mode of sid's build (the VM, traces, FFI, libm,
	// coroutines, the embedding host), the chain of trixie's.
	luajitAll = `^TestLuaJITStacks$/^2\.1-20251030$`
	luajitOne = `^TestLuaJITStacks$/^2\.1-20250117$/^chain_`
	// The runtime tests runtimeOneKernel runs (one version of each) and
	// those fullRuntimesKernel runs (all of them). Every Perl version
	// runs TestPerlStacks; its other tests, whose workloads differ by what
	// they call, not by version, run one.
	runtimeOne = []string{perlTests + `/^perl_5\.40$`, `^TestPerlStartedBeforeProfiler$`, phpTests + `/^PHP_8\.4`, `^TestPHPEval$`,
		`^TestRubyStacks$/^Ruby_3\.4$`, fmt.Sprintf(javaChain, "21"), nodeOne, luajitOne}
	runtimeAll = []string{perlTests + `/^perl_5\.40$`, `^TestPerlStacks$`, `^TestPerlStartedBeforeProfiler$`, phpTests, `^TestPHPEval$`,
		`^TestRubyStacks$`, rubyRest + `/^Ruby_3\.4$`, fmt.Sprintf(javaChain, "[0-9]+"), javaRest,
		fmt.Sprintf(nodeChain, "[0-9]+"), nodeRest[0], nodeRest[1], `^TestNodeProcesses$/^(started_before|own_pid)`,
		`^TestJavaProcesses$/^own_pid`, luajitAll, luajitOne}
	runtimeArches      = map[string]bool{"arm64": true}
	fullRuntimesKernel = "6.12"
	// The oldest series, whose verifier is furthest from 6.12's.
	runtimeOneKernel = "5.10"
)

// runsRuntimes says whether a series' VM on arch runs runtime tests.
func runsRuntimes(arch, series string) bool {
	return runtimeArches[arch] && (series == fullRuntimesKernel || series == runtimeOneKernel)
}

// runFor is the selection (go test -run) a kernel series runs on an
// architecture.
func runFor(arch, series string) string {
	run := union([]string{"^(" + strings.Join(baseTests, "|") + ")$/^(" + strings.Join(baseSubtests, "|") + ")",
		goLabelTests, threadCtxTests, offCPUTests})
	if arch == "arm64" {
		run = union([]string{run, goHeapTests})
	}
	switch {
	case !runsRuntimes(arch, series):
		return run
	case series == fullRuntimesKernel:
		return union(append([]string{run}, runtimeAll...))
	}
	return union(append([]string{run}, runtimeOne...))
}

// selects says whether go test -run pattern selects the (sub)test name as
// go test does: one of the pattern's alternatives (split at '|' outside
// brackets and parentheses) matches, level by level (split at '/'), the
// name's element at each level it has.
func selects(pattern, name string) bool {
	for _, alt := range splitTop(pattern, '|') {
		if selectsLevels(splitTop(alt, '/'), name) {
			return true
		}
	}
	return false
}

func selectsLevels(levels []string, name string) bool {
	for i, elem := range strings.Split(name, "/") {
		if i >= len(levels) {
			break
		}
		if re, err := regexp.Compile(levels[i]); err != nil || !re.MatchString(elem) {
			return false
		}
	}
	return true
}

// splitTop splits pattern at sep outside brackets and parentheses.
func splitTop(pattern string, sep rune) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range pattern {
		switch c {
		case '[', '(':
			depth++
		case ']', ')':
			depth--
		case sep:
			if depth == 0 {
				out = append(out, pattern[start:i])
				start = i + 1
			}
		}
	}
	return append(out, pattern[start:])
}

func main() {
	kernels := flag.String("kernels", "5.10,6.1,6.12,7.2", "kernel series to boot (comma-separated)")
	arches := flag.String("arch", "amd64,arm64", "architectures (comma-separated)")
	run := flag.String("run", "", "the tests to run in every VM (go test -run; default: each VM's selection, see runFor)")
	vmTimeout := flag.Duration("vm-timeout", 20*time.Minute, "longest one VM may run")
	parallel := flag.Int("parallel", 2, fmt.Sprintf("VMs without runtime tests (amd64; arm64 but %s and %s) run at once; those with them run alone (1 with -v)",
		runtimeOneKernel, fullRuntimesKernel))
	work := flag.String("work", "", "directory for the initramfs trees (default: a new temporary one, removed when all pass)")
	logs := flag.String("logs", "out/kernelmatrix", "directory for the VMs' serial logs (emptied first; kept, where the figures of passing runs are read)")
	verbose := flag.Bool("v", false, "print each VM's serial console as it runs")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kernelmatrix: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if *verbose || *parallel < 1 {
		*parallel = 1 // one serial console on stdout at a time
	}
	if err := matrix(*kernels, *arches, *run, *work, *logs, *vmTimeout, *parallel, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "kernelmatrix: %v\n", err)
		os.Exit(1)
	}
}

func matrix(kernels, arches, run, work, logs string, vmTimeout time.Duration, parallel int, verbose bool) error {
	start := time.Now()
	if _, err := os.Stat("go.mod"); err != nil {
		return errors.New("run from the repository's top directory")
	}
	keep := work != ""
	if !keep {
		var err error
		if work, err = os.MkdirTemp("", "kernelmatrix-"); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(logs); err != nil {
		return err
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	var jobs []vmJob
	for _, arch := range strings.Split(arches, ",") {
		tg, ok := targets[arch]
		if !ok {
			return fmt.Errorf("unknown architecture %q (want amd64 or arm64)", arch)
		}
		runs := map[string]string{}
		for _, series := range strings.Split(kernels, ",") {
			runs[series] = run
			if run == "" {
				runs[series] = runFor(arch, series)
			}
		}
		t0 := time.Now()
		vm, err := prepare(tg, filepath.Join(work, arch), slices.Collect(maps.Values(runs)))
		if err != nil {
			return fmt.Errorf("preparing the %s VM: %w", arch, err)
		}
		fmt.Printf("kernelmatrix: %s initramfs ready in %.1fs: %d tests prepared\n", arch, time.Since(t0).Seconds(), len(vm.prepared))
		for _, series := range strings.Split(kernels, ",") {
			jobs = append(jobs, vmJob{vm, series, runs[series], filepath.Join(logs, fmt.Sprintf("serial-%s-%s.log", series, arch)),
				runsRuntimes(arch, series)})
		}
	}
	results := runVMs(jobs, parallel, func(j vmJob) result {
		r := boot(j.vm, j.series, j.run, j.log, vmTimeout, verbose)
		fmt.Printf("kernelmatrix: %s %s: %s\n", j.series, j.vm.goarch, r.summary())
		return r
	})
	printTable(os.Stdout, results)
	fmt.Printf("\nkernelmatrix: %d VMs in %.0fs\n", len(results), time.Since(start).Seconds())
	failed := 0
	for _, r := range results {
		if !r.ok() {
			failed++
			r.printFailure(os.Stdout)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d kernels failed (serial logs in %s, initramfs trees in %s)", failed, len(results), logs, work)
	}
	if !keep {
		os.RemoveAll(work)
	}
	return nil
}

// vmJob is one VM to boot: a kernel series, the tests it runs and where
// its serial log goes. alone: no other VM runs beside it.
type vmJob struct {
	vm               *vm
	series, run, log string
	alone            bool
}

// runVMs boots the jobs' VMs and returns their results in the jobs'
// order: first those that run alone, one after another, then the others,
// parallel at a time, those with the most tests first so that the
// longest does not come last. A VM keeps about 1.2 of its 2 emulated
// CPUs' worth of host CPU busy (tests start processes one after
// another), so two at once on 2 cores take less wall time than one after
// the other; but each then runs slower, which skews the runtime tests'
// JIT workloads (JVMs whose top method was still interpreted after the
// warm-up: its clock reads took 6-10% of the samples, the chain 89.9% on
// arm64 5.10): VMs that run runtime tests run alone.
func runVMs(jobs []vmJob, parallel int, run func(vmJob) result) []result {
	var alone, rest []int
	for i, j := range jobs {
		if j.alone {
			alone = append(alone, i)
		} else {
			rest = append(rest, i)
		}
	}
	size := func(i int) int { return len(jobs[i].vm.expected(jobs[i].run)) }
	slices.SortStableFunc(rest, func(a, b int) int { return size(b) - size(a) })
	results := make([]result, len(jobs))
	for _, i := range alone {
		results[i] = run(jobs[i])
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, len(rest)) {
		wg.Go(func() {
			for i := range next {
				results[i] = run(jobs[i])
			}
		})
	}
	for _, i := range rest {
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}

// vm is an architecture's initramfs images, one per selection (each with
// the runtimes its tests run), and the tests prepared for it.
type vm struct {
	target
	initramfs map[string]string
	prepared  []string
}

// expected lists the prepared tests that run selects.
func (v *vm) expected(run string) []string {
	var out []string
	for _, name := range v.prepared {
		if selects(run, name) {
			out = append(out, name)
		}
	}
	return out
}

// union is a go test -run pattern that selects what any of runs selects:
// go test takes '|' at the top of a pattern as a choice between patterns,
// each split into levels of its own.
func union(runs []string) string {
	slices.Sort(runs)
	return strings.Join(slices.Compact(runs), "|")
}

// prepare builds dir/root (vminit, the test binary, the workloads and
// their libraries) for the tests that any of runs selects, and an
// initramfs for each of runs: that root and the runtimes its tests list
// (tests call vmTrees). The VM's command line says which tests it runs
// (vmtest.run, see vminit).
func prepare(tg target, dir string, runs []string) (*vm, error) {
	root := filepath.Join(dir, "root")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	cross := []string{"CGO_ENABLED=0", "GOARCH=" + tg.goarch}
	if _, err := command(cross, "go", "build", "-trimpath", "-o", filepath.Join(root, "init"), "./utils/kernelmatrix/vminit"); err != nil {
		return nil, err
	}
	if _, err := command(cross, "go", "test", "-c", "-trimpath", "-o", filepath.Join(root, "integration.test"), "./test/integration"); err != nil {
		return nil, err
	}
	// The tests' build steps, run here for the VM's architecture: each
	// test that gets to profiling skips there, and so is expected to pass
	// in the VM.
	workloads := filepath.Join(root, "workloads")
	if err := os.Mkdir(workloads, 0o755); err != nil {
		return nil, err
	}
	run := union(runs)
	out, err := command([]string{"EBPF_PROFILER_TEST_PREPARE=" + workloads, "EBPF_PROFILER_TEST_GOARCH=" + tg.goarch},
		"go", "test", "-count=1", "-v", "-run", run, "./test/integration")
	if err != nil {
		return nil, err
	}
	v := &vm{target: tg, initramfs: map[string]string{}, prepared: testResults(out)["SKIP"]}
	if len(v.prepared) == 0 {
		return nil, fmt.Errorf("-run %q selects no test that profiles", run)
	}
	if err := copySharedLibraries(tg, root, workloads); err != nil {
		return nil, err
	}
	trees, err := readTrees(filepath.Join(workloads, "trees"))
	if err != nil {
		return nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, err
	}
	args := []string{"/integration.test", "-test.v", "-test.count=1", "-test.timeout=" + (18 * time.Minute).String()}
	env := []string{
		"PATH=/", "HOME=/tmp", "TMPDIR=/tmp",
		"LD_LIBRARY_PATH=" + tg.guestLibDir,
		"EBPF_PROFILER_TEST_INTEGRATION=1",
		"EBPF_PROFILER_TEST_WORKLOADS=/workloads",
		// The runtimes' trees are where the fetch scripts put them here.
		"XDG_CACHE_HOME=" + cache,
	}
	for name, lines := range map[string][]string{"vmtest.args": args, "vmtest.env": env} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	base := filepath.Join(dir, "base.cpio.gz")
	if err := writeInitramfs(root, base); err != nil {
		return nil, err
	}
	for i, run := range runs {
		if v.initramfs[run] != "" {
			continue
		}
		extra := filepath.Join(dir, fmt.Sprintf("runtimes-%d", i))
		var paths []string
		for _, tr := range trees {
			if selects(run, tr.test) {
				paths = append(paths, tr.path)
			}
		}
		if err := copyTrees(tg, extra, paths); err != nil {
			return nil, err
		}
		img := filepath.Join(dir, fmt.Sprintf("initramfs-%d.cpio.gz", i))
		if err := writeArchive(extra, extra+".cpio.gz", false); err != nil {
			return nil, err
		}
		if err := concatenate(img, base, extra+".cpio.gz"); err != nil {
			return nil, err
		}
		v.initramfs[run] = img
	}
	return v, nil
}

// concatenate writes the files one after the other into out.
func concatenate(out string, files ...string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	for _, name := range files {
		in, err := os.Open(name)
		if err != nil {
			f.Close()
			return err
		}
		_, err = io.Copy(f, in)
		in.Close()
		if err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// command runs name with env added and returns its standard output; an
// error carries the output.
func command(env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

// testLineRe matches go test -v's result lines, subtests indented.
var testLineRe = regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL|SKIP): (\S+)`)

// testResults groups the tests in go test -v output by result.
func testResults(out []byte) map[string][]string {
	res := map[string][]string{}
	for _, m := range testLineRe.FindAllSubmatch(out, -1) {
		res[string(m[1])] = append(res[string(m[1])], string(m[2]))
	}
	return res
}

// fetchKernelMu serializes fetch-kernel.sh: the runs for one
// architecture share its private apt lists.
var fetchKernelMu sync.Mutex

// fetchKernel returns the path of a series' kernel for arch and the
// package it came from.
func fetchKernel(arch, series string) (path, pkg string, err error) {
	fetchKernelMu.Lock()
	defer fetchKernelMu.Unlock()
	out, err := command(nil, "utils/kernelmatrix/fetch-kernel.sh", arch, series)
	if err != nil {
		return "", "", err
	}
	path = strings.TrimSpace(string(out))
	b, _ := os.ReadFile(path + ".package")
	return path, strings.TrimSpace(string(b)), nil
}

// boot runs one VM and reads its serial console into a result.
func boot(v *vm, series, run, logPath string, timeout time.Duration, verbose bool) result {
	r := result{series: series, arch: v.goarch, log: logPath}
	t0 := time.Now()
	kernel, pkg, err := fetchKernel(v.goarch, series)
	r.fetch = time.Since(t0)
	if err != nil {
		r.err = err
		return r
	}
	r.pkg = pkg
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append(append([]string{}, v.qemu[1:]...),
		"-accel", "tcg,thread=multi", "-m", v.memory, "-smp", v.cpus,
		"-kernel", kernel, "-initrd", v.initramfs[run],
		// panic=-1 and -no-reboot end the VM at once should the kernel
		// panic (a broken initramfs, PID 1 exiting).
		// vmtest.run, a name with a dot, is left to vminit: the kernel
		// passes neither it to init's arguments nor its environment.
		"-append", "console="+v.console+" panic=-1 loglevel=4 vmtest.run="+run,
		"-nographic", "-no-reboot", "-monitor", "none", "-serial", "stdio", "-display", "none", "-nodefaults")
	cmd := exec.CommandContext(ctx, v.qemu[0], args...)
	logFile, err := os.Create(logPath)
	if err != nil {
		r.err = err
		return r
	}
	defer logFile.Close()
	var serial bytes.Buffer
	cmd.Stdout = &serial
	if verbose {
		cmd.Stdout = io.MultiWriter(&serial, os.Stdout)
	}
	cmd.Stderr = cmd.Stdout
	t1 := time.Now()
	err = cmd.Run()
	r.wall = time.Since(t1)
	logFile.Write(serial.Bytes())
	if ctx.Err() != nil {
		err = fmt.Errorf("the VM ran longer than %v", timeout)
	}
	r.parse(serial.Bytes(), v.expected(run))
	if err != nil && r.err == nil {
		r.err = err
	}
	return r
}

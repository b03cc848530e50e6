package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/cri"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// defaultOutputDir is where pprof files go when no collection agent is set.
const defaultOutputDir = "/var/lib/ebpf-profiler/pprof"

// defaultDebuginfodCache keeps debug files fetched from debuginfod.
const defaultDebuginfodCache = "/var/cache/ebpf-profiler/debuginfod"

// defaultSpoolDir keeps the profiles the collector could not take.
const defaultSpoolDir = "/var/lib/ebpf-profiler/spool"

// defaultDeltaCache keeps extracted stack deltas across restarts.
const defaultDeltaCache = "/var/cache/ebpf-profiler/stack-deltas"

// defaultInflateDir holds compressed debug sections, inflated, in unlinked
// files.
const defaultInflateDir = "/var/cache/ebpf-profiler/debuginfo-inflated"

// envPrefix names the environment variables that set flags:
// -collection-agent is EBPF_PROFILER_COLLECTION_AGENT. The command line wins
// over the environment.
const envPrefix = "EBPF_PROFILER_"

// testEnvPrefix is reserved for the test suite's own variables.
const testEnvPrefix = envPrefix + "TEST_"

// notFromEnv are the flags the environment does not set: -version is an
// action, not a setting (and EBPF_PROFILER_VERSION is a name deployments use
// for their own purposes), -v is -verbose's shorthand.
var notFromEnv = []string{"version", "v"}

// config is the validated command line.
type config struct {
	collectionAgent  string
	disableTLS       bool
	tlsCAFile        string
	tlsCertFile      string
	tlsKeyFile       string
	samplesPerSecond int
	reporterInterval time.Duration
	monitorInterval  time.Duration
	tracers          []string
	demangle         execinfo.DemangleMode
	debugDirs        []string
	// debugInfoMiB bounds the debug information kept open for source
	// lines; 0 turns lines off.
	debugInfoMiB int
	// debuginfodURLs are the debuginfod servers; none turns fetching off.
	debuginfodURLs  []string
	debuginfodCache string
	// deltaCache is where extracted stack deltas are kept on disk, at
	// most deltaCacheMiB; "" or 0 turns it off.
	deltaCache string
	// debugInfoInflateDir is where compressed debug sections are
	// inflated (processmanager.Config.DebugInfoInflateDir).
	debugInfoInflateDir string
	deltaCacheMiB       int
	// memoryLimitMiB is the Go runtime's soft memory limit; 0 leaves
	// it to GOMEMLIMIT (none by default).
	memoryLimitMiB int
	bpfLogLevel    uint
	mapScaleFactor uint
	// goLabels reads Go programs' goroutine labels into samples.
	goLabels bool
	// goHeapInterval is how often Go programs' heap profiles are read; 0
	// turns it off.
	goHeapInterval time.Duration
	// offCPU says which context switches are traced.
	offCPU tracer.OffCPUConfig
	// criSockets are asked for containers' Kubernetes names, kubeletRoot
	// read where none answers.
	criSockets     []string
	kubeletRoot    string
	verbose        bool
	version        bool
	outputDir      string
	maxOutputFiles int
	// spoolDir keeps the requests the collector could not take, at most
	// spoolMiB, replayed at spoolReplayMiB a second; "" turns it off.
	spoolDir       string
	spoolMiB       float64
	spoolReplayMiB float64
	pprofAddr      string
	// web is the -http web view's configuration; its addr "" turns it off.
	web webFlags
	// probabilisticThreshold is the percentage of probabilistic intervals
	// that sample; 100 samples always.
	probabilisticThreshold uint
	probabilisticInterval  time.Duration
	noKernelVersionCheck   bool
	// startupNice is the nice value the daemon starts at (when started
	// at 0); 0 or more turns the start-up boost off.
	startupNice int
	// warnings are problems with the environment that do not stop the
	// daemon, logged once logging is set up.
	warnings []string
}

// parseFlags parses and validates the command line and the environment
// (environ as os.Environ returns it); usage and errors go to out.
func parseFlags(args, environ []string, out io.Writer) (*config, error) {
	var c config
	var tracers, demangle, debugDirs, debuginfodURLs, criSockets string
	outputDirSet := false
	fs := flag.NewFlagSet("ebpf-profiler", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.collectionAgent, "collection-agent", "",
		"OTLP/gRPC endpoint (host:port) to push profiles to. Without it, profiles are written to -output-dir.")
	fs.BoolVar(&c.disableTLS, "disable-tls", false, "Talk to the collection agent without TLS.")
	fs.StringVar(&c.tlsCAFile, "tls-ca-file", "",
		"PEM file of the CA certificates that verify the collection agent, instead of the system's roots.")
	fs.StringVar(&c.tlsCertFile, "tls-cert-file", "",
		"PEM client certificate for mutual TLS with the collection agent (with -tls-key-file; re-read when it changes).")
	fs.StringVar(&c.tlsKeyFile, "tls-key-file", "", "PEM private key of -tls-cert-file.")
	fs.StringVar(&c.spoolDir, "spool-dir", defaultSpoolDir,
		"With -collection-agent: keep what the collector cannot take (down, refusing, too slow) here, to send when it is back, also after a restart (\"\" = drop it).")
	fs.Float64Var(&c.spoolMiB, "spool-mb", 256, "Most MiB kept in -spool-dir; beyond it the oldest profiles are dropped (counted).")
	fs.Float64Var(&c.spoolReplayMiB, "spool-replay-mb-per-second", 1,
		"Most MiB (compressed) a second sent from -spool-dir, so that a collector just back is not flooded; new profiles go first.")
	fs.IntVar(&c.samplesPerSecond, "samples-per-second", 20, "Samples per second per CPU (1-10000).")
	fs.DurationVar(&c.reporterInterval, "reporter-interval", 5*time.Second,
		"How often profiles are exported (1s-1h).")
	fs.DurationVar(&c.monitorInterval, "monitor-interval", time.Minute,
		"How often the daemon checks its own counters and logs one status line (1s-1h).")
	fs.StringVar(&tracers, "tracers", "all",
		"Comma-separated unwinders to enable: all, or any of "+strings.Join(interpreter.Names(), ", ")+
			" (native is always on; a runtime left out loads no BPF program).")
	fs.StringVar(&demangle, "demangle", "simplified",
		"How C++ and Rust symbol names are shown: simplified (no parameters or template arguments, as perf and "+
			"pprof show them), full, or none (as mangled). The mangled name is the OTLP function's system_name.")
	fs.StringVar(&debugDirs, "debug-dirs", strings.Join(processmanager.DefaultDebugDirs, ","),
		"Comma-separated directories searched for separate debug files of native code, by build id "+
			"(DIR/.build-id/xx/yyyy.debug) and by .gnu_debuglink (DIR/<file's directory>/NAME), as -dbgsym packages install them.")
	fs.IntVar(&c.debugInfoMiB, "debuginfo-cache-mb", processmanager.DefaultDebugInfoBytes>>20,
		"MiB of debug information (DWARF, Go pclntab) kept open to give native frames source lines and inlined "+
			"frames; least recently used files are closed first. 0 turns lines and inlined frames off.")
	fs.StringVar(&c.debugInfoInflateDir, "debuginfo-inflate-dir", defaultInflateDir,
		"Directory where compressed debug sections are inflated into unlinked files and mapped, so that they take "+
			"reclaimable page cache rather than the daemon's memory (\"\" or unusable: inflated in memory).")
	fs.StringVar(&debuginfodURLs, "debuginfod-urls", "",
		"Space- or comma-separated debuginfod servers (as DEBUGINFOD_URLS lists them) asked in the background for the "+
			"debug files of sampled native code that the host lacks, by build id. Off when empty.")
	fs.StringVar(&c.debuginfodCache, "debuginfod-cache", defaultDebuginfodCache,
		"Directory where files fetched from -debuginfod-urls are kept.")
	fs.StringVar(&c.deltaCache, "delta-cache", defaultDeltaCache,
		"Directory where extracted stack deltas are kept by file id, so that after a restart the deltas of large "+
			"libraries are ready (\"\" disables). Files that do not check out are removed with a warning.")
	fs.IntVar(&c.deltaCacheMiB, "delta-cache-mb", 256,
		"MiB the stack delta cache may hold; least recently used files go first. 0 disables it.")
	fs.IntVar(&c.memoryLimitMiB, "memory-limit-mb", 0,
		"Soft limit, in MiB, on the daemon's own memory (heap, stacks, runtime; not its mapped code or BPF maps): "+
			"near it the garbage collector runs more often, at most half the daemon's CPU. 0: GOMEMLIMIT's, or none.")
	fs.UintVar(&c.bpfLogLevel, "bpf-log-level", 0, "BPF verifier log level (0-2); logs are printed with -v.")
	fs.UintVar(&c.mapScaleFactor, "map-scale-factor", 0,
		fmt.Sprintf("Scaling factor for eBPF map sizes (0-%d): every increase by 1 doubles the maps of stack deltas "+
			"and process mappings. Increase if stack deltas fail to load for lack of room "+
			"(the status line's map fill levels). 0 holds 4M stack deltas, all maps taking about 18 MiB of kernel "+
			"memory; %d holds 1G in 4.3 GiB.",
			tracer.MaxMapScaleFactor, tracer.MaxMapScaleFactor))
	fs.StringVar(&criSockets, "cri-sockets", strings.Join(cri.DefaultSockets, ","),
		"Comma-separated container runtime (CRI) sockets; the first that serves is asked for the pod name, namespace "+
			"and container name of each container whose processes are sampled (\"\" disables).")
	fs.StringVar(&c.kubeletRoot, "kubelet-root", cri.DefaultKubeletRoot,
		"The kubelet's root directory, whose pod directories name containers where no -cri-sockets socket answers "+
			"(\"\" disables).")
	fs.BoolVar(&c.goLabels, "go-labels", true,
		"Read the pprof labels (pprof.Do, pprof.SetGoroutineLabels) of the goroutine each sample of a Go program "+
			"ran, and put them on the sample (at most 10, keys cut to 16 bytes, values to 48).")
	fs.DurationVar(&c.goHeapInterval, "go-heap-interval", 60*time.Second,
		"How often the heap profile every profiled Go program keeps of itself (its /debug/pprof/heap) is read "+
			"from its memory and reported: allocated and in-use objects and bytes per allocating stack. 0 turns it off.")
	fs.Float64Var(&c.offCPU.Threshold, "off-cpu-threshold", 0,
		"Off-CPU profiling: the share of context switches (0-1) at which the thread leaving the CPU has its stack "+
			"unwound, to report how long it waited there. 0 (the default) turns it off.")
	fs.DurationVar(&c.offCPU.MinWait, "off-cpu-min-wait", 0,
		"Off-CPU profiling: waits shorter than this are not reported.")
	fs.Func("off-cpu-per-second", fmt.Sprintf("Off-CPU profiling: at most this many context switches are unwound "+
		"per CPU and second, whatever the threshold (default %d).", tracer.DefaultOffCPUPerSecond), func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("want a positive number, got %q", v)
		}
		c.offCPU.PerSecond = uint32(n)
		return nil
	})
	fs.BoolVar(&c.verbose, "verbose", false, "Log debug messages.")
	fs.BoolVar(&c.verbose, "v", false, "Shorthand for -verbose.")
	fs.BoolVar(&c.version, "version", false, "Print the version and exit.")
	fs.StringVar(&c.outputDir, "output-dir", defaultOutputDir,
		"Directory for gzipped pprof files, one per reporter interval (default only without -collection-agent; \"\" disables).")
	fs.IntVar(&c.maxOutputFiles, "max-output-files", 720, "Most pprof files kept in -output-dir; older ones are deleted (0 = keep all).")
	fs.StringVar(&c.pprofAddr, "pprof", "", "Serve the daemon's own Go pprof data on this address (e.g. localhost:6060).")
	c.web.register(fs)
	fs.UintVar(&c.probabilisticThreshold, "probabilistic-threshold", 100,
		"Probabilistic profiling (1-99): every -probabilistic-interval a number from 0 to 99 is drawn, "+
			"and the host is sampled for that interval when it is below the threshold. 100 samples always.")
	fs.DurationVar(&c.probabilisticInterval, "probabilistic-interval", time.Minute,
		"How long each probabilistic decision holds (1s-24h).")
	fs.IntVar(&c.startupNice, "startup-nice", -20,
		"Scheduling priority (nice value, -20 to 0) the daemon starts at, when started at the default priority, "+
			"until its first profile is out and the stack deltas of the processes it found are loaded: on a saturated "+
			"host its start-up then takes seconds, not tens of seconds. 0 turns this off; needs root or CAP_SYS_NICE.")
	fs.BoolVar(&c.noKernelVersionCheck, "no-kernel-version-check", false,
		fmt.Sprintf("Start on kernels older than %s (e.g. with BPF features backported); loading may still fail.",
			tracer.MinKernel))
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage of ebpf-profiler (every flag but -version and -v can also be set as %sNAME, "+
			"e.g. %sCOLLECTION_AGENT):\n", envPrefix, envPrefix)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (all options are flags)", fs.Arg(0))
	}
	var err error
	if c.warnings, err = setFromEnv(fs, environ); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { outputDirSet = outputDirSet || f.Name == "output-dir" })
	if c.collectionAgent != "" && !outputDirSet {
		c.outputDir = ""
	}
	if c.tracers, err = parseTracers(tracers); err != nil {
		return nil, err
	}
	if c.demangle, err = execinfo.ParseDemangleMode(demangle); err != nil {
		return nil, fmt.Errorf("-demangle: %w", err)
	}
	c.debuginfodURLs = strings.FieldsFunc(debuginfodURLs, func(r rune) bool { return r == ',' || r == ' ' })
	for _, d := range strings.Split(debugDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			c.debugDirs = append(c.debugDirs, d)
		}
	}
	for _, s := range strings.Split(criSockets, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.criSockets = append(c.criSockets, s)
		}
	}
	return &c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if c.collectionAgent != "" {
		if err := reporter.CheckEndpoint(c.collectionAgent); err != nil {
			errs = append(errs, fmt.Errorf("-collection-agent: %w", err))
		}
	}
	errs = append(errs, c.web.validate()...)
	if c.pprofAddr != "" {
		if _, _, err := net.SplitHostPort(c.pprofAddr); err != nil {
			errs = append(errs, fmt.Errorf("-pprof=%q: want host:port", c.pprofAddr))
		}
	}
	if c.memoryLimitMiB < 0 || c.memoryLimitMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("-memory-limit-mb=%d: want 0 (none) to %d", c.memoryLimitMiB, 1<<20))
	}
	if !(c.spoolMiB >= 0.01 && c.spoolMiB <= 1<<20) {
		errs = append(errs, fmt.Errorf("-spool-mb=%g: want 0.01 to %d (-spool-dir=\"\" turns the spool off)", c.spoolMiB, 1<<20))
	}
	if !(c.spoolReplayMiB > 0) {
		errs = append(errs, fmt.Errorf("-spool-replay-mb-per-second=%g: want more than 0", c.spoolReplayMiB))
	}
	if c.deltaCacheMiB < 0 {
		errs = append(errs, fmt.Errorf("-delta-cache-mb=%d: want 0 or more", c.deltaCacheMiB))
	}
	if c.startupNice < -20 || c.startupNice > 0 {
		errs = append(errs, fmt.Errorf("-startup-nice=%d: want -20 to 0", c.startupNice))
	}
	if c.samplesPerSecond < 1 || c.samplesPerSecond > 10000 {
		errs = append(errs, fmt.Errorf("-samples-per-second=%d: want 1 to 10000", c.samplesPerSecond))
	}
	for _, iv := range []struct {
		name string
		d    time.Duration
	}{{"reporter-interval", c.reporterInterval}, {"monitor-interval", c.monitorInterval}} {
		if iv.d < time.Second || iv.d > time.Hour {
			errs = append(errs, fmt.Errorf("-%s=%v: want 1s to 1h", iv.name, iv.d))
		}
	}
	if c.bpfLogLevel > 2 {
		errs = append(errs, fmt.Errorf("-bpf-log-level=%d: want 0, 1 or 2", c.bpfLogLevel))
	}
	if c.mapScaleFactor > tracer.MaxMapScaleFactor {
		errs = append(errs, fmt.Errorf("-map-scale-factor=%d: want 0 to %d", c.mapScaleFactor, tracer.MaxMapScaleFactor))
	}
	if c.debugInfoMiB < 0 || c.debugInfoMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("-debuginfo-cache-mb=%d: want 0 (off) to %d", c.debugInfoMiB, 1<<20))
	}
	if c.maxOutputFiles < 0 {
		errs = append(errs, fmt.Errorf("-max-output-files=%d: want 0 or more", c.maxOutputFiles))
	}
	if c.tlsCAFile != "" || c.tlsCertFile != "" || c.tlsKeyFile != "" {
		if c.collectionAgent == "" || c.disableTLS {
			errs = append(errs, errors.New("-tls-ca-file, -tls-cert-file and -tls-key-file need -collection-agent, with TLS"))
		}
		if (c.tlsCertFile == "") != (c.tlsKeyFile == "") {
			errs = append(errs, errors.New("-tls-cert-file and -tls-key-file go together"))
		}
	}
	if err := c.offCPU.Validate(); err != nil {
		return err
	}
	if c.goHeapInterval != 0 && c.goHeapInterval < time.Second {
		errs = append(errs, fmt.Errorf("-go-heap-interval=%v: want 0 (off) or 1s or more", c.goHeapInterval))
	}
	if c.probabilisticThreshold < 1 || c.probabilisticThreshold > 100 {
		errs = append(errs, fmt.Errorf("-probabilistic-threshold=%d: want 1 to 99, or 100 to always sample",
			c.probabilisticThreshold))
	}
	if c.probabilisticInterval < time.Second || c.probabilisticInterval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("-probabilistic-interval=%v: want 1s to 24h", c.probabilisticInterval))
	}
	if c.collectionAgent == "" && c.outputDir == "" && c.web.addr == "" {
		errs = append(errs, errors.New("nothing to report to: set -collection-agent, -output-dir or -http"))
	}
	return errors.Join(errs...)
}

// parseTracers returns the unwinders -tracers enables, by name: native and
// the runtimes of the registry it chooses.
func parseTracers(s string) ([]string, error) {
	var names []string
	for _, name := range strings.Split(s, ",") {
		names = append(names, strings.TrimSpace(name))
	}
	rts, err := interpreter.Select(names)
	if err != nil {
		return nil, fmt.Errorf("-tracers: %w", err)
	}
	out := []string{interpreter.NativeName}
	for _, rt := range rts {
		out = append(out, rt.Name)
	}
	slices.Sort(out)
	return out, nil
}

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// setFromEnv sets each flag the command line left alone from its
// environment variable. A value that does not parse is an error naming the
// variable; a variable with our prefix that names no flag (a typo, most
// likely) is returned as a warning.
func setFromEnv(fs *flag.FlagSet, environ []string) (warnings []string, err error) {
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	byEnv := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(notFromEnv, f.Name) {
			byEnv[envName(f.Name)] = f
		}
	})
	var errs []error
	for _, kv := range environ {
		key, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(key, envPrefix) || strings.HasPrefix(key, testEnvPrefix) {
			continue
		}
		f, ok := byEnv[key]
		switch {
		case !ok:
			warnings = append(warnings, fmt.Sprintf("Ignoring %s: no flag -%s (see -help)", key,
				strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(key, envPrefix), "_", "-"))))
		case onCommandLine[f.Name]:
			warnings = append(warnings, fmt.Sprintf("Ignoring %s: -%s is on the command line", key, f.Name))
		default:
			if err := fs.Set(f.Name, value); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, value, err))
			}
		}
	}
	return warnings, errors.Join(errs...)
}

// Command ebpf-profiler samples every CPU of this host with eBPF, unwinds
// each interrupted stack and reports the traces as OTLP profiles to a
// collector or, with no collector, as pprof files in a local directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof" // for -pprof
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/interpreter"
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
	"github.com/hostprof/ebpf-profiler/processmanager/unwindmaps"
	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracecorr"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// correlationFlush is how often APM agents are sent the stack-trace ids of
// their transactions' samples.
const correlationFlush = 400 * time.Millisecond

// version and commit are set at build time (-ldflags "-X main.version=...
// -X main.commit=..."); without them, commit comes from the VCS stamp Go
// puts in the binary.
var (
	version = "dev"
	commit  = ""
)

// Exit codes: 0 on success and after a signal, 1 when profiling cannot
// start, 2 for a bad command line.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	// The daemon's live heap is small and steady; collecting at 50% growth
	// instead of 100% trims resident memory for little CPU.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := parseFlags(args, os.Environ(), os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ebpf-profiler: %v\n", err)
		return exitUsage
	}
	if cfg.version {
		fmt.Println(versionLine())
		return 0
	}
	// Milliseconds: start-up and export timing are read from the log.
	log.SetFormatter(&log.TextFormatter{FullTimestamp: true, TimestampFormat: "2006-01-02T15:04:05.000Z07:00"})
	if cfg.verbose {
		log.SetLevel(log.DebugLevel)
	}
	for _, w := range cfg.warnings {
		log.Warn(w)
	}

	if cfg.pprofAddr != "" {
		go servePprof(cfg.pprofAddr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := profile(ctx, cfg); err != nil {
		log.Error(err)
		return exitFailure
	}
	return 0
}

// profile runs until ctx is cancelled, then flushes the last interval.
func profile(ctx context.Context, cfg *config) error {
	start := time.Now()
	log.Infof("Starting %s", versionLine())
	boost := boostPriority(cfg.startupNice)
	if cfg.memoryLimitMiB > 0 {
		debug.SetMemoryLimit(int64(cfg.memoryLimitMiB) << 20)
	}
	endStartupLimit := limitStartupMemory()
	release := tracer.KernelRelease()
	if err := checkKernel(release, cfg.noKernelVersionCheck); err != nil {
		return err
	}

	// The processes busy while the BPF programs load are set up before
	// sampling starts (processmanager.PrepareBusy).
	cpuBefore := processmanager.ReadCPUTimes("")
	runtimes, err := interpreter.Select(cfg.tracers)
	if err != nil {
		return err
	}
	tr, err := tracer.New(tracer.Config{
		SamplesPerSecond: cfg.samplesPerSecond,
		OffCPU:           cfg.offCPU,
		BPFLogLevel:      uint32(cfg.bpfLogLevel),
		MapScaleFactor:   cfg.mapScaleFactor,
		Runtimes:         runtimes,
	})
	if err != nil {
		return err
	}
	defer tr.Close()
	log.Infof("Unwinders: %s", strings.Join(cfg.tracers, ", "))
	warnMissingCapabilities(release)

	hostID, hostName, err := reporter.HostMetadata()
	if err != nil {
		log.Warnf("Host metadata incomplete: %v", err)
	}
	hist, err := cfg.web.newHistory()
	if err != nil {
		return err
	}
	rep, err := reporter.New(reporter.Config{
		CollectionAgent:  cfg.collectionAgent,
		DisableTLS:       cfg.disableTLS,
		CAFile:           cfg.tlsCAFile,
		ClientCertFile:   cfg.tlsCertFile,
		ClientKeyFile:    cfg.tlsKeyFile,
		Interval:         cfg.reporterInterval,
		SamplesPerSecond: cfg.samplesPerSecond,
		OutputDir:        cfg.outputDir,
		MaxOutputFiles:   outputFilesLimit(cfg.maxOutputFiles),
		SpoolDir:         spoolDir(cfg),
		SpoolBytes:       int64(cfg.spoolMiB * (1 << 20)),
		// The flag's MiB a second.
		SpoolReplayBytesPerSecond: cfg.spoolReplayMiB * (1 << 20),
		TopN:                      topN(cfg),
		HostID:                    hostID,
		HostName:                  hostName,
		Version:                   version,
		History:                   hist,
	})
	if err != nil {
		return err
	}
	web, err := cfg.web.start(hist, cfg, hostName)
	if err != nil {
		return err
	}
	if web != nil {
		defer web.Close()
	}
	// Agents hold ended transactions for samples-delay-ms: announce the
	// longest a sample's trace waits in BPF's ring buffer, plus two flushes.
	corr := tracecorr.New(tracecorr.Config{
		HostID:        hostID,
		FlushInterval: correlationFlush,
		SamplesDelay:  tracer.TraceWakeupLatency + 2*correlationFlush,
	})
	var dfd *debuginfo.Debuginfod
	if len(cfg.debuginfodURLs) > 0 {
		dfd, err = debuginfo.NewDebuginfod(debuginfo.DebuginfodOptions{
			URLs: cfg.debuginfodURLs, Dir: cfg.debuginfodCache, MaxBytes: 4 << 30,
			Timeout: 2 * time.Minute, RetryAfter: time.Hour, Parallel: 2,
		})
		if err != nil {
			return err
		}
	}
	pm, err := processmanager.New(processmanager.Config{Unwinding: unwinding(tr, deltaCache(cfg), cfg.goLabels), Correlator: corr,
		CRISockets: cfg.criSockets, KubeletRoot: cfg.kubeletRoot, Runtimes: runtimes,
		Demangle: cfg.demangle, DebugDirs: cfg.debugDirs, DebugInfoBytes: debugInfoBytes(cfg.debugInfoMiB),
		DebugInfoInflateDir: inflateDir(cfg), Debuginfod: dfd})
	if err != nil {
		return err
	}
	defer pm.Close()
	handler, err := processmanager.NewHandler(pm, rep, 0)
	if err != nil {
		return err
	}

	prob := newProbabilistic(cfg.probabilisticThreshold, cfg.probabilisticInterval, tr)
	if prob.enabled() {
		log.Infof("Probabilistic profiling: sampling %d%% of %v intervals", prob.threshold, prob.interval)
		prob.decide()
		probTicker := time.NewTicker(prob.interval)
		defer probTicker.Stop()
		probCtx, stopProb := context.WithCancel(ctx)
		defer stopProb()
		go prob.run(probCtx, probTicker.C)
	}
	prepareBusy(ctx, pm, cpuBefore)
	// Started as sampling starts, the reporter's first interval holds its
	// first FirstInterval of samples. Not ctx: on a signal an export in
	// flight must finish, and Close flushes what is left.
	if err := rep.Start(context.Background()); err != nil {
		return err
	}
	if err := tr.Attach(); err != nil {
		rep.Close()
		return err
	}
	corr.Start()
	describeOutputs(cfg)

	pumpCtx, stopPump := context.WithCancel(context.Background())
	pumpDone := make(chan error, 1)
	go func() { pumpDone <- tr.Run(pumpCtx, handler) }()

	startupCtx, endStartup := context.WithCancel(ctx)
	defer endStartup()
	go func() {
		// Start-up is over once the first profile is out and the stack
		// deltas of the processes found are loaded.
		over := waitStartup(startupCtx, func() bool { return rep.Stats().Intervals > 0 && pm.Stats().UnwindQueue == 0 })
		boost.end()
		endStartupLimit()
		if over {
			releaseStartupMemory()
			// Debug information mapped for source lines: pages that
			// lookups touched once stay out of the resident set.
			returnIdleHeap(startupCtx, pm.DropMappedDebugInfo)
		}
	}()
	mon := newMonitor(tr, handler, pm, rep, corr, prob, hist)
	stopHeaps := func() {}
	if cfg.goHeapInterval > 0 {
		heaps := goheap.NewReader()
		defer heaps.Close()
		heapCtx, cancel := context.WithCancel(ctx)
		heapsDone := make(chan struct{})
		go func() { runGoHeaps(heapCtx, cfg.goHeapInterval, heaps, pm, rep); close(heapsDone) }()
		stopHeaps = func() { cancel(); <-heapsDone }
		defer stopHeaps()
		mon.heaps = heaps
	}
	log.Debugf("Start-up took %v", time.Since(start).Round(time.Millisecond))
	// Loading parsed the kernel's BTF, tens of MiB of garbage by now: hand
	// it back to the OS rather than wait for the scavenger.
	debug.FreeOSMemory()
	ticker := time.NewTicker(cfg.monitorInterval)
	defer ticker.Stop()
	var pumpErr error
	pumpFinished := false
loop:
	for {
		select {
		case <-ctx.Done():
			log.Info("Stopping: flushing the last interval")
			break loop
		case pumpErr = <-pumpDone:
			pumpFinished = true
			break loop
		case <-ticker.C:
			mon.check()
		}
	}

	// Stop sampling first, then drain what BPF already emitted, then flush.
	tr.Detach()
	stopPump()
	if !pumpFinished {
		pumpErr = <-pumpDone
	}
	// The traces that waited for their process's set-up.
	handler.Close()
	stopHeaps()
	corr.Close()
	if err := rep.Close(); err != nil {
		log.Warnf("Flushing the last interval: %v", err)
	}
	mon.check()
	mon.summary()
	if pumpErr != nil {
		return fmt.Errorf("reading BPF events: %w", pumpErr)
	}
	return nil
}

// maxStartupPreparation bounds the set-up of the busy processes before
// sampling starts: those left are set up at their first samples.
const maxStartupPreparation = 10 * time.Second

// prepareBusy sets up the processes busy since cpuBefore, so that their
// stacks are complete from the first sample.
func prepareBusy(ctx context.Context, pm *processmanager.Manager, cpuBefore processmanager.CPUTimes) {
	prepCtx, cancel := context.WithTimeout(ctx, maxStartupPreparation)
	defer cancel()
	p := pm.PrepareBusy(prepCtx, cpuBefore)
	msg := "Set up %d of %d busy processes in %v before sampling"
	if !p.Complete {
		msg += " (stack deltas still loading)"
	}
	log.Infof(msg, p.Prepared, p.Busy, p.Took.Round(time.Millisecond))
}

// checkKernel refuses a kernel older than we support, unless the operator
// overrode the check (then it only warns).
func checkKernel(release string, override bool) error {
	err := tracer.CheckKernelVersion(release)
	switch {
	case err == nil:
		return nil
	case override:
		log.Warnf("%v; starting anyway (-no-kernel-version-check)", err)
		return nil
	default:
		return fmt.Errorf("%w, or pass -no-kernel-version-check to try anyway", err)
	}
}

// versionLine names this build: version, commit and the BPF object's hash,
// which together say exactly what runs.
func versionLine() string {
	return fmt.Sprintf("ebpf-profiler %s (commit %s, BPF object sha256:%s, %s, %s/%s)",
		version, buildCommit(), support.ObjectHash(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// buildCommit is the commit set at build time, or else the one Go stamped,
// marked "-dirty" when the tree had changes.
func buildCommit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", ""
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	return rev + dirty
}

// servePprof serves the daemon's own profiles for debugging its overhead.
func servePprof(addr string) {
	log.Infof("Serving Go pprof data on http://%s/debug/pprof/", addr)
	if err := http.ListenAndServe(addr, nil); err != nil {
		log.Warnf("pprof server: %v", err)
	}
}

// unwinding connects the process manager to the native unwinder's maps.
func unwinding(tr *tracer.Tracer, cache *unwindmaps.DeltaCache, goLabels bool) *unwindmaps.Unwinding {
	u := &unwindmaps.Unwinding{
		Maps: tr, Capacity: tr.DeltaCapacity(), Extract: nativeunwind.ExtractReader, Runtimes: tr, APM: tr,
		ThreadCtx: tr, ReadAtFirstSample: tr.ResolvesUnread(), Tracked: tr, Cache: cache,
	}
	if goLabels {
		u.GoLabels = tr
	}
	return u
}

// deltaCache opens the on-disk stack delta cache, or returns nil (none)
// when it is off or cannot be used: the daemon works without it.
func deltaCache(cfg *config) *unwindmaps.DeltaCache {
	if cfg.deltaCache == "" || cfg.deltaCacheMiB == 0 {
		return nil
	}
	c, err := unwindmaps.OpenDeltaCache(cfg.deltaCache, int64(cfg.deltaCacheMiB)<<20, log.StandardLogger())
	if err != nil {
		log.Warnf("Not caching stack deltas on disk: %v", err)
		return nil
	}
	return c
}

// topN logs the per-interval summary only in the local default, where the
// log is the first place a user looks.
func topN(cfg *config) int {
	if cfg.collectionAgent == "" {
		return 10
	}
	return 0
}

// spoolDir is -spool-dir where it applies: with a collection agent.
func spoolDir(cfg *config) string {
	if cfg.collectionAgent == "" {
		return ""
	}
	return cfg.spoolDir
}

// outputFilesLimit maps the flag's 0 (keep all) to the reporter's negative.
func outputFilesLimit(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

func describeOutputs(cfg *config) {
	if cfg.collectionAgent != "" {
		tls := "TLS"
		if cfg.disableTLS {
			tls = "plain text"
		}
		log.Infof("Exporting OTLP profiles to %s (%s) every %v", cfg.collectionAgent, tls, cfg.reporterInterval)
		if dir := spoolDir(cfg); dir != "" {
			log.Infof("Keeping what the collector cannot take in %s (at most %g MiB; replayed at %g MiB/s)",
				dir, cfg.spoolMiB, cfg.spoolReplayMiB)
		}
	}
	if cfg.outputDir != "" {
		log.Infof("Writing a pprof file to %s every %v (open with: go tool pprof -http=: FILE)",
			cfg.outputDir, cfg.reporterInterval)
	}
}

// inflateDir makes -debuginfo-inflate-dir (owner only) and returns it, or
// "" (inflate in memory) when it is off or cannot be made.
func inflateDir(cfg *config) string {
	if cfg.debugInfoInflateDir == "" || cfg.debugInfoMiB == 0 {
		return ""
	}
	if err := os.MkdirAll(cfg.debugInfoInflateDir, 0o700); err != nil {
		log.Warnf("Inflating compressed debug sections in memory: %v", err)
		return ""
	}
	return cfg.debugInfoInflateDir
}

// debugInfoBytes is the processmanager bound for -debuginfo-cache-mb: 0
// there turns lines off, which processmanager spells negative.
func debugInfoBytes(mib int) int64 {
	if mib == 0 {
		return -1
	}
	return int64(mib) << 20
}

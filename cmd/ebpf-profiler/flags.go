package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// defaultOutputDir is where pprof files go when no collection agent is set.
const defaultOutputDir = "/var/lib/ebpf-profiler/pprof"

// config is the validated command line.
type config struct {
	collectionAgent  string
	disableTLS       bool
	samplesPerSecond int
	reporterInterval time.Duration
	monitorInterval  time.Duration
	tracers          []string
	bpfLogLevel      uint
	mapScaleFactor   uint
	verbose          bool
	version          bool
	outputDir        string
	maxOutputFiles   int
	pprofAddr        string
}

// knownTracers are the values -tracers accepts. Interpreter unwinders join
// this list as they are implemented.
var knownTracers = []string{"native"}

// parseFlags parses and validates the command line; usage and errors go to
// out.
func parseFlags(args []string, out io.Writer) (*config, error) {
	var c config
	var tracers string
	outputDirSet := false
	fs := flag.NewFlagSet("ebpf-profiler", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.collectionAgent, "collection-agent", "",
		"OTLP/gRPC endpoint (host:port) to push profiles to. Without it, profiles are written to -output-dir.")
	fs.BoolVar(&c.disableTLS, "disable-tls", false, "Talk to the collection agent without TLS.")
	fs.IntVar(&c.samplesPerSecond, "samples-per-second", 20, "Samples per second per CPU (1-10000).")
	fs.DurationVar(&c.reporterInterval, "reporter-interval", 5*time.Second,
		"How often profiles are exported (1s-1h).")
	fs.DurationVar(&c.monitorInterval, "monitor-interval", 5*time.Second,
		"How often internal counters are checked and logged (1s-1h).")
	fs.StringVar(&tracers, "tracers", "all",
		"Comma-separated unwinders to enable: all, or any of "+strings.Join(knownTracers, ", ")+".")
	fs.UintVar(&c.bpfLogLevel, "bpf-log-level", 0, "BPF verifier log level (0-2); logs are printed with -v.")
	fs.UintVar(&c.mapScaleFactor, "map-scale-factor", 0,
		fmt.Sprintf("Scaling factor for eBPF map sizes (0-%d): every increase by 1 doubles the maps of stack deltas "+
			"and process mappings. Increase if stack deltas fail to load for lack of room. "+
			"0 holds about 1M stack deltas in 8 MiB of kernel memory; %d holds 256M in 2 GiB.",
			tracer.MaxMapScaleFactor, tracer.MaxMapScaleFactor))
	fs.BoolVar(&c.verbose, "verbose", false, "Log debug messages.")
	fs.BoolVar(&c.verbose, "v", false, "Shorthand for -verbose.")
	fs.BoolVar(&c.version, "version", false, "Print the version and exit.")
	fs.StringVar(&c.outputDir, "output-dir", defaultOutputDir,
		"Directory for gzipped pprof files, one per reporter interval (default only without -collection-agent; \"\" disables).")
	fs.IntVar(&c.maxOutputFiles, "max-output-files", 720, "Most pprof files kept in -output-dir; older ones are deleted (0 = keep all).")
	fs.StringVar(&c.pprofAddr, "pprof", "", "Serve the daemon's own Go pprof data on this address (e.g. localhost:6060).")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (all options are flags)", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { outputDirSet = outputDirSet || f.Name == "output-dir" })
	if c.collectionAgent != "" && !outputDirSet {
		c.outputDir = ""
	}
	var err error
	if c.tracers, err = parseTracers(tracers); err != nil {
		return nil, err
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
	if c.pprofAddr != "" {
		if _, _, err := net.SplitHostPort(c.pprofAddr); err != nil {
			errs = append(errs, fmt.Errorf("-pprof=%q: want host:port", c.pprofAddr))
		}
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
	if c.maxOutputFiles < 0 {
		errs = append(errs, fmt.Errorf("-max-output-files=%d: want 0 or more", c.maxOutputFiles))
	}
	if c.collectionAgent == "" && c.outputDir == "" {
		errs = append(errs, errors.New("nothing to report to: set -collection-agent or -output-dir"))
	}
	return errors.Join(errs...)
}

func parseTracers(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "all":
			out = append(out, knownTracers...)
		case slices.Contains(knownTracers, name):
			out = append(out, name)
		default:
			return nil, fmt.Errorf("-tracers: unknown tracer %q (known: all, %s)", name, strings.Join(knownTracers, ", "))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

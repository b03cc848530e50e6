package reporter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/pprof/profile"
	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/reporter/spool"
)

// Stats are the reporter's counters since New.
type Stats struct {
	// SamplesReceived counts ReportSample calls.
	SamplesReceived uint64
	// SamplesDropped counts samples not kept: nil trace or metadata, or the
	// interval already held MaxSamplesPerInterval samples.
	SamplesDropped uint64
	// Intervals counts intervals that had samples or heap profiles and were
	// reported.
	Intervals uint64
	// SamplesExported counts samples in requests the collector accepted
	// (including any in profiles it reported as rejected, which OTLP does
	// not identify; see ProfilesRejected).
	SamplesExported uint64
	// RequestsExported counts requests the collector accepted.
	RequestsExported uint64
	// ExportErrors counts failed export attempts, retries included.
	ExportErrors uint64
	// RequestsDropped counts requests never delivered: pushed out of the
	// full queue (without a spool), rejected with a permanent error, unsent
	// at Close (without a spool), not written to the spool, or lost in it
	// (Spool.Dropped and Spool.Torn).
	RequestsDropped uint64
	// IntervalsMerged counts intervals merged into the one before while it
	// waited (a slow or absent collector).
	IntervalsMerged uint64
	// RequestsReplayed counts spooled requests the collector accepted.
	RequestsReplayed uint64
	// Spool is the spool's counters and contents (zero without one).
	Spool spool.Stats
	// ProfilesRejected sums partial_success.rejected_profiles.
	ProfilesRejected uint64
	// PprofFilesWritten, PprofFilesRemoved and PprofErrors count local files
	// written, pruned beyond MaxOutputFiles, and failures writing or pruning.
	PprofFilesWritten, PprofFilesRemoved, PprofErrors uint64
	// HeapProfilesReceived counts ReportHeap calls; HeapProfilesDropped
	// the profiles not kept (nil, or over the interval's limit).
	HeapProfilesReceived, HeapProfilesDropped uint64
}

// counters is the live, concurrently updated form of Stats.
type counters struct {
	samplesReceived, samplesDropped, intervals        atomic.Uint64
	samplesExported, requestsExported, exportErrors   atomic.Uint64
	requestsDropped, profilesRejected                 atomic.Uint64
	intervalsMerged, requestsReplayed                 atomic.Uint64
	pprofFilesWritten, pprofFilesRemoved, pprofErrors atomic.Uint64
	heapProfilesReceived, heapProfilesDropped         atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		SamplesReceived:   c.samplesReceived.Load(),
		SamplesDropped:    c.samplesDropped.Load(),
		Intervals:         c.intervals.Load(),
		SamplesExported:   c.samplesExported.Load(),
		RequestsExported:  c.requestsExported.Load(),
		ExportErrors:      c.exportErrors.Load(),
		RequestsDropped:   c.requestsDropped.Load(),
		IntervalsMerged:   c.intervalsMerged.Load(),
		RequestsReplayed:  c.requestsReplayed.Load(),
		ProfilesRejected:  c.profilesRejected.Load(),
		PprofFilesWritten: c.pprofFilesWritten.Load(),
		PprofFilesRemoved: c.pprofFilesRemoved.Load(),
		PprofErrors:       c.pprofErrors.Load(),

		HeapProfilesReceived: c.heapProfilesReceived.Load(),
		HeapProfilesDropped:  c.heapProfilesDropped.Load(),
	}
}

// Reporter counts samples per interval and exports each interval. Create it
// with New, feed it with ReportSample, run it with Start and stop it with
// Close.
type Reporter struct {
	cfg   Config
	opts  buildOptions
	agg   *aggregator
	exp   *exporter // nil without a collection agent
	stats counters
	log   *logrus.Entry

	// localFailing is set while local output fails (the ticker's).
	localFailing bool

	mu         sync.Mutex // guards the lifecycle fields below
	started    bool
	closed     bool
	stopTicker context.CancelFunc
	tickerDone chan struct{}
	// stopExport asks the export goroutine to stop after its current
	// attempt; abortExport cancels that attempt.
	stopExport  chan struct{}
	abortExport context.CancelFunc
	exportDone  chan struct{}
}

// New validates cfg and prepares a reporter. It checks that OutputDir can be
// written (creating it if needed) but does not contact the collector: gRPC
// connects on the first export, so a collector that is down at startup only
// delays data.
func New(cfg Config) (*Reporter, error) {
	return newReporter(cfg, defaultRetryPolicy(), logrus.NewEntry(logrus.StandardLogger()))
}

func newReporter(cfg Config, policy retryPolicy, log *logrus.Entry) (*Reporter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.OutputDir != "" {
		if err := ensureWritableDir(cfg.OutputDir); err != nil {
			return nil, fmt.Errorf("invalid reporter config: %w", err)
		}
	}
	r := &Reporter{
		cfg: cfg,
		opts: buildOptions{
			hostID:   cfg.HostID,
			hostName: cfg.HostName,
			version:  cfg.Version,
			period:   cfg.period(),
		},
		agg: newAggregator(time.Now(), cfg.MaxSamplesPerInterval),
		log: log,
	}
	if cfg.CollectionAgent != "" {
		r.exp, err = newExporter(cfg, policy, r.opts, &r.stats, log)
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ReportSample counts one sample of trace t. It is called for every sample,
// so it only appends a timestamp under a short mutex and never blocks on I/O.
// t is shared and must not be modified afterwards.
func (r *Reporter) ReportSample(t *libpf.Trace, meta *libpf.SampleMeta) {
	r.stats.samplesReceived.Add(1)
	if t == nil || meta == nil {
		r.stats.samplesDropped.Add(1)
		return
	}
	ts := meta.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	if !r.agg.add(t, meta, uint64(ts.UnixNano())) {
		r.stats.samplesDropped.Add(1)
	}
}

// ReportHeap keeps a heap profile read from a process for the current
// interval (the last one of each process in it). hp is shared and must not
// be modified afterwards.
func (r *Reporter) ReportHeap(hp *libpf.HeapProfile) {
	r.stats.heapProfilesReceived.Add(1)
	if hp == nil || !r.agg.addHeap(hp) {
		r.stats.heapProfilesDropped.Add(1)
	}
}

// Start starts the interval ticker and the export goroutine. They run until
// ctx is done or Close is called; Close must be called in either case to
// flush the last interval and release the connection. The first interval
// begins now if no sample came before: start the reporter when sampling
// starts.
func (r *Reporter) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return errors.New("starting reporter: already closed")
	case r.started:
		return errors.New("starting reporter: already started")
	}
	r.started = true
	r.agg.restartIfEmpty(time.Now())

	var tickCtx, expCtx context.Context
	tickCtx, r.stopTicker = context.WithCancel(ctx)
	r.tickerDone = make(chan struct{})
	go r.tickLoop(tickCtx)
	if r.exp != nil {
		expCtx, r.abortExport = context.WithCancel(ctx)
		r.stopExport = make(chan struct{})
		r.exportDone = make(chan struct{})
		go func() {
			defer close(r.exportDone)
			r.exp.run(expCtx, r.stopExport)
		}()
	}
	return nil
}

// tickLoop ends an interval every FirstInterval until one had samples,
// then every Interval.
func (r *Reporter) tickLoop(ctx context.Context) {
	defer close(r.tickerDone)
	period := r.cfg.FirstInterval
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.noteLocal(r.reportInterval(now))
			if period != r.cfg.Interval && r.stats.intervals.Load() > 0 {
				period = r.cfg.Interval
				t.Reset(period)
			}
		}
	}
}

// noteLocal logs the outcome of an interval's local output: a warning at
// the first failure (a full disk fails every interval), debug messages
// while it goes on, and its end. Failures are counted (PprofErrors).
func (r *Reporter) noteLocal(err error) {
	switch {
	case err != nil && !r.localFailing:
		r.localFailing = true
		r.log.WithError(err).Warn("writing the interval's profile locally failed (further failures logged at debug level until it works again)")
	case err != nil:
		r.log.WithError(err).Debug("writing the interval's profile locally failed again")
	case r.localFailing:
		r.localFailing = false
		r.log.Info("writing profiles locally works again")
	}
}

// Close stops the ticker, reports the last (partial) interval, gives the
// exporter FlushTimeout to send what is still queued, and stops it. It is
// safe to call more than once; later calls do nothing.
func (r *Reporter) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.started {
		r.stopTicker()
		<-r.tickerDone
	}
	err := r.reportInterval(time.Now())
	if r.exp == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.FlushTimeout)
	defer cancel()
	if r.started {
		close(r.stopExport)
		select {
		case <-r.exportDone:
		case <-ctx.Done():
		}
		r.abortExport()
		<-r.exportDone
	}
	r.exp.drain(ctx)
	return errors.Join(err, r.exp.close())
}

// Stats returns a snapshot of the counters.
func (r *Reporter) Stats() Stats {
	st := r.stats.snapshot()
	if r.exp != nil && r.exp.spool != nil {
		st.Spool = r.exp.spool.Stats()
		st.RequestsDropped += st.Spool.Dropped + st.Spool.Torn
	}
	return st
}

// reportInterval ends the current interval at end and reports it: the pprof
// file and summary synchronously, OTLP by handing a request to the exporter.
// Only local output errors are returned; export outcomes are counted.
func (r *Reporter) reportInterval(end time.Time) error {
	iv := r.agg.swap(end)
	if iv.dropped > 0 {
		r.log.WithFields(logrus.Fields{
			"dropped": iv.dropped,
			"limit":   r.cfg.MaxSamplesPerInterval,
		}).Warn("interval sample limit reached; samples dropped")
	}
	if iv.empty() {
		return nil
	}
	r.stats.intervals.Add(1)
	if r.cfg.History != nil {
		r.cfg.History.add(iv, r.opts.period)
	}
	var err error
	if r.cfg.OutputDir != "" {
		err = r.writeLocal(iv)
	}
	if r.cfg.TopN > 0 && iv.samples > 0 {
		for line := range strings.SplitSeq(formatTopN(topFunctions(iv, r.cfg.TopN), iv.samples), "\n") {
			r.log.Info(line)
		}
	}
	if r.exp != nil {
		for _, part := range splitForExport(iv) {
			r.exp.enqueue(part)
		}
	}
	return err
}

// writeLocal writes the interval's pprof files: its CPU (and off-CPU)
// samples, and its heap profiles beside them (-heap).
func (r *Reporter) writeLocal(iv *interval) error {
	var errs []error
	write := func(p *profile.Profile, suffix string) {
		path, err := writePprof(r.cfg.OutputDir, p, iv.start, suffix)
		if err != nil {
			r.stats.pprofErrors.Add(1)
			errs = append(errs, err)
			return
		}
		r.stats.pprofFilesWritten.Add(1)
		r.log.WithField("path", path).Debug("wrote pprof profile")
	}
	if iv.samples+iv.waits > 0 {
		write(buildPprof(iv, r.opts.period), "")
	}
	if hp := buildHeapPprof(iv); hp != nil {
		write(hp, "-heap")
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	removed, err := pruneProfiles(r.cfg.OutputDir, r.cfg.MaxOutputFiles)
	r.stats.pprofFilesRemoved.Add(uint64(removed))
	if err != nil {
		r.stats.pprofErrors.Add(1)
	}
	return err
}

package reporter

import (
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip" // registers the gzip compressor
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hostprof/ebpf-profiler/reporter/spool"
)

// exportMethod is the OTLP profiles Export RPC. The slim proto module ships
// no client stub, so the exporter invokes it by name.
const exportMethod = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"

// retryPolicy is how the exporter backs off while the collector fails.
type retryPolicy struct {
	initial, max   time.Duration
	attemptTimeout time.Duration
}

func defaultRetryPolicy() retryPolicy {
	return retryPolicy{initial: time.Second, max: 30 * time.Second, attemptTimeout: 30 * time.Second}
}

// jittered spreads d by ±20% so that many hosts that lost the same collector
// do not all retry in lockstep.
func (p retryPolicy) jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// exporter sends intervals to the collector, one request at a time, from
// a bounded queue in memory and, when a spool is set, from a queue on disk
// that takes what could not be delivered.
//
// The queue in memory is sent first, oldest first: the newest data is
// never starved behind a replay. An interval that comes while others wait
// is merged into the newest waiting one (up to the interval sample limit),
// so a slow collector gets fewer, larger requests. When an attempt fails
// transiently, with a spool, the request and everything waiting in memory
// go to the spool, and the next attempts (probes, at most one reporter
// interval apart) replay the spool's oldest; without one, the request is
// retried and the oldest waiting are dropped beyond the bound. Once the
// collector accepts requests again, the spool is replayed, oldest first,
// at most replayRate bytes a second.
type exporter struct {
	conn   *grpc.ClientConn
	target string
	policy retryPolicy
	stats  *counters
	log    *logrus.Entry
	opts   buildOptions
	// probeEvery bounds the wait between attempts while the collector
	// fails, so that delivery resumes within an interval of its return.
	probeEvery time.Duration
	// mergeLimit bounds the samples (and waits) of a merged interval.
	mergeLimit int
	spool      *spool.Spool // nil: none
	replayRate float64      // bytes a second
	// ready has a token when the connection became ready.
	ready chan struct{}

	// spillMu is held from taking intervals off the queue for the spool
	// until they are in it, so that the spool keeps their order; it comes
	// before mu.
	spillMu sync.Mutex
	mu      sync.Mutex
	queue   []*interval // waiting, oldest first; the one being sent is not in it
	limit   int
	// sending is set while a waiting interval is being sent.
	sending bool
	wake    chan struct{}

	// Touched only by the sending goroutine (run, then drain).
	failing        bool
	failingSince   time.Time
	failedAttempts int
	// nextReplay is when the spool may be read again (replayRate).
	nextReplay time.Time
}

func newExporter(cfg Config, policy retryPolicy, opts buildOptions, stats *counters, log *logrus.Entry) (*exporter, error) {
	log = log.WithField("collector", cfg.CollectionAgent)
	creds := insecure.NewCredentials()
	if !cfg.DisableTLS {
		tc, err := clientTLS(cfg, log)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	probeEvery := min(policy.max, cfg.Interval)
	// gRPC's own reconnect backoff defaults to a 2 minute ceiling, which
	// would leave the channel failing fast long after the collector is back;
	// keep it in step with our probes.
	conn, err := grpc.NewClient(cfg.CollectionAgent,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  min(policy.initial, probeEvery),
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   probeEvery,
			},
			MinConnectTimeout: min(policy.attemptTimeout, 20*time.Second),
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("creating gRPC client for %s: %w", cfg.CollectionAgent, err)
	}
	e := &exporter{
		conn:       conn,
		target:     cfg.CollectionAgent,
		policy:     policy,
		stats:      stats,
		log:        log,
		opts:       opts,
		probeEvery: probeEvery,
		mergeLimit: cfg.MaxSamplesPerInterval,
		replayRate: cfg.SpoolReplayBytesPerSecond,
		ready:      make(chan struct{}, 1),
		limit:      cfg.MaxQueuedRequests,
		wake:       make(chan struct{}, 1),
	}
	if cfg.SpoolDir != "" {
		// Without its spool the daemon still exports; it drops what the
		// collector does not take, as it says.
		e.spool, err = spool.Open(cfg.SpoolDir, cfg.SpoolBytes)
		if err != nil {
			log.WithError(err).WithField("max_waiting", cfg.MaxQueuedRequests).
				Warn("not keeping what the collector does not take on disk: beyond max_waiting requests, the oldest are dropped (counted); set -spool-dir to a directory of the daemon's own")
			e.spool = nil
		} else if st := e.spool.Stats(); st.Records > 0 {
			log.WithFields(logrus.Fields{"requests": st.Records, "bytes": st.Bytes, "spool": cfg.SpoolDir}).
				Info("replaying the profiles an earlier run could not deliver")
		}
	}
	return e, nil
}

// enqueue adds iv without ever waiting for the collector: merged into the
// newest waiting interval if there is room, else queued; beyond the bound,
// the oldest waiting goes to the spool, or is dropped (counted) without
// one.
func (e *exporter) enqueue(iv *interval) {
	e.spillMu.Lock()
	defer e.spillMu.Unlock()
	e.mu.Lock()
	if n := len(e.queue); n > 0 && mergeable(e.queue[n-1], iv, e.mergeLimit) {
		e.queue[n-1] = mergeIntervals(e.queue[n-1], iv)
		e.stats.intervalsMerged.Add(1)
	} else {
		e.queue = append(e.queue, iv)
	}
	var over []*interval
	// While a waiting interval is being sent, the spool waits for it: it
	// may come back, older than any waiting (an attempt lasts at most
	// attemptTimeout), unless twice the bound wait.
	if e.spool == nil || !e.sending || e.excessLocked(2) > 0 {
		over = e.takeOverLocked()
	}
	e.mu.Unlock()
	e.spill(over...)
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// maxQueuedHeapSites bounds the heap profiles' sites waiting to be sent:
// they come in requests of maxHeapSitesPerRequest, many at once every
// heap interval, and count apart from the intervals of samples.
const maxQueuedHeapSites = 1 << 20

// excessLocked is how many of the oldest waiting intervals are beyond
// factor times the bounds: limit intervals with samples, and
// maxQueuedHeapSites heap sites (the caller holds mu).
func (e *exporter) excessLocked(factor int) int {
	sampled, sites := 0, 0
	for i := len(e.queue) - 1; i >= 0; i-- {
		iv := e.queue[i]
		if iv.samples+iv.waits > 0 {
			sampled++
		}
		sites += iv.heapSites
		if sampled > factor*e.limit || sites > factor*maxQueuedHeapSites {
			return i + 1
		}
	}
	return 0
}

// takeOverLocked takes the oldest waiting intervals beyond the bound off
// the queue (the caller holds mu).
func (e *exporter) takeOverLocked() []*interval {
	n := e.excessLocked(1)
	if n <= 0 {
		return nil
	}
	over := slices.Clone(e.queue[:n])
	clear(e.queue[:n])
	e.queue = e.queue[n:]
	return over
}

// spill writes intervals to the spool, or, without one, drops them
// (counted).
func (e *exporter) spill(ivs ...*interval) {
	for _, iv := range ivs {
		e.spillRequest(buildRequest(iv, e.opts), iv.end)
	}
}

func (e *exporter) spillRequest(r otlpRequest, made time.Time) {
	if e.spool == nil {
		e.stats.requestsDropped.Add(1)
		e.log.Debug("OTLP export queue full, dropped the oldest request")
		return
	}
	payload, err := encodeSpooled(r.req)
	if err == nil {
		err = e.spool.Append(spool.Record{Time: made, Samples: uint32(r.samples), Items: uint32(r.profiles), Payload: payload})
	}
	if err != nil {
		// The spool counts a record over its bound itself.
		if !errors.Is(err, spool.ErrTooLarge) {
			e.stats.requestsDropped.Add(1)
		}
		e.log.WithError(err).Warn("could not spool an undelivered OTLP request; it is lost")
	}
}

// attempt is one request to send: a waiting interval's (iv set) or the
// spool's oldest.
type attempt struct {
	iv  *interval
	req otlpRequest
	// rec is the spooled record (its payload let go), spooled its bytes.
	rec     spool.Record
	spooled int
}

// next returns the request to send now: the oldest waiting interval, else
// the spool's oldest once the replay rate allows it (or, probing, at once).
// Without one, it says how long until the spool may be read (0: nothing
// to read).
func (e *exporter) next(probing bool) (attempt, time.Duration, bool) {
	e.mu.Lock()
	if len(e.queue) > 0 {
		iv := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.sending = true
		e.mu.Unlock()
		return attempt{iv: iv, req: buildRequest(iv, e.opts)}, 0, true
	}
	e.mu.Unlock()
	if e.spool == nil {
		return attempt{}, 0, false
	}
	for {
		if wait := time.Until(e.nextReplay); wait > 0 && !probing {
			if e.spool.Stats().Records == 0 {
				return attempt{}, 0, false
			}
			return attempt{}, wait, false
		}
		rec, ok, err := e.spool.Peek()
		if err != nil {
			e.log.WithError(err).Warn("reading the spool failed")
			return attempt{}, e.probeEvery, false
		}
		if !ok {
			return attempt{}, 0, false
		}
		req, err := decodeSpooled(rec.Payload)
		size := len(rec.Payload)
		rec.Payload = nil
		if err == nil {
			return attempt{req: otlpRequest{req: req, samples: int(rec.Samples), profiles: int(rec.Items)},
				rec: rec, spooled: size}, 0, true
		}
		e.log.WithError(err).Warn("dropping a spooled OTLP request that does not decode")
		e.stats.requestsDropped.Add(1)
		if err := e.spool.Ack(rec); err != nil {
			return attempt{}, e.probeEvery, false
		}
	}
}

// finish ends an attempt that returned err. A request delivered or
// rejected for good leaves its queue (a rejected one counted as dropped);
// one that failed transiently goes to the spool (a spooled one stays at
// its head), or, without a spool, back to the head of the queue, with
// everything waiting spilled behind it.
func (e *exporter) finish(a attempt, err error) {
	transient := err != nil && retryable(err)
	if err != nil && !transient {
		e.stats.requestsDropped.Add(1)
	}
	if a.iv == nil {
		if transient {
			return
		}
		if aerr := e.spool.Ack(a.rec); aerr != nil {
			e.log.WithError(aerr).Warn("recording a replayed request in the spool failed")
		}
		if err == nil {
			e.stats.requestsReplayed.Add(1)
		}
		if e.replayRate > 0 {
			e.nextReplay = time.Now().Add(time.Duration(float64(a.spooled) / e.replayRate * float64(time.Second)))
		}
		return
	}
	if !transient {
		e.mu.Lock()
		e.sending = false
		e.mu.Unlock()
		return
	}
	if e.spool == nil {
		e.spillMu.Lock()
		defer e.spillMu.Unlock()
		e.mu.Lock()
		e.sending = false
		e.queue = append([]*interval{a.iv}, e.queue...)
		over := e.takeOverLocked()
		e.mu.Unlock()
		e.spill(over...)
		return
	}
	// Spilled before sending is unset, so that nothing newer goes first.
	e.spillMu.Lock()
	defer e.spillMu.Unlock()
	e.spillRequest(a.req, a.iv.end)
	e.mu.Lock()
	waiting := e.queue
	e.queue = nil
	e.sending = false
	e.mu.Unlock()
	e.spill(waiting...)
}

// run sends requests, waiting between failed attempts with exponential
// backoff (at most probeEvery), until stop is closed or ctx is done.
// Closing stop lets an attempt under way finish, so a request the
// collector is already processing is not sent again by drain; cancelling
// ctx aborts it. What is still queued when run returns is left for drain.
func (e *exporter) run(ctx context.Context, stop <-chan struct{}) {
	go e.watchReady(ctx)
	delay := e.policy.initial
	// probing is set after a transient failure: the spool's oldest is
	// sent then, whatever the replay rate, as a probe.
	probing := false
	for {
		select {
		case <-stop:
			return
		default:
		}
		a, wait, ok := e.next(probing)
		if !ok {
			var timer <-chan time.Time
			if wait > 0 {
				timer = time.After(wait)
			}
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-e.wake:
			case <-timer:
			}
			continue
		}
		err := e.send(ctx, a.req)
		e.finish(a, err)
		if ctx.Err() != nil {
			return
		}
		probing = err != nil && retryable(err)
		if !probing {
			delay = e.policy.initial
			continue
		}
		wait = min(e.policy.jittered(delay), e.probeEvery)
		// A collector that comes back is found by gRPC's reconnects
		// before the wait ends; one that asked for a delay (RetryInfo)
		// gets it.
		ready := e.ready
		if d, ok := retryDelay(err); ok {
			wait = max(wait, min(d, maxServerRetryDelay))
			ready = nil
		}
		// A token left from before the failure costs one early attempt
		// at most; dropping it could lose one that came since.
		e.conn.Connect()
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-ready:
		case <-time.After(wait):
		}
		delay = min(2*delay, e.policy.max)
	}
}

// watchReady puts a token in ready each time the connection becomes ready.
func (e *exporter) watchReady(ctx context.Context) {
	for {
		st := e.conn.GetState()
		if st == connectivity.Ready {
			select {
			case e.ready <- struct{}{}:
			default:
			}
		}
		if !e.conn.WaitForStateChange(ctx, st) {
			return
		}
	}
}

// drain makes one last attempt at each waiting interval within ctx, as at
// shutdown there is no time for backoff. At the first transient failure
// (the collector is then most likely unreachable), or once ctx is done,
// the rest goes to the spool, for the next run, or is dropped (counted)
// without one.
func (e *exporter) drain(ctx context.Context) {
	for {
		e.mu.Lock()
		if len(e.queue) == 0 {
			e.mu.Unlock()
			return
		}
		iv := e.queue[0]
		e.queue = e.queue[1:]
		e.mu.Unlock()
		r := buildRequest(iv, e.opts)
		err := ctx.Err()
		if err == nil {
			err = e.send(ctx, r)
		}
		if err == nil || (!retryable(err) && ctx.Err() == nil) {
			e.finish(attempt{iv: iv, req: r}, err)
			continue
		}
		e.spillMu.Lock()
		defer e.spillMu.Unlock()
		e.mu.Lock()
		rest := e.queue
		e.queue = nil
		e.mu.Unlock()
		if e.spool != nil {
			e.spillRequest(r, iv.end)
			e.spill(rest...)
			e.log.WithField("requests", 1+len(rest)).Info("spooled the profiles not delivered at shutdown, for the next run")
			return
		}
		e.stats.requestsDropped.Add(uint64(1 + len(rest)))
		e.log.WithError(err).WithField("requests", 1+len(rest)).Warn("dropping unsent profiles at shutdown")
		return
	}
}

// send makes one export attempt and records its outcome.
func (e *exporter) send(ctx context.Context, r otlpRequest) error {
	actx, cancel := context.WithTimeout(ctx, e.policy.attemptTimeout)
	defer cancel()
	resp := &collectorpb.ExportProfilesServiceResponse{}
	err := e.conn.Invoke(actx, exportMethod, r.req, resp, grpc.UseCompressor(gzip.Name))
	if err != nil {
		// Being stopped is not an outage of the collector.
		if !errors.Is(ctx.Err(), context.Canceled) {
			e.noteFailure(err)
		}
		return err
	}
	e.noteSuccess(r, resp)
	return nil
}

// noteFailure logs a warning only for the first failure of an outage; the
// rest are counted and logged at debug level.
func (e *exporter) noteFailure(err error) {
	e.stats.exportErrors.Add(1)
	e.failedAttempts++
	log := e.log.WithError(err).WithField("code", status.Code(err).String())
	if e.failing {
		log.Debug("OTLP export failed again")
		return
	}
	e.failing = true
	e.failingSince = time.Now()
	if retryable(err) {
		log.Warn("OTLP export failing; retrying with backoff (further failures logged at debug level until it recovers)")
	} else {
		log.Warn("OTLP export rejected by the collector; dropping the request (further failures logged at debug level until an export succeeds)")
	}
}

func (e *exporter) noteSuccess(r otlpRequest, resp *collectorpb.ExportProfilesServiceResponse) {
	if e.failing {
		e.log.WithFields(logrus.Fields{
			"outage":          time.Since(e.failingSince).Round(time.Millisecond).String(),
			"failed_attempts": e.failedAttempts,
		}).Info("OTLP export recovered")
		e.failing = false
		e.failedAttempts = 0
	}
	e.stats.requestsExported.Add(1)
	e.stats.samplesExported.Add(uint64(r.samples))
	if ps := resp.GetPartialSuccess(); ps.GetRejectedProfiles() > 0 || ps.GetErrorMessage() != "" {
		e.stats.profilesRejected.Add(uint64(max(0, ps.GetRejectedProfiles())))
		e.log.WithFields(logrus.Fields{
			"rejected_profiles": ps.GetRejectedProfiles(),
			"message":           ps.GetErrorMessage(),
		}).Warn("collector rejected part of the exported profiles")
	}
	fields := logrus.Fields{"samples": r.samples, "profiles": r.profiles}
	if r.samples == 0 {
		// A heap round's requests: tens at a time, each minute.
		e.log.WithFields(fields).Debug("exported heap profiles")
		return
	}
	e.log.WithFields(fields).Info("exported profiles")
}

func (e *exporter) close() error {
	var errs []error
	if err := e.conn.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing gRPC connection to %s: %w", e.target, err))
	}
	if e.spool != nil {
		errs = append(errs, e.spool.Close())
	}
	return errors.Join(errs...)
}

// retryable follows the OTLP spec's list of transient gRPC codes.
// ResourceExhausted is transient only when the server says when to retry;
// otherwise (e.g. a request over the size limit) retrying cannot help.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.OutOfRange,
		codes.Unavailable, codes.DataLoss:
		return true
	case codes.ResourceExhausted:
		_, ok := retryDelay(err)
		return ok
	default:
		return false
	}
}

// maxServerRetryDelay bounds the wait a collector's RetryInfo asks for.
const maxServerRetryDelay = 5 * time.Minute

// retryDelay is the server's throttling hint (RetryInfo), if it sent one.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// encodeSpooled is a request as the spool keeps it: the protobuf,
// gzipped (profiles shrink 5-10 times).
func encodeSpooled(req *collectorpb.ExportProfilesServiceRequest) ([]byte, error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding a request to spool: %w", err)
	}
	var buf bytes.Buffer
	zw, _ := stdgzip.NewWriterLevel(&buf, stdgzip.BestSpeed)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// maxSpooledRequest bounds a spooled request once inflated (gRPC's
// default receive limit on a collector is 4 MiB compressed).
const maxSpooledRequest = 256 << 20

func decodeSpooled(payload []byte) (*collectorpb.ExportProfilesServiceRequest, error) {
	zr, err := stdgzip.NewReader(bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(zr, maxSpooledRequest+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSpooledRequest {
		return nil, fmt.Errorf("inflates beyond %d bytes", maxSpooledRequest)
	}
	req := &collectorpb.ExportProfilesServiceRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, err
	}
	return req, nil
}

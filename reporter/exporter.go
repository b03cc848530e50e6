package reporter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip" // registers the gzip compressor
	"google.golang.org/grpc/status"
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

type queuedRequest struct {
	// seq identifies the request so a sender can tell whether the request it
	// was retrying has meanwhile been dropped from the queue.
	seq uint64
	otlpRequest
}

// exporter sends requests to the collector from a bounded queue, one at a
// time, oldest first. The request being sent stays at the head of the queue
// until it is delivered, so it counts against the bound and is the first to
// go when a long outage fills the queue.
type exporter struct {
	conn   *grpc.ClientConn
	target string
	policy retryPolicy
	stats  *counters
	log    *logrus.Entry

	mu    sync.Mutex
	queue []queuedRequest
	limit int
	seq   uint64
	// inFlight is the seq of the request being sent (0 if none), and
	// inFlightDropped records that enqueue pushed it out meanwhile; whether
	// that loses it depends on how the attempt ends.
	inFlight        uint64
	inFlightDropped bool
	wake            chan struct{}

	// Outage state, touched only by the sending goroutine (run, then drain).
	failing        bool
	failingSince   time.Time
	failedAttempts int
}

func newExporter(cfg Config, policy retryPolicy, stats *counters, log *logrus.Entry) (*exporter, error) {
	log = log.WithField("collector", cfg.CollectionAgent)
	creds := insecure.NewCredentials()
	if !cfg.DisableTLS {
		tc, err := clientTLS(cfg, log)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	// gRPC's own reconnect backoff defaults to a 2 minute ceiling, which
	// would leave the channel failing fast long after the collector is back;
	// keep it in step with our retries.
	conn, err := grpc.NewClient(cfg.CollectionAgent,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  policy.initial,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   policy.max,
			},
			MinConnectTimeout: min(policy.attemptTimeout, 20*time.Second),
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("creating gRPC client for %s: %w", cfg.CollectionAgent, err)
	}
	return &exporter{
		conn:   conn,
		target: cfg.CollectionAgent,
		policy: policy,
		stats:  stats,
		log:    log,
		limit:  cfg.MaxQueuedRequests,
		wake:   make(chan struct{}, 1),
	}, nil
}

// enqueue adds r without ever blocking, dropping the oldest requests beyond
// the bound: during an outage the newest data is the most useful.
func (e *exporter) enqueue(r otlpRequest) {
	e.mu.Lock()
	e.seq++
	e.queue = append(e.queue, queuedRequest{seq: e.seq, otlpRequest: r})
	dropped := 0
	for len(e.queue) > e.limit {
		if e.queue[0].seq == e.inFlight {
			e.inFlightDropped = true
		} else {
			dropped++
		}
		e.queue[0] = queuedRequest{}
		e.queue = e.queue[1:]
	}
	e.mu.Unlock()
	if dropped > 0 {
		e.stats.requestsDropped.Add(uint64(dropped))
		e.log.WithField("dropped", dropped).Debug("OTLP export queue full, dropped oldest request")
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest queued request and marks it in flight.
func (e *exporter) next() (queuedRequest, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		return queuedRequest{}, false
	}
	e.inFlight, e.inFlightDropped = e.queue[0].seq, false
	return e.queue[0], true
}

// finish ends an attempt at request seq that returned err. A delivered or
// permanently rejected request leaves the queue; one that failed transiently
// stays at its head for the next attempt. A request pushed out of the queue
// during the attempt is lost, and counted, only if the attempt failed.
func (e *exporter) finish(seq uint64, err error) {
	done := err == nil || !retryable(err)
	e.mu.Lock()
	pushedOut := e.inFlightDropped
	e.inFlight, e.inFlightDropped = 0, false
	if done && !pushedOut && len(e.queue) > 0 && e.queue[0].seq == seq {
		e.queue[0] = queuedRequest{}
		e.queue = e.queue[1:]
	}
	e.mu.Unlock()
	if err != nil && (pushedOut || done) {
		e.stats.requestsDropped.Add(1)
	}
}

func (e *exporter) clear() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.queue)
	e.queue = nil
	return n
}

// run sends queued requests, retrying transient failures with exponential
// backoff, until stop is closed or ctx is done. Closing stop lets an attempt
// under way finish, so a request the collector is already processing is not
// sent again by drain; cancelling ctx aborts it. What is still queued when
// run returns is left for drain.
func (e *exporter) run(ctx context.Context, stop <-chan struct{}) {
	delay := e.policy.initial
	for {
		select {
		case <-stop:
			return
		default:
		}
		r, ok := e.next()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-e.wake:
			}
			continue
		}
		err := e.send(ctx, r)
		e.finish(r.seq, err)
		if ctx.Err() != nil {
			return
		}
		if err == nil || !retryable(err) {
			delay = e.policy.initial
			continue
		}
		wait := e.policy.jittered(delay)
		if d, ok := retryDelay(err); ok {
			wait = max(wait, min(d, e.policy.max))
		}
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-time.After(wait):
		}
		delay = min(2*delay, e.policy.max)
	}
}

// drain makes one last attempt at each queued request within ctx, as at
// shutdown there is no time for backoff. It stops at the first transient
// failure, since the collector is then most likely unreachable.
func (e *exporter) drain(ctx context.Context) {
	for {
		r, ok := e.next()
		if !ok {
			return
		}
		err := e.send(ctx, r)
		e.finish(r.seq, err)
		if err != nil && retryable(err) {
			n := e.clear()
			e.stats.requestsDropped.Add(uint64(n))
			e.log.WithError(err).WithField("requests", n).Warn("dropping unsent profiles at shutdown")
			return
		}
	}
}

// send makes one export attempt and records its outcome.
func (e *exporter) send(ctx context.Context, r queuedRequest) error {
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

func (e *exporter) noteSuccess(r queuedRequest, resp *collectorpb.ExportProfilesServiceResponse) {
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
	e.log.WithFields(logrus.Fields{"samples": r.samples, "profiles": r.profiles}).Info("exported profiles")
}

func (e *exporter) close() error {
	if err := e.conn.Close(); err != nil {
		return fmt.Errorf("closing gRPC connection to %s: %w", e.target, err)
	}
	return nil
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

// retryDelay is the server's throttling hint (RetryInfo), if it sent one.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

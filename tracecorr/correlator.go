package tracecorr

import (
	"cmp"
	"errors"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Config configures a Correlator.
type Config struct {
	// HostID is the host.id sent in registration messages: the one the
	// profiles are exported with.
	HostID string
	// FlushInterval is how often correlation messages are sent (default
	// 500 ms). Agents hold ended transactions until their messages can have
	// arrived, so it is kept well under the reporter's interval.
	FlushInterval time.Duration
	// SamplesDelay is the samples-delay-ms the registration announces: the
	// time from a sample to its correlation message that the agent may
	// wait for (default 1 s).
	SamplesDelay time.Duration
	// ProcFS is where procfs is mounted (default /proc).
	ProcFS string
	Logger logrus.FieldLogger
}

// Agent is what the process manager learned of an agent from its process
// storage.
type Agent struct {
	// SocketPath is the agent's socket as its process sees it.
	SocketPath string
	// Generation changes whenever the process storage was read anew: a
	// new storage may name a new socket, and an agent is registered again
	// after any change.
	Generation uint64
}

// Stats are a Correlator's counters since New.
type Stats struct {
	// Registrations and Messages count datagrams sent; SamplesSent sums the
	// counts of the correlation messages.
	Registrations, Messages, SamplesSent uint64
	// Deferred counts correlation messages that the agent's full socket
	// kept from going out within a flush; their counts go out with the
	// next one.
	Deferred uint64
	// SamplesDropped counts samples no message will carry: their process
	// has no usable socket, its agent never published one, or too many
	// were waiting for it.
	SamplesDropped uint64
	// SendErrors counts sends and connects that failed otherwise.
	SendErrors uint64
	// Refused counts socket paths refused, per reason.
	Refused [numRefusals]uint64
}

// Bounds on what waits for an agent: distinct (trace, transaction, stack)
// counts per process, and how long samples of a process whose agent is not
// known yet are kept.
const (
	maxPendingKeys   = 16384
	unknownAgentWait = 10 * time.Second
)

// How often a missing or failing socket is tried again, and how often a
// connected one is checked for having been replaced at its path.
const (
	connectRetryMin    = 100 * time.Millisecond
	connectRetryMax    = 5 * time.Second
	socketCheckPeriod  = 5 * time.Second
	maxPollWait        = 50 * time.Millisecond
	defaultFlush       = 500 * time.Millisecond
	defaultSampleDelay = time.Second
)

// Correlator sends each APM agent a registration message and, every flush
// interval, the stack-trace ids of the samples its threads took in its
// transactions. Count is called from the trace pump and never blocks on
// I/O; the sends happen on the Correlator's own goroutine, paced by the
// agents' sockets, and never wait longer than one flush interval.
type Correlator struct {
	cfg  Config
	log  logrus.FieldLogger
	wake chan struct{}

	mu     sync.Mutex
	agents map[uint32]*agentState
	stats  Stats

	// conns is owned by the flush goroutine.
	conns map[uint32]*conn

	stop chan struct{}
	done chan struct{}
}

// agentState is what Count and the process manager tell of one process.
type agentState struct {
	known   bool
	agent   Agent
	pending map[corrKey]uint32
	// since is when the oldest pending count of a process whose agent is
	// not known yet arrived.
	since time.Time
}

// conn is the flush goroutine's link to one agent.
type conn struct {
	sock *agentSocket
	// gen is the agent generation sock was opened for; refused is set when
	// that generation's path was refused, which only a new one lifts.
	gen        uint64
	refused    bool
	registered bool
	retry      libpf.Backoff
	checked    time.Time
}

// New returns a Correlator; Start runs it.
func New(cfg Config) *Correlator {
	cfg.FlushInterval = cmp.Or(cfg.FlushInterval, defaultFlush)
	cfg.SamplesDelay = cmp.Or(cfg.SamplesDelay, defaultSampleDelay)
	cfg.ProcFS = cmp.Or(cfg.ProcFS, "/proc")
	c := &Correlator{
		cfg:    cfg,
		log:    cfg.Logger,
		wake:   make(chan struct{}, 1),
		agents: map[uint32]*agentState{},
		conns:  map[uint32]*conn{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if c.log == nil {
		c.log = logrus.StandardLogger()
	}
	return c
}

// SetAgent says process pid has an agent that published its storage. The
// agent is registered at once, not at the next flush: agents may wait for
// a registration before they publish trace context.
func (c *Correlator) SetAgent(pid uint32, a Agent) {
	c.mu.Lock()
	s := c.state(pid)
	s.known, s.agent = true, a
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// RemoveAgent forgets a process that exited or lost its agent; its
// pending counts are dropped.
func (c *Correlator) RemoveAgent(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.agents[pid]; ok {
		c.stats.SamplesDropped += sum(s.pending)
		delete(c.agents, pid)
	}
}

// Count records one sample of stack that a thread of pid took in the APM
// trace apm.
func (c *Correlator) Count(pid uint32, apm libpf.APMContext, stack libpf.TraceHash) {
	k := corrKey{traceID: apm.TraceID, transactionID: apm.TransactionID, stack: stack}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state(pid)
	if !s.known && len(s.pending) == 0 {
		s.since = time.Now()
	}
	if _, ok := s.pending[k]; !ok && len(s.pending) >= maxPendingKeys {
		c.stats.SamplesDropped++
		return
	}
	s.pending[k]++
}

// state returns pid's state, creating it. The caller holds c.mu.
func (c *Correlator) state(pid uint32) *agentState {
	s := c.agents[pid]
	if s == nil {
		s = &agentState{pending: map[corrKey]uint32{}}
		c.agents[pid] = s
	}
	return s
}

// Stats returns a snapshot of the counters.
func (c *Correlator) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Start runs the flush loop until Close.
func (c *Correlator) Start() {
	go func() {
		defer close(c.done)
		t := time.NewTicker(c.cfg.FlushInterval)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				c.flush(time.Now().Add(c.cfg.FlushInterval))
				c.closeAll()
				return
			case <-t.C:
			case <-c.wake:
			}
			c.flush(time.Now().Add(c.cfg.FlushInterval * 4 / 5))
		}
	}()
}

// Close sends what is pending (for at most one flush interval) and closes
// every socket. Call it once, after Start.
func (c *Correlator) Close() {
	close(c.stop)
	<-c.done
}

func (c *Correlator) closeAll() {
	for pid, cn := range c.conns {
		c.reset(cn)
		delete(c.conns, pid)
	}
}

// outbox is one agent's share of a flush.
type outbox struct {
	pid   uint32
	conn  *conn
	items []item
	next  int
}

// item is one datagram: a registration (zero key and count) or one
// correlation message.
type item struct {
	register bool
	key      corrKey
	count    uint16
	msg      []byte
}

// flush sends every agent its registration if due and its pending counts,
// until deadline; what is not sent by then waits for the next flush.
func (c *Correlator) flush(deadline time.Time) {
	boxes := c.collect()
	c.send(boxes, deadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range boxes {
		s := c.agents[b.pid]
		for _, it := range b.items[b.next:] {
			switch {
			case it.register:
			case s == nil || len(s.pending) >= maxPendingKeys:
				c.stats.SamplesDropped += uint64(it.count)
			default:
				c.stats.Deferred++
				s.pending[it.key] += uint32(it.count)
			}
		}
	}
}

// collect takes every known agent's pending counts into an outbox, behind
// its registration if that is due, opening sockets where needed. Counts of
// agents refused, and of processes whose agent stayed unknown too long, are
// dropped.
func (c *Correlator) collect() []*outbox {
	now := time.Now()
	type snapshot struct {
		pid     uint32
		agent   Agent
		pending map[corrKey]uint32
	}
	var snaps []snapshot
	c.mu.Lock()
	for pid, cn := range c.conns {
		if _, ok := c.agents[pid]; !ok {
			c.reset(cn)
			delete(c.conns, pid)
		}
	}
	for pid, s := range c.agents {
		if !s.known {
			if now.Sub(s.since) > unknownAgentWait {
				c.stats.SamplesDropped += sum(s.pending)
				delete(c.agents, pid)
			}
			continue
		}
		if len(s.pending) == 0 {
			snaps = append(snaps, snapshot{pid: pid, agent: s.agent})
			continue
		}
		snaps = append(snaps, snapshot{pid, s.agent, s.pending})
		s.pending = map[corrKey]uint32{}
	}
	c.mu.Unlock()

	var boxes []*outbox
	for _, sn := range snaps {
		cn := c.connFor(sn.pid, sn.agent, now)
		if cn.refused {
			c.mu.Lock()
			c.stats.SamplesDropped += sum(sn.pending)
			c.mu.Unlock()
			continue
		}
		b := &outbox{pid: sn.pid, conn: cn}
		if !cn.registered {
			b.items = append(b.items, item{register: true,
				msg: registrationMessage(uint32(c.cfg.SamplesDelay.Milliseconds()), c.cfg.HostID)})
		}
		for k, n := range sn.pending {
			for n > 0 {
				part := uint16(min(n, maxMessageCount))
				b.items = append(b.items, item{key: k, count: part, msg: correlationMessage(k, part)})
				n -= uint32(part)
			}
		}
		if len(b.items) > 0 {
			boxes = append(boxes, b)
		}
	}
	return boxes
}

// connFor returns pid's connection, (re)opening its socket when the agent
// changed, when its path now names another socket, or after a failure. Only
// the flush goroutine calls it.
func (c *Correlator) connFor(pid uint32, a Agent, now time.Time) *conn {
	cn := c.conns[pid]
	if cn == nil || cn.gen != a.Generation {
		if cn != nil {
			c.reset(cn)
		}
		cn = &conn{gen: a.Generation, retry: libpf.NewBackoff(connectRetryMin, connectRetryMax)}
		c.conns[pid] = cn
	}
	if cn.refused {
		return cn
	}
	if cn.sock != nil && now.Sub(cn.checked) >= socketCheckPeriod {
		cn.checked = now
		if !sameSocket(c.cfg.ProcFS, pid, a.SocketPath, cn.sock) {
			c.log.Debugf("process %d: APM socket %s was replaced; registering again", pid, a.SocketPath)
			c.reset(cn)
		}
	}
	if cn.sock != nil || !cn.retry.Ready(now) {
		return cn
	}
	sock, err := openAgentSocket(c.cfg.ProcFS, pid, a.SocketPath)
	var refused *RefusedError
	switch {
	case errors.As(err, &refused):
		cn.refused = true
		c.mu.Lock()
		c.stats.Refused[refused.Reason]++
		c.mu.Unlock()
		c.log.Infof("process %d: %v; no trace correlation for it", pid, err)
	case err != nil:
		c.mu.Lock()
		c.stats.SendErrors++
		c.mu.Unlock()
		wait := cn.retry.Failed(now)
		c.log.Debugf("process %d: %v (next try in %v)", pid, err, wait)
	default:
		cn.sock, cn.checked = sock, now
	}
	return cn
}

// reset closes a connection's socket so that the next flush opens it again
// and registers anew. Only the flush goroutine calls it.
func (c *Correlator) reset(cn *conn) {
	if cn.sock != nil {
		cn.sock.close()
	}
	cn.sock, cn.registered = nil, false
}

// send writes the outboxes' datagrams without blocking. A datagram socket
// queues only about ten datagrams for its reader (net.unix.max_dgram_qlen),
// so when an agent's queue is full, send waits in poll until it drains or
// the deadline passes, serving every agent in turn.
func (c *Correlator) send(boxes []*outbox, deadline time.Time) {
	active := boxes
	for len(active) > 0 {
		var blocked []*outbox
		for _, b := range active {
			if c.drain(b) {
				blocked = append(blocked, b)
			}
		}
		wait := time.Until(deadline)
		if len(blocked) == 0 || wait <= 0 {
			return
		}
		fds := make([]unix.PollFd, len(blocked))
		for i, b := range blocked {
			fds[i] = unix.PollFd{Fd: int32(b.conn.sock.fd), Events: unix.POLLOUT}
		}
		if _, err := unix.Poll(fds, int(min(wait, maxPollWait).Milliseconds())+1); err != nil && err != unix.EINTR {
			return
		}
		active = blocked
	}
}

// drain sends b's datagrams until they are all sent or the socket is full;
// it reports whether the socket was full. A box without a socket (not open
// yet, or failed) sends nothing.
func (c *Correlator) drain(b *outbox) (full bool) {
	for b.next < len(b.items) && b.conn.sock != nil {
		it := &b.items[b.next]
		err := unix.Send(b.conn.sock.fd, it.msg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch err {
		case nil:
		case unix.EAGAIN:
			return true
		case unix.EINTR:
			continue
		default:
			// The agent closed or replaced its socket: open it again next
			// flush, and register again.
			c.log.Debugf("process %d: sending to its APM socket: %v", b.pid, err)
			c.reset(b.conn)
			c.mu.Lock()
			c.stats.SendErrors++
			c.mu.Unlock()
			return false
		}
		if it.register {
			b.conn.registered = true
		}
		c.mu.Lock()
		if it.register {
			c.stats.Registrations++
		} else {
			c.stats.Messages++
			c.stats.SamplesSent += uint64(it.count)
		}
		c.mu.Unlock()
		b.next++
	}
	return false
}

// sum is the sum of a process's pending counts.
func sum(m map[corrKey]uint32) uint64 {
	var n uint64
	for _, v := range m {
		n += uint64(v)
	}
	return n
}

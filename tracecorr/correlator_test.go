package tracecorr

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
)

func TestMessageLayout(t *testing.T) {
	reg := registrationMessage(1000, "abc")
	want := binary.NativeEndian.AppendUint16(nil, 2)
	want = binary.NativeEndian.AppendUint16(want, 1)
	want = binary.NativeEndian.AppendUint32(want, 1000)
	want = binary.NativeEndian.AppendUint32(want, 3)
	want = append(want, "abc"...)
	if !bytes.Equal(reg, want) {
		t.Errorf("registration % x, want % x", reg, want)
	}

	k := corrKey{stack: libpf.TraceHash{Hi: 0x0102030405060708, Lo: 0x090a0b0c0d0e0f10}}
	for i := range k.traceID {
		k.traceID[i] = byte(0x20 + i)
	}
	for i := range k.transactionID {
		k.transactionID[i] = byte(0x40 + i)
	}
	msg := correlationMessage(k, 513)
	if len(msg) != correlationSize {
		t.Fatalf("correlation message of %d bytes, want %d", len(msg), correlationSize)
	}
	if binary.NativeEndian.Uint16(msg) != 1 || binary.NativeEndian.Uint16(msg[2:]) != 1 {
		t.Errorf("header % x", msg[:4])
	}
	if !bytes.Equal(msg[4:20], k.traceID[:]) || !bytes.Equal(msg[20:28], k.transactionID[:]) {
		t.Errorf("ids % x", msg[4:28])
	}
	stack := k.stack.Bytes()
	if !bytes.Equal(msg[28:44], stack[:]) || stack[0] != 1 || stack[15] != 0x10 {
		t.Errorf("stack-trace id % x", msg[28:44])
	}
	if binary.NativeEndian.Uint16(msg[44:]) != 513 {
		t.Errorf("count % x", msg[44:])
	}
}

// decoded is a received correlation message.
type decoded struct {
	key   corrKey
	count uint16
}

func decode(t *testing.T, msgs [][]byte) (registrations []string, corr []decoded) {
	t.Helper()
	for _, m := range msgs {
		switch binary.NativeEndian.Uint16(m) {
		case registrationType:
			n := binary.NativeEndian.Uint32(m[8:])
			registrations = append(registrations, string(m[12:12+n]))
		case correlationType:
			var d decoded
			copy(d.key.traceID[:], m[4:20])
			copy(d.key.transactionID[:], m[20:28])
			d.key.stack = libpf.TraceHash{Hi: binary.BigEndian.Uint64(m[28:]), Lo: binary.BigEndian.Uint64(m[36:])}
			d.count = binary.NativeEndian.Uint16(m[44:])
			corr = append(corr, d)
		default:
			t.Fatalf("message of type %d", binary.NativeEndian.Uint16(m))
		}
	}
	return registrations, corr
}

func newTestCorrelator(f *fakeProc) *Correlator {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	return New(Config{HostID: "host-1", FlushInterval: 100 * time.Millisecond, ProcFS: f.procFS, Logger: log})
}

func apmContext(trace, tx byte) libpf.APMContext {
	a := libpf.APMContext{Valid: true}
	a.TraceID[0], a.TransactionID[0] = trace, tx
	return a
}

func TestCorrelatorSends(t *testing.T) {
	f := newFakeProc(t, os.Getuid())
	l := listen(t, filepath.Join(f.root, "tmp", "agent.sock"))
	c := newTestCorrelator(f)
	defer c.closeAll()

	// Samples before the agent is known wait for it.
	stackA, stackB := libpf.TraceHash{Hi: 1, Lo: 2}, libpf.TraceHash{Hi: 3, Lo: 4}
	for range 3 {
		c.Count(fakePID, apmContext(1, 1), stackA)
	}
	c.flush(time.Now().Add(time.Second))
	if got := received(t, l); len(got) != 0 {
		t.Fatalf("%d datagrams before the agent was known", len(got))
	}
	c.SetAgent(fakePID, Agent{SocketPath: "/tmp/agent.sock", Generation: 1})
	c.Count(fakePID, apmContext(2, 2), stackB)
	for range maxMessageCount + 2 {
		c.Count(fakePID, apmContext(1, 1), stackB)
	}
	c.flush(time.Now().Add(time.Second))
	regs, corr := decode(t, received(t, l))
	if len(regs) != 1 || regs[0] != "host-1" {
		t.Errorf("registrations %q, want one of host-1", regs)
	}
	counts := map[corrKey]int{}
	for _, d := range corr {
		counts[d.key] += int(d.count)
	}
	want := map[corrKey]int{
		{traceID: apmContext(1, 1).TraceID, transactionID: apmContext(1, 1).TransactionID, stack: stackA}: 3,
		{traceID: apmContext(1, 1).TraceID, transactionID: apmContext(1, 1).TransactionID, stack: stackB}: maxMessageCount + 2,
		{traceID: apmContext(2, 2).TraceID, transactionID: apmContext(2, 2).TransactionID, stack: stackB}: 1,
	}
	if len(counts) != len(want) || len(corr) != 4 {
		t.Errorf("%d messages with counts %v, want 4 with %v", len(corr), counts, want)
	}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("count %d for %v, want %d", counts[k], k, n)
		}
	}

	// A flush with nothing new sends nothing; a new generation registers
	// again.
	c.flush(time.Now().Add(time.Second))
	if got := received(t, l); len(got) != 0 {
		t.Errorf("%d datagrams from an idle flush", len(got))
	}
	c.SetAgent(fakePID, Agent{SocketPath: "/tmp/agent.sock", Generation: 2})
	c.flush(time.Now().Add(time.Second))
	if regs, _ := decode(t, received(t, l)); len(regs) != 1 {
		t.Errorf("%d registrations after the storage changed, want 1", len(regs))
	}
	s := c.Stats()
	if s.Registrations != 2 || s.Messages != 4 || s.SamplesSent != maxMessageCount+6 || s.SamplesDropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A full socket defers messages to the next flush instead of losing them,
// and the flush gives up at its deadline.
func TestCorrelatorFullSocket(t *testing.T) {
	f := newFakeProc(t, os.Getuid())
	l := listen(t, filepath.Join(f.root, "tmp", "agent.sock"))
	c := newTestCorrelator(f)
	defer c.closeAll()
	c.SetAgent(fakePID, Agent{SocketPath: "/tmp/agent.sock", Generation: 1})
	const stacks = 200
	for i := range stacks {
		c.Count(fakePID, apmContext(1, 1), libpf.TraceHash{Lo: uint64(i)})
	}
	start := time.Now()
	c.flush(start.Add(100 * time.Millisecond))
	if d := time.Since(start); d > time.Second {
		t.Errorf("a flush to a full socket took %v", d)
	}
	first := c.Stats()
	if first.Deferred == 0 || first.Messages+first.Deferred != stacks {
		t.Fatalf("stats after the first flush %+v: want some deferred, none lost", first)
	}

	// A reader draining the socket lets the next flushes send the rest.
	got := make(chan [][]byte)
	go func() { got <- received(t, l) }()
	var total int
	for i := 0; i < 50 && c.Stats().Messages < stacks; i++ {
		c.flush(time.Now().Add(100 * time.Millisecond))
	}
	_, corr := decode(t, <-got)
	for _, d := range corr {
		total += int(d.count)
	}
	if s := c.Stats(); s.Messages != stacks || total != stacks || s.SamplesDropped != 0 {
		t.Errorf("stats %+v, %d samples received, want all %d", s, total, stacks)
	}
}

func TestCorrelatorRefusesAndDrops(t *testing.T) {
	f := newFakeProc(t, os.Getuid())
	outside := listen(t, filepath.Join(filepath.Dir(f.root), "outside.sock"))
	if err := os.Symlink("../../outside.sock", filepath.Join(f.root, "tmp", "agent.sock")); err != nil {
		t.Fatal(err)
	}
	c := newTestCorrelator(f)
	defer c.closeAll()
	c.SetAgent(fakePID, Agent{SocketPath: "/tmp/agent.sock", Generation: 1})
	c.Count(fakePID, apmContext(1, 1), libpf.TraceHash{Lo: 1})
	c.flush(time.Now().Add(time.Second))
	c.Count(fakePID, apmContext(1, 1), libpf.TraceHash{Lo: 1})
	c.flush(time.Now().Add(time.Second))
	s := c.Stats()
	if s.Refused[RefusedEscape] != 1 || s.SamplesDropped != 2 || s.Registrations != 0 {
		t.Errorf("stats %+v: want one escape refusal (not retried) and 2 samples dropped", s)
	}
	if got := received(t, outside); len(got) != 0 {
		t.Errorf("the socket outside the root received %d datagrams", len(got))
	}

	// Samples of a process whose agent exits are dropped with it.
	c.Count(fakePID+1, apmContext(1, 1), libpf.TraceHash{Lo: 1})
	c.RemoveAgent(fakePID + 1)
	if s := c.Stats(); s.SamplesDropped != 3 {
		t.Errorf("%d samples dropped, want 3", s.SamplesDropped)
	}
}

// An agent that replaces its socket is registered again on the new one.
func TestCorrelatorSocketReplaced(t *testing.T) {
	f := newFakeProc(t, os.Getuid())
	path := filepath.Join(f.root, "tmp", "agent.sock")
	l := listen(t, path)
	c := newTestCorrelator(f)
	defer c.closeAll()
	c.SetAgent(fakePID, Agent{SocketPath: "/tmp/agent.sock", Generation: 1})
	c.flush(time.Now().Add(time.Second))
	if regs, _ := decode(t, received(t, l)); len(regs) != 1 {
		t.Fatalf("%d registrations, want 1", len(regs))
	}

	l.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l = listen(t, path)
	c.Count(fakePID, apmContext(1, 1), libpf.TraceHash{Lo: 1})
	c.flush(time.Now().Add(time.Second)) // the send fails: the old socket is gone
	c.flush(time.Now().Add(time.Second))
	regs, corr := decode(t, received(t, l))
	if len(regs) != 1 || len(corr) != 1 || corr[0].count != 1 {
		t.Errorf("on the new socket: %d registrations, correlations %+v; want 1 and one of count 1", len(regs), corr)
	}
	if s := c.Stats(); s.Registrations != 2 || s.SamplesDropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

// Package applog reads what the test application (../app.c) prints: when
// it loaded the agent and published its process storage, the windows in
// which each worker thread was in a transaction or outside any, and the
// datagrams the profiler sent it. The correlation tests (test/e2e,
// test/integration) hold the profiler's samples against it.
package applog

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Log is what one run of the application printed. Times are CLOCK_REALTIME
// nanoseconds.
type Log struct {
	Loaded, Published uint64
	Txs               []Tx
	Idles             []Window
	Msgs              []Message
}

// Window is a span of time of one thread.
type Window struct {
	TID        int
	Start, End uint64
}

// Inside reports whether a sample of thread tid at time at lies in the
// window by more than slack at both ends: the application reads its clock
// around set_trace, so a sample within slack of an end may belong to
// either side.
func (w Window) Inside(tid int, at, slack uint64) bool {
	return tid == w.TID && at > w.Start+slack && at+slack < w.End
}

// Tx is a window in which the thread was in a transaction.
type Tx struct {
	Window
	TraceID       [16]byte
	TransactionID [8]byte
	SpanID        [8]byte
}

// Message is a datagram the application received.
type Message struct {
	At   uint64
	Data []byte
}

// Parse parses the application's standard output.
func Parse(out string) (*Log, error) {
	l := &Log{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if err := l.parseLine(strings.Fields(sc.Text())); err != nil {
			return nil, fmt.Errorf("app output line %q: %w", sc.Text(), err)
		}
	}
	return l, sc.Err()
}

func (l *Log) parseLine(f []string) error {
	var err error
	num := func(s string) uint64 {
		n, e := strconv.ParseUint(s, 10, 64)
		if e != nil && err == nil {
			err = e
		}
		return n
	}
	id := func(dst []byte, s string) {
		b, e := hex.DecodeString(s)
		if (e != nil || len(b) != len(dst)) && err == nil {
			err = fmt.Errorf("bad id %q", s)
		}
		copy(dst, b)
	}
	switch {
	case len(f) == 2 && f[0] == "loaded":
		l.Loaded = num(f[1])
	case len(f) == 2 && f[0] == "published":
		l.Published = num(f[1])
	case len(f) == 4 && f[0] == "idle":
		l.Idles = append(l.Idles, Window{int(num(f[1])), num(f[2]), num(f[3])})
	case len(f) == 7 && f[0] == "tx":
		w := Tx{Window: Window{int(num(f[1])), num(f[5]), num(f[6])}}
		id(w.TraceID[:], f[2])
		id(w.TransactionID[:], f[3])
		id(w.SpanID[:], f[4])
		l.Txs = append(l.Txs, w)
	case len(f) == 3 && f[0] == "msg":
		b, e := hex.DecodeString(f[2])
		if e != nil {
			return e
		}
		l.Msgs = append(l.Msgs, Message{num(f[1]), b})
	default:
		return errors.New("unexpected line")
	}
	return err
}

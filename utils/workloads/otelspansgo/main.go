// Command otelspansgo is the Go twin of utils/workloads/otelspans.c:
// OpenTelemetry thread contexts written from OTEP 4947 by Go code. The OTEP
// leaves Go out (its SDKs publish pprof labels), so the pointer
// otel_thread_ctx_v1 is a C thread-local (cgo, exported to .dynsym by
// -rdynamic) and
// each span's goroutine stays on its thread (runtime.LockOSThread); the
// records are C memory, built by Go. Two threads go in and out of spans
// (60 ms in main.inSpan, 30 ms out in main.noSpan), attributes
// http.route=/api/<thread> and tenant=tenant-<thread>.
//
// Usage: otelspansgo SECONDS; prints each span as otelspans does:
//
//	span <thread 0|1> <tid> <start ns> <end ns> <trace id hex> <span id hex>
package main

/*
#cgo LDFLAGS: -rdynamic
#include <stdlib.h>

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;

static void attach(void *record)
{
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  otel_thread_ctx_v1 = record;
}
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/utils/workloads/internal/procctx"
)

// recordSize is a record's room: the OTEP's recommended 640 bytes.
const recordSize = 640

var sink uint64

//go:noinline
func spin(until time.Time) {
	for time.Now().Before(until) {
		for i := uint64(0); i < 20_000; i++ {
			sink += i * i
		}
	}
}

//go:noinline
func inSpan(until time.Time) { spin(until) }

//go:noinline
func noSpan(until time.Time) { spin(until) }

type spanLog struct {
	k, tid     int
	start, end int64
	trace      [16]byte
	span       [8]byte
}

// fill writes span n of thread k into a record: ids, valid, trace flags,
// then the attributes (key index, length, value).
func fill(rec []byte, k, n int) (trace [16]byte, span [8]byte) {
	clear(rec)
	for i := range trace {
		trace[i] = byte(0x10*(k+1) + i + n)
	}
	for i := range span {
		span[i] = byte(0xa0 + 0x10*k + i + 3*n)
	}
	copy(rec[0:], trace[:])
	copy(rec[16:], span[:])
	rec[25] = 1 // sampled
	attrs := rec[28:28]
	for key, v := range []string{fmt.Sprintf("/api/%d", k), fmt.Sprintf("tenant-%d", k)} {
		attrs = append(append(attrs, byte(key), byte(len(v))), v...)
	}
	binary.NativeEndian.PutUint16(rec[26:], uint16(len(attrs)))
	rec[24] = 1 // valid, last
	return trace, span
}

func worker(k int, end time.Time) []spanLog {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var bufs [2][]byte
	for i := range bufs {
		p := C.malloc(recordSize)
		bufs[i] = unsafe.Slice((*byte)(p), recordSize)
	}
	var logs []spanLog
	for n := 0; time.Now().Before(end); n++ {
		rec := bufs[n%2]
		l := spanLog{k: k, tid: unix.Gettid()}
		l.trace, l.span = fill(rec, k, n)
		l.start = time.Now().UnixNano()
		C.attach(unsafe.Pointer(&rec[0]))
		inSpan(time.Now().Add(60 * time.Millisecond))
		C.attach(nil)
		l.end = time.Now().UnixNano()
		logs = append(logs, l)
		noSpan(time.Now().Add(30 * time.Millisecond))
	}
	return logs
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: otelspansgo SECONDS")
		os.Exit(2)
	}
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "SECONDS is a number")
		os.Exit(2)
	}
	if _, err := procctx.Publish("spans-go", "1.0", []string{"http.route", "tenant"}); err != nil {
		fmt.Fprintln(os.Stderr, "publishing the process context:", err)
		os.Exit(1)
	}
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	logs := make([][]spanLog, 2)
	for k := range logs {
		wg.Add(1)
		go func() { defer wg.Done(); logs[k] = worker(k, end) }()
	}
	wg.Wait()
	for _, ls := range logs {
		for _, l := range ls {
			fmt.Printf("span %d %d %d %d %x %x\n", l.k, l.tid, l.start, l.end, l.trace, l.span)
		}
	}
}

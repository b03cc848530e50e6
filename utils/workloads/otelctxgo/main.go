// Command otelctxgo is the Go twin of utils/workloads/otelctx/otelctx.c: it
// publishes an OpenTelemetry process context as OTEP 4719 specifies it
// (written from its text), then updates it while it runs.
//
// Usage: otelctxgo SECONDS UPDATE_AT SERVICE (as otelctx: service.version
// 1.0 in main.beforeUpdate, 2.0 in main.afterUpdate, "updated <ns>" printed
// between them; telemetry.sdk.language=go).
package main

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"
)

// header is the OTEP's header: its fields in order, naturally aligned.
type header struct {
	signature   [8]byte
	version     uint32
	payloadSize uint32
	publishedAt uint64 // 0 while being updated; written last
	payload     uint64
}

var (
	hdr *header
	// payload keeps the published payload alive (Go's heap does not move
	// it).
	payload []byte
)

func attr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// encode is a ProcessContext: field 1, the Resource.
func encode(service, version string) []byte {
	r, err := proto.Marshal(&resourcepb.Resource{Attributes: []*commonpb.KeyValue{
		attr("service.name", service), attr("service.version", version),
		attr("deployment.environment.name", "test"), attr("telemetry.sdk.language", "go")}})
	if err != nil {
		panic(err)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, r)
}

func boottime() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}

func nameMapping() {
	// Unconditionally, errors ignored: a reader may hook the call.
	name := []byte("OTEL_CTX\x00")
	_ = unix.Prctl(unix.PR_SET_VMA, unix.PR_SET_VMA_ANON_NAME, uintptr(unsafe.Pointer(hdr)),
		unsafe.Sizeof(*hdr), uintptr(unsafe.Pointer(&name[0])))
}

func publish(service, version string) error {
	page := os.Getpagesize()
	var mem []byte
	fd, err := unix.MemfdCreate("OTEL_CTX", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_NOEXEC_SEAL)
	if err != nil {
		fd, err = unix.MemfdCreate("OTEL_CTX", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err == nil {
		if err = unix.Ftruncate(fd, int64(page)); err == nil {
			mem, err = unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		}
		unix.Close(fd)
	}
	if err != nil {
		if mem, err = unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
			return err
		}
	}
	_ = unix.Madvise(mem, unix.MADV_DONTFORK)
	hdr = (*header)(unsafe.Pointer(&mem[0]))
	payload = encode(service, version)
	copy(hdr.signature[:], "OTEL_CTX")
	hdr.version = 2
	hdr.payloadSize = uint32(len(payload))
	hdr.payload = uint64(uintptr(unsafe.Pointer(&payload[0])))
	// Go's atomics are sequentially consistent: the fields above are
	// visible before the timestamp.
	atomic.StoreUint64(&hdr.publishedAt, boottime())
	nameMapping()
	return nil
}

func update(service, version string) {
	next := encode(service, version)
	old := atomic.LoadUint64(&hdr.publishedAt)
	atomic.StoreUint64(&hdr.publishedAt, 0)
	atomic.StoreUint64(&hdr.payload, uint64(uintptr(unsafe.Pointer(&next[0]))))
	atomic.StoreUint32(&hdr.payloadSize, uint32(len(next)))
	atomic.StoreUint64(&hdr.publishedAt, max(boottime(), old+1))
	payload = next
	nameMapping()
}

var sink uint64

//go:noinline
func spin(until time.Time) {
	for time.Now().Before(until) {
		for i := uint64(0); i < 100_000; i++ {
			sink += i * i
		}
	}
}

//go:noinline
func beforeUpdate(until time.Time) { spin(until) }

//go:noinline
func afterUpdate(until time.Time) { spin(until) }

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: otelctxgo SECONDS UPDATE_AT SERVICE")
		os.Exit(2)
	}
	seconds, err1 := strconv.ParseFloat(os.Args[1], 64)
	at, err2 := strconv.ParseFloat(os.Args[2], 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "SECONDS and UPDATE_AT are numbers")
		os.Exit(2)
	}
	start := time.Now()
	if err := publish(os.Args[3], "1.0"); err != nil {
		fmt.Fprintln(os.Stderr, "publishing the process context:", err)
		os.Exit(1)
	}
	beforeUpdate(start.Add(time.Duration(at * float64(time.Second))))
	update(os.Args[3], "2.0")
	fmt.Printf("updated %d\n", time.Now().UnixNano())
	afterUpdate(start.Add(time.Duration(seconds * float64(time.Second))))
}

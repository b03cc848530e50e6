// Package procctx publishes an OpenTelemetry process context as OTEP 4719
// specifies it (oteps/profiles/4719-process-ctx.md in
// open-telemetry/opentelemetry-specification; written from its text), for
// the Go test workloads: a memfd (or anonymous) mapping named OTEL_CTX
// whose 32-byte header points at a ProcessContext protobuf.
package procctx

import (
	"os"
	"sync/atomic"
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

// Context is a published process context.
type Context struct {
	hdr *header
	// payload keeps the published payload alive (Go's heap does not
	// move it).
	payload []byte
}

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// encode is a ProcessContext: field 1 the Resource; field 2 the thread
// contexts' schema and key table (OTEP 4947) when threadKeys is not nil.
func encode(service, version string, threadKeys []string) []byte {
	r, err := proto.Marshal(&resourcepb.Resource{Attributes: []*commonpb.KeyValue{
		str("service.name", service), str("service.version", version),
		str("deployment.environment.name", "test"), str("telemetry.sdk.language", "go")}})
	if err != nil {
		panic(err)
	}
	b := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), r)
	if threadKeys == nil {
		return b
	}
	var keys []*commonpb.AnyValue
	for _, k := range threadKeys {
		keys = append(keys, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: k}})
	}
	for _, kv := range []*commonpb.KeyValue{str("threadlocal.schema_version", "tlsdesc_v1_dev"),
		{Key: "threadlocal.attribute_key_map", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{
			ArrayValue: &commonpb.ArrayValue{Values: keys}}}}} {
		e, err := proto.Marshal(kv)
		if err != nil {
			panic(err)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), e)
	}
	return b
}

func boottime() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}

func (c *Context) nameMapping() {
	// Unconditionally, errors ignored: a reader may hook the call.
	name := []byte("OTEL_CTX\x00")
	_ = unix.Prctl(unix.PR_SET_VMA, unix.PR_SET_VMA_ANON_NAME, uintptr(unsafe.Pointer(c.hdr)),
		unsafe.Sizeof(*c.hdr), uintptr(unsafe.Pointer(&name[0])))
}

// Publish publishes a context: the OTEP's publication protocol.
func Publish(service, version string, threadKeys []string) (*Context, error) {
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
			return nil, err
		}
	}
	_ = unix.Madvise(mem, unix.MADV_DONTFORK)
	c := &Context{hdr: (*header)(unsafe.Pointer(&mem[0])), payload: encode(service, version, threadKeys)}
	copy(c.hdr.signature[:], "OTEL_CTX")
	c.hdr.version = 2
	c.hdr.payloadSize = uint32(len(c.payload))
	c.hdr.payload = uint64(uintptr(unsafe.Pointer(&c.payload[0])))
	// Go's atomics are sequentially consistent: the fields above are
	// visible before the timestamp.
	atomic.StoreUint64(&c.hdr.publishedAt, boottime())
	c.nameMapping()
	return c, nil
}

// Update publishes a new resource: the OTEP's update protocol.
func (c *Context) Update(service, version string, threadKeys []string) {
	next := encode(service, version, threadKeys)
	old := atomic.LoadUint64(&c.hdr.publishedAt)
	atomic.StoreUint64(&c.hdr.publishedAt, 0)
	atomic.StoreUint64(&c.hdr.payload, uint64(uintptr(unsafe.Pointer(&next[0]))))
	atomic.StoreUint32(&c.hdr.payloadSize, uint32(len(next)))
	atomic.StoreUint64(&c.hdr.publishedAt, max(boottime(), old+1))
	c.payload = next
	c.nameMapping()
}

// Package processctx reads the OpenTelemetry process context a process
// publishes (OTEP 4719, oteps/profiles/4719-process-ctx.md in
// open-telemetry/opentelemetry-specification): its SDK's resource
// (service.name, service.version, deployment.environment.name, …) and
// extra attributes, among them the key table of its threads' contexts
// (OTEP 4947). The process names one mapping OTEL_CTX; its start holds a
// header that points at a protobuf payload:
//
//	0  signature "OTEL_CTX" (8 bytes, no NUL)
//	8  version (u32): 2 (1 in development)
//	12 payload size (u32)
//	16 published-at (u64): 0 while the writer updates it
//	24 payload pointer (u64)
//
// in the process's byte order, little-endian on x86_64 and arm64 (the OTEP gives the fields and their order;
// the offsets follow from their alignment, as every writer lays them out).
// A reader copies the payload between two reads of published-at and
// retries when they differ, or when it is 0: the writer zeroes it,
// swaps the payload, and sets it again. The process's memory is hostile
// input: sizes are bounded, the payload is decoded defensively.
package processctx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"
)

// The names the process context's mapping has in /proc/PID/maps: a memfd
// named by prctl(PR_SET_VMA_ANON_NAME), anonymous memory so named, or a
// memfd the kernel could not name (as the maps reader shows it, without
// " (deleted)").
var mappingNames = []string{"[anon_shmem:OTEL_CTX]", "[anon:OTEL_CTX]", "/memfd:OTEL_CTX"}

// IsMapping says whether a mapping of path (as the maps reader gives it)
// and permissions is a process context's.
func IsMapping(path string, executable bool) bool {
	if executable {
		return false
	}
	for _, n := range mappingNames {
		if path == n {
			return true
		}
	}
	return false
}

// Layout of the header.
const (
	signature   = "OTEL_CTX"
	headerSize  = 32
	offVersion  = 8
	offSize     = 12
	offPubAt    = 16
	offPayload  = 24
	maxAttempts = 3
	// MaxPayload bounds the payload read: the OTEP expects kilobytes.
	MaxPayload = 64 << 10
	// maxAttributes and maxValueBytes bound what is kept of it.
	maxAttributes = 128
	maxValueBytes = 4096
	// maxKeys is the most keys a thread context's key table has (its
	// indexes are bytes).
	maxKeys = 256
)

// Errors of Read. ErrUpdating is expected now and then: the writer was
// updating it every time it was read.
var (
	ErrNotContext = errors.New("not an OpenTelemetry process context")
	ErrUpdating   = errors.New("process context updated while read")
	ErrTooLarge   = errors.New("process context payload too large")
	ErrMalformed  = errors.New("malformed process context payload")
)

// Attribute is one attribute, its value as a string (numbers and booleans
// formatted; arrays and maps left out).
type Attribute struct{ Key, Value string }

// Context is what a process published.
type Context struct {
	// PublishedAt tells one publication from the next.
	PublishedAt uint64
	// Resource are the SDK's resource attributes, in the order published.
	Resource []Attribute
	// SchemaVersion and KeyMap are the thread contexts' schema
	// ("threadlocal.schema_version") and attribute key table
	// ("threadlocal.attribute_key_map": a record's key index is a
	// position in it), from the extra attributes; empty without.
	SchemaVersion string
	KeyMap        []string
	// Extra are the other extra attributes.
	Extra []Attribute
}

// Get is the value of a resource attribute, "" without one.
func (c *Context) Get(key string) string {
	for _, a := range c.Resource {
		if a.Key == key {
			return a.Value
		}
	}
	return ""
}

// PublishedAt reads the header's published-at field alone: a reader
// that holds a context reads the payload again only when it changed.
// Zero while the writer updates it.
func PublishedAt(mem io.ReaderAt, addr uint64) (uint64, error) {
	var b [8]byte
	if _, err := mem.ReadAt(b[:], int64(addr+offPubAt)); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Read reads the context whose header is at addr in mem (the process's
// memory), retrying a read torn by an update up to three times.
func Read(mem io.ReaderAt, addr uint64) (*Context, error) {
	var err error
	for range maxAttempts {
		var c *Context
		if c, err = readOnce(mem, addr); !errors.Is(err, ErrUpdating) {
			return c, err
		}
	}
	return nil, err
}

func readOnce(mem io.ReaderAt, addr uint64) (*Context, error) {
	var h [headerSize]byte
	if _, err := mem.ReadAt(h[:], int64(addr)); err != nil {
		return nil, fmt.Errorf("reading the process context's header: %w", err)
	}
	le := binary.LittleEndian
	if string(h[:offVersion]) != signature {
		return nil, fmt.Errorf("%w: signature %q", ErrNotContext, h[:offVersion])
	}
	if v := le.Uint32(h[offVersion:]); v != 1 && v != 2 {
		return nil, fmt.Errorf("%w: version %d", ErrNotContext, v)
	}
	pubAt, size, ptr := le.Uint64(h[offPubAt:]), le.Uint32(h[offSize:]), le.Uint64(h[offPayload:])
	if pubAt == 0 {
		return nil, ErrUpdating
	}
	if size > MaxPayload {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, size)
	}
	payload := make([]byte, size)
	_, readErr := mem.ReadAt(payload, int64(ptr))
	// The payload may have been freed by an update in the meantime: the
	// second read of published-at says whether the copy holds.
	after, err := PublishedAt(mem, addr)
	if err != nil {
		return nil, fmt.Errorf("reading the process context's header: %w", err)
	}
	if after != pubAt {
		return nil, ErrUpdating
	}
	if readErr != nil {
		return nil, fmt.Errorf("reading the process context's payload: %w", readErr)
	}
	c, err := Decode(payload)
	if err != nil {
		return nil, err
	}
	c.PublishedAt = pubAt
	return c, nil
}

// Decode decodes a payload: the protobuf message ProcessContext
// (opentelemetry/proto/processcontext/v1development in
// open-telemetry/opentelemetry-proto): field 1 the Resource, field 2
// repeated KeyValue.
func Decode(b []byte) (*Context, error) {
	c := &Context{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 {
			var r resourcepb.Resource
			if err := proto.Unmarshal(v, &r); err != nil {
				return nil, fmt.Errorf("%w: resource: %v", ErrMalformed, err)
			}
			for _, kv := range r.Attributes {
				if s, ok := stringOf(kv.GetValue()); ok && len(c.Resource) < maxAttributes && kv.Key != "" {
					c.Resource = append(c.Resource, Attribute{Key: kv.Key, Value: s})
				}
			}
			continue
		}
		var kv commonpb.KeyValue
		if err := proto.Unmarshal(v, &kv); err != nil {
			return nil, fmt.Errorf("%w: attribute: %v", ErrMalformed, err)
		}
		c.extra(&kv)
	}
	return c, nil
}

// extra takes one extra attribute: the thread contexts' schema and key
// table, or another.
func (c *Context) extra(kv *commonpb.KeyValue) {
	switch kv.Key {
	case "threadlocal.schema_version":
		c.SchemaVersion, _ = stringOf(kv.GetValue())
	case "threadlocal.attribute_key_map":
		c.KeyMap = c.KeyMap[:0]
		for _, v := range kv.GetValue().GetArrayValue().GetValues() {
			if len(c.KeyMap) == maxKeys {
				break
			}
			s, _ := stringOf(v)
			c.KeyMap = append(c.KeyMap, s)
		}
	default:
		if s, ok := stringOf(kv.GetValue()); ok && len(c.Extra) < maxAttributes && kv.Key != "" {
			c.Extra = append(c.Extra, Attribute{Key: kv.Key, Value: s})
		}
	}
}

// stringOf formats a scalar value; false for arrays, maps and none.
func stringOf(v *commonpb.AnyValue) (string, bool) {
	var s string
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		s = x.StringValue
	case *commonpb.AnyValue_BoolValue:
		s = strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		s = strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		if math.IsNaN(x.DoubleValue) || math.IsInf(x.DoubleValue, 0) {
			return "", false
		}
		s = strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	default:
		return "", false
	}
	if len(s) > maxValueBytes {
		s = s[:maxValueBytes]
	}
	return s, true
}

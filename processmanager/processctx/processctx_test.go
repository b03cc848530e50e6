package processctx

import (
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"
)

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// payload encodes a ProcessContext as a writer would.
func payload(t testing.TB, resource []*commonpb.KeyValue, extra ...*commonpb.KeyValue) []byte {
	t.Helper()
	r, err := proto.Marshal(&resourcepb.Resource{Attributes: resource})
	if err != nil {
		t.Fatal(err)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, r)
	for _, kv := range extra {
		e, err := proto.Marshal(kv)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// memory is a process's memory: a header at headerAt, the payload at
// payloadAt; onRead runs before each read (a writer updating it).
type memory struct {
	data   map[uint64][]byte
	onRead func(m *memory)
}

func (m *memory) ReadAt(p []byte, off int64) (int, error) {
	if m.onRead != nil {
		m.onRead(m)
	}
	for base, d := range m.data {
		if uint64(off) >= base && uint64(off)+uint64(len(p)) <= base+uint64(len(d)) {
			return copy(p, d[uint64(off)-base:]), nil
		}
	}
	return 0, io.EOF
}

const headerAt, payloadAt = 0x7f0000000000, 0x55aa00001000

func header(version uint32, size int, pubAt uint64, ptr uint64) []byte {
	h := make([]byte, headerSize)
	copy(h, signature)
	le := binary.LittleEndian
	le.PutUint32(h[offVersion:], version)
	le.PutUint32(h[offSize:], uint32(size))
	le.PutUint64(h[offPubAt:], pubAt)
	le.PutUint64(h[offPayload:], ptr)
	return h
}

func TestRead(t *testing.T) {
	keys := &commonpb.KeyValue{Key: "threadlocal.attribute_key_map", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{
		ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{
			{Value: &commonpb.AnyValue_StringValue{StringValue: "http.route"}},
			{Value: &commonpb.AnyValue_StringValue{StringValue: "tenant"}}}}}}}
	p := payload(t, []*commonpb.KeyValue{str("service.name", "checkout"), str("service.version", "1.4.2"),
		{Key: "process.pid", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 42}}}},
		str("threadlocal.schema_version", "tlsdesc_v1_dev"), keys, str("team", "payments"))
	mem := &memory{data: map[uint64][]byte{headerAt: header(2, len(p), 1234, payloadAt), payloadAt: p}}
	c, err := Read(mem, headerAt)
	if err != nil {
		t.Fatal(err)
	}
	want := []Attribute{{"service.name", "checkout"}, {"service.version", "1.4.2"}, {"process.pid", "42"}}
	if !slices.Equal(c.Resource, want) || c.Get("service.name") != "checkout" || c.PublishedAt != 1234 {
		t.Errorf("resource %v (published at %d), want %v", c.Resource, c.PublishedAt, want)
	}
	if c.SchemaVersion != "tlsdesc_v1_dev" || !slices.Equal(c.KeyMap, []string{"http.route", "tenant"}) ||
		!slices.Equal(c.Extra, []Attribute{{"team", "payments"}}) {
		t.Errorf("schema %q keys %v extra %v", c.SchemaVersion, c.KeyMap, c.Extra)
	}

	// A writer that updates on every read: given up after three tries.
	torn := &memory{data: map[uint64][]byte{headerAt: header(2, len(p), 1, payloadAt), payloadAt: p}}
	torn.onRead = func(m *memory) {
		h := m.data[headerAt]
		binary.LittleEndian.PutUint64(h[offPubAt:], binary.LittleEndian.Uint64(h[offPubAt:])+1)
	}
	if _, err := Read(torn, headerAt); !errors.Is(err, ErrUpdating) {
		t.Errorf("torn reads: %v, want ErrUpdating", err)
	}
	// One update in the middle of the first read: the second holds.
	reads := 0
	once := &memory{data: map[uint64][]byte{headerAt: header(2, len(p), 1, payloadAt), payloadAt: p}}
	once.onRead = func(m *memory) {
		if reads++; reads == 2 {
			binary.LittleEndian.PutUint64(m.data[headerAt][offPubAt:], 2)
		}
	}
	if c, err := Read(once, headerAt); err != nil || c.PublishedAt != 2 {
		t.Errorf("read after an update: %+v, %v", c, err)
	}

	for name, c := range map[string]struct {
		h    []byte
		want error
	}{
		"bad signature": {append([]byte("OTEL_CTY"), header(2, len(p), 1, payloadAt)[8:]...), ErrNotContext},
		"version 3":     {header(3, len(p), 1, payloadAt), ErrNotContext},
		"updating":      {header(2, len(p), 0, payloadAt), ErrUpdating},
		"too large":     {header(2, MaxPayload+1, 1, payloadAt), ErrTooLarge},
		"bad pointer":   {header(2, len(p), 1, 0x1000), io.EOF},
	} {
		mem := &memory{data: map[uint64][]byte{headerAt: c.h, payloadAt: p}}
		if _, err := Read(mem, headerAt); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

func TestIsMapping(t *testing.T) {
	for path, want := range map[string]bool{"[anon_shmem:OTEL_CTX]": true, "[anon:OTEL_CTX]": true,
		"/memfd:OTEL_CTX": true, "/memfd:OTEL_CTX_BACKUP": false, "[anon:OTEL]": false, "": false} {
		if IsMapping(path, false) != want || IsMapping(path, true) {
			t.Errorf("IsMapping(%q) wrong", path)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(payload(f, []*commonpb.KeyValue{str("service.name", "checkout")}, str("threadlocal.schema_version", "v")))
	f.Add([]byte{0x0a, 0x80, 0x80, 0x80, 0x80, 0x10})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Decode(b)
		if err != nil {
			return
		}
		if len(c.Resource) > maxAttributes || len(c.Extra) > maxAttributes || len(c.KeyMap) > maxKeys {
			t.Fatalf("unbounded: %d resource, %d extra, %d keys", len(c.Resource), len(c.Extra), len(c.KeyMap))
		}
	})
}

// BenchmarkRead reads a context with the C reference writer's seven
// resource attributes and a two-key thread key table: B/op is what a
// process's context costs to read (its Context keeps most of it).
func BenchmarkRead(b *testing.B) {
	var res []*commonpb.KeyValue
	for _, k := range []string{"deployment.environment.name", "service.instance.id", "service.name", "service.version",
		"telemetry.sdk.language", "telemetry.sdk.version", "telemetry.sdk.name"} {
		res = append(res, str(k, "value-of-"+k))
	}
	keys := &commonpb.KeyValue{Key: "threadlocal.attribute_key_map", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{
		ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{
			{Value: &commonpb.AnyValue_StringValue{StringValue: "http.route"}},
			{Value: &commonpb.AnyValue_StringValue{StringValue: "tenant"}}}}}}}
	p := payload(b, res, str("threadlocal.schema_version", "tlsdesc_v1_dev"), keys)
	mem := &memory{data: map[uint64][]byte{headerAt: header(2, len(p), 1, payloadAt), payloadAt: p}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Read(mem, headerAt); err != nil {
			b.Fatal(err)
		}
	}
}

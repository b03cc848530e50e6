package e2e

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"
)

// The slim collector module has no generated gRPC client; invoke the method
// by name.
const profilesExportMethod = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"

// sendProfiles sends one ExportProfilesServiceRequest over insecure gRPC.
func sendProfiles(ctx context.Context, addr string, req *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp := &collectorpb.ExportProfilesServiceResponse{}
	if err := conn.Invoke(ctx, profilesExportMethod, req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// handMadeRequest builds a small but complete request that sets every field
// of the v0.4.0 profiles messages, so that a round trip through the collector
// shows whether both sides agree on the wire format.
//
// Dictionary rule: every table has its zero value at index 0
// (string_table[0] == "", mapping_table[0] == {}, ...).
//
// Samples carried (counted the way collector.SampleCount does): host "a": 3+4 values
// and one sample with 2 timestamps but no values -> 9; host "b": 5 -> 5.
// Total 14 samples, 2 resources, 3 profiles.
func handMadeRequest(seq int) (req *collectorpb.ExportProfilesServiceRequest, samples int64, resources, profiles int) {
	strs := []string{""}
	str := func(s string) int32 {
		for i, v := range strs {
			if v == s {
				return int32(i)
			}
		}
		strs = append(strs, s)
		return int32(len(strs) - 1)
	}
	now := uint64(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()) + uint64(seq)*uint64(time.Minute)

	dict := &profilespb.ProfilesDictionary{
		MappingTable: []*profilespb.Mapping{
			{},
			{MemoryStart: 0x400000, MemoryLimit: 0x500000, FileOffset: 0x1000,
				FilenameStrindex: str("/usr/bin/app"), AttributeIndices: []int32{1}},
		},
		FunctionTable: []*profilespb.Function{
			{},
			{NameStrindex: str("main"), SystemNameStrindex: str("main.main"), FilenameStrindex: str("main.go"), StartLine: 10},
			{NameStrindex: str("work"), SystemNameStrindex: str("main.work"), FilenameStrindex: str("work.go"), StartLine: 20},
		},
		LocationTable: []*profilespb.Location{
			{},
			{MappingIndex: 1, Address: 0x401234, Lines: []*profilespb.Line{{FunctionIndex: 1, Line: 12, Column: 3}}, AttributeIndices: []int32{2}},
			{MappingIndex: 1, Address: 0x405678, Lines: []*profilespb.Line{{FunctionIndex: 2, Line: 25, Column: 7}}},
		},
		LinkTable: []*profilespb.Link{
			{},
			{TraceId: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, SpanId: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		},
		AttributeTable: []*profilespb.KeyValueAndUnit{
			{},
			{KeyStrindex: str("process.executable.build_id.htlhash"), Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "0123456789abcdef"}}},
			{KeyStrindex: str("profile.frame.type"), Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "native"}}},
			{KeyStrindex: str("thread.name"), Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "worker"}}, UnitStrindex: str("1")},
		},
		StackTable: []*profilespb.Stack{
			{},
			{LocationIndices: []int32{2, 1}}, // leaf first: work <- main
			{LocationIndices: []int32{1}},
		},
	}

	profile := func(id byte, start uint64, smp []*profilespb.Sample) *profilespb.Profile {
		return &profilespb.Profile{
			SampleType:             &profilespb.ValueType{TypeStrindex: str("samples"), UnitStrindex: str("count")},
			Samples:                smp,
			TimeUnixNano:           start,
			DurationNano:           uint64(time.Second),
			PeriodType:             &profilespb.ValueType{TypeStrindex: str("cpu"), UnitStrindex: str("nanoseconds")},
			Period:                 int64(10 * time.Millisecond),
			ProfileId:              []byte{id, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
			DroppedAttributesCount: 1,
			OriginalPayloadFormat:  "none",
			OriginalPayload:        []byte("e2e"),
			AttributeIndices:       []int32{3},
		}
	}
	scope := &commonpb.InstrumentationScope{Name: "e2e-test", Version: "1.0.0", Attributes: []*commonpb.KeyValue{strAttr("k", "v")}, DroppedAttributesCount: 1}

	req = &collectorpb.ExportProfilesServiceRequest{
		ResourceProfiles: []*profilespb.ResourceProfiles{
			{
				Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("host.name", "a"), strAttr("service.name", "e2e")}, DroppedAttributesCount: 1},
				ScopeProfiles: []*profilespb.ScopeProfiles{{
					Scope: scope,
					Profiles: []*profilespb.Profile{
						profile(1, now, []*profilespb.Sample{
							{StackIndex: 1, Values: []int64{3}, AttributeIndices: []int32{3}, LinkIndex: 1, TimestampsUnixNano: []uint64{now + 1, now + 2, now + 3}},
							{StackIndex: 2, Values: []int64{4}},
						}),
						profile(2, now, []*profilespb.Sample{
							{StackIndex: 1, TimestampsUnixNano: []uint64{now + 10, now + 20}},
						}),
					},
					SchemaUrl: "https://opentelemetry.io/schemas/1.37.0",
				}},
				SchemaUrl: "https://opentelemetry.io/schemas/1.37.0",
			},
			{
				Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("host.name", "b")}, DroppedAttributesCount: 1},
				ScopeProfiles: []*profilespb.ScopeProfiles{{
					Scope: scope,
					Profiles: []*profilespb.Profile{
						profile(3, now, []*profilespb.Sample{{StackIndex: 2, Values: []int64{5}, AttributeIndices: []int32{3}}}),
					},
					SchemaUrl: "https://opentelemetry.io/schemas/1.37.0",
				}},
				SchemaUrl: "https://opentelemetry.io/schemas/1.37.0",
			},
		},
		Dictionary: dict,
	}
	dict.StringTable = strs
	if strs[0] != "" {
		panic(fmt.Sprintf("string_table[0] = %q", strs[0]))
	}
	return req, 14, 2, 3
}

package reporter

import (
	"github.com/hostprof/ebpf-profiler/libpf"
	"strings"
	"testing"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"
)

func TestValidateAcceptsValid(t *testing.T) {
	minimal := &collectorpb.ExportProfilesServiceRequest{Dictionary: &profilespb.ProfilesDictionary{
		MappingTable:   []*profilespb.Mapping{{}},
		LocationTable:  []*profilespb.Location{{}},
		FunctionTable:  []*profilespb.Function{{}},
		LinkTable:      []*profilespb.Link{{}}, // empty ids are also a valid zero link
		StringTable:    []string{""},
		AttributeTable: []*profilespb.KeyValueAndUnit{{}},
		StackTable:     []*profilespb.Stack{{}},
	}}
	for name, req := range map[string]*collectorpb.ExportProfilesServiceRequest{
		"minimal": minimal,
		"fixture": buildRequest(newFixture().interval(), testOptions()).req,
	} {
		if err := Validate(req); err != nil {
			t.Errorf("%s: Validate = %v, want nil", name, err)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	type req = collectorpb.ExportProfilesServiceRequest
	dict := func(r *req) *profilespb.ProfilesDictionary { return r.Dictionary }
	prof := func(r *req) *profilespb.Profile { return r.ResourceProfiles[0].ScopeProfiles[0].Profiles[0] }
	sample := func(r *req) *profilespb.Sample { return prof(r).Samples[0] }
	// attrWithKey finds an attribute index whose key is k.
	attrWithKey := func(r *req, k string) int32 {
		d := dict(r)
		for i, a := range d.AttributeTable {
			if d.StringTable[a.KeyStrindex] == k {
				return int32(i)
			}
		}
		t.Fatalf("no attribute with key %q", k)
		return 0
	}
	tests := []struct {
		name    string
		mutate  func(r *req)
		wantErr string
	}{
		{"nil dictionary", func(r *req) { r.Dictionary = nil }, "no dictionary"},
		{"empty string table", func(r *req) { dict(r).StringTable = nil }, "string_table[0]"},
		{"string 0 not empty", func(r *req) { dict(r).StringTable[0] = "x" }, "string_table[0]"},
		{"duplicate string", func(r *req) { d := dict(r); d.StringTable = append(d.StringTable, d.StringTable[1]) },
			"duplicates string_table[1]"},
		{"empty mapping table", func(r *req) { dict(r).MappingTable = nil }, "mapping_table is empty"},
		{"zero htlhash", func(r *req) {
			a := dict(r).AttributeTable[attrWithKey(r, attrBuildIDHTL)]
			a.Value = stringValue(libpf.FileID{}.String())
		}, "zero file id"},
		{"short htlhash", func(r *req) {
			a := dict(r).AttributeTable[attrWithKey(r, attrBuildIDHTL)]
			a.Value = stringValue("abcd")
		}, "not 32 hex digits"},
		{"mapping 0 not zero", func(r *req) { dict(r).MappingTable[0] = &profilespb.Mapping{MemoryStart: 1} },
			"mapping_table[0] is not the zero value"},
		{"location 0 not zero", func(r *req) { dict(r).LocationTable[0] = &profilespb.Location{Address: 1} },
			"location_table[0] is not the zero value"},
		{"function 0 not zero", func(r *req) { dict(r).FunctionTable[0] = &profilespb.Function{StartLine: 1} },
			"function_table[0] is not the zero value"},
		{"link 0 not zero", func(r *req) { dict(r).LinkTable[0].SpanId[0] = 1 }, "link_table[0] is not the zero value"},
		{"attribute 0 not zero", func(r *req) { dict(r).AttributeTable[0] = &profilespb.KeyValueAndUnit{KeyStrindex: 1} },
			"attribute_table[0] is not the zero value"},
		{"stack 0 not zero", func(r *req) { dict(r).StackTable[0] = &profilespb.Stack{LocationIndices: []int32{1}} },
			"stack_table[0] is not the zero value"},
		{"nil location", func(r *req) { dict(r).LocationTable[1] = nil }, "location_table[1] is nil"},
		{"duplicate mapping", func(r *req) { d := dict(r); d.MappingTable = append(d.MappingTable, d.MappingTable[1]) },
			"mapping_table[6] duplicates mapping_table[1]"},
		{"duplicate location", func(r *req) { d := dict(r); d.LocationTable = append(d.LocationTable, d.LocationTable[2]) },
			"location_table[9] duplicates location_table[2]"},
		{"duplicate function", func(r *req) { d := dict(r); d.FunctionTable = append(d.FunctionTable, d.FunctionTable[1]) },
			"function_table[6] duplicates function_table[1]"},
		{"duplicate stack", func(r *req) { d := dict(r); d.StackTable = append(d.StackTable, d.StackTable[1]) },
			"stack_table[5] duplicates stack_table[1]"},
		{"duplicate attribute", func(r *req) { d := dict(r); d.AttributeTable = append(d.AttributeTable, d.AttributeTable[1]) },
			"duplicates attribute_table[1]"},
		{"duplicate link", func(r *req) { d := dict(r); d.LinkTable = append(d.LinkTable, &profilespb.Link{}) },
			"link_table[1] duplicates link_table[0]"},
		{"short trace id", func(r *req) {
			d := dict(r)
			d.LinkTable = append(d.LinkTable, &profilespb.Link{TraceId: []byte{1}, SpanId: make([]byte, 8)})
		}, "trace_id has 1 bytes"},
		{"stack location out of range", func(r *req) { dict(r).StackTable[1].LocationIndices[0] = 99 },
			"stack_table[1]: location_indices[0] 99 out of range"},
		{"location mapping out of range", func(r *req) { dict(r).LocationTable[1].MappingIndex = 99 },
			"location_table[1]: mapping_index 99 out of range"},
		{"line function out of range", func(r *req) { dict(r).LocationTable[1].Lines[0].FunctionIndex = -1 },
			"lines[0].function_index -1 out of range"},
		{"function name out of range", func(r *req) { dict(r).FunctionTable[1].NameStrindex = 9999 },
			"function_table[1]: name_strindex 9999"},
		{"mapping filename out of range", func(r *req) { dict(r).MappingTable[1].FilenameStrindex = 9999 },
			"mapping_table[1]: filename_strindex 9999"},
		{"mapping attribute out of range", func(r *req) { dict(r).MappingTable[1].AttributeIndices[0] = 9999 },
			"mapping_table[1]: attribute_indices[0] 9999"},
		{"attribute key out of range", func(r *req) { dict(r).AttributeTable[1].KeyStrindex = 9999 },
			"attribute_table[1]: key_strindex 9999"},
		{"attribute without key", func(r *req) { dict(r).AttributeTable[1].KeyStrindex = 0 },
			"attribute_table[1]: empty key"},
		{"attribute string value index out of range", func(r *req) {
			dict(r).AttributeTable[1].Value = &commonpb.AnyValue{
				Value: &commonpb.AnyValue_StringValueStrindex{StringValueStrindex: 9999}}
		}, "value.string_value_strindex 9999"},
		{"repeated key in location attributes", func(r *req) {
			l := dict(r).LocationTable[1]
			l.AttributeIndices = append(l.AttributeIndices, attrWithKey(r, attrFrameType)+0)
		}, `attribute key "profile.frame.type" repeated`},
		{"zero attribute referenced", func(r *req) { sample(r).AttributeIndices[0] = 0 },
			"references the zero attribute"},
		{"repeated key in sample attributes", func(r *req) {
			s := sample(r)
			s.AttributeIndices = append(s.AttributeIndices, s.AttributeIndices[0])
		}, `attribute key "thread.id" repeated`},
		{"sample stack out of range", func(r *req) { sample(r).StackIndex = 99 }, "samples[0]: stack_index 99"},
		{"sample link out of range", func(r *req) { sample(r).LinkIndex = 1 }, "samples[0]: link_index 1"},
		{"sample attribute out of range", func(r *req) { sample(r).AttributeIndices[1] = 9999 },
			"samples[0]: attribute_indices[1] 9999"},
		{"values and timestamps differ", func(r *req) { sample(r).Values = []int64{3} },
			"1 values but 3 timestamps"},
		{"empty sample", func(r *req) { s := sample(r); s.Values, s.TimestampsUnixNano = nil, nil },
			"neither values nor timestamps"},
		{"timestamp before window", func(r *req) { sample(r).TimestampsUnixNano[0] = prof(r).TimeUnixNano - 1 },
			"timestamps_unix_nano[0]"},
		{"timestamp at window end", func(r *req) {
			p := prof(r)
			sample(r).TimestampsUnixNano[2] = p.TimeUnixNano + p.DurationNano
		}, "timestamps_unix_nano[2]"},
		{"no sample type", func(r *req) { prof(r).SampleType = nil }, "no sample_type"},
		{"sample type out of range", func(r *req) { prof(r).SampleType.UnitStrindex = 9999 },
			"sample_type.unit_strindex 9999"},
		{"period type out of range", func(r *req) { prof(r).PeriodType.TypeStrindex = -3 },
			"period_type.type_strindex -3"},
		{"profile id length", func(r *req) { prof(r).ProfileId = []byte{1, 2} }, "profile_id has 2 bytes"},
		{"profile attribute out of range", func(r *req) { prof(r).AttributeIndices = []int32{9999} },
			"attribute_indices[0] 9999"},
		{"repeated resource attribute", func(r *req) {
			res := r.ResourceProfiles[1].Resource
			res.Attributes = append(res.Attributes, res.Attributes[0])
		}, `resource_profiles[1]: resource.attributes[12]: key "process.pid" repeated`},
		{"nil resource profiles", func(r *req) { r.ResourceProfiles[0] = nil }, "resource_profiles[0]: nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := buildRequest(newFixture().interval(), testOptions()).req
			if err := Validate(r); err != nil {
				t.Fatalf("fixture invalid before mutation: %v", err)
			}
			tt.mutate(r)
			err := Validate(r)
			if err == nil {
				t.Fatalf("Validate accepted the request, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

package collector

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/encoding/protojson"

	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"
)

// Output of the collector's file exporter (contrib fileexporter v0.159.0,
// format: json): one line per export call, each line one ProfilesData
// (= ExportProfilesServiceRequest) in OTLP/JSON, e.g. (abridged):
//
//	{"resourceProfiles":[{
//	   "resource":{"attributes":[{"keyStrindex":16,"value":{"stringValueStrindex":17}}],"droppedAttributesCount":1},
//	   "scopeProfiles":[{"scope":{"name":"e2e-test","version":"1.0.0"},
//	     "profiles":[{
//	       "sampleType":{"typeStrindex":12,"unitStrindex":13},
//	       "samples":[{"stackIndex":1,"attributeIndices":[3],"linkIndex":1,
//	                   "values":["3"],"timestampsUnixNano":["1767323045000000001"]}],
//	       "timeUnixNano":"1767323045000000000","durationNano":"1000000000",
//	       "periodType":{"typeStrindex":14,"unitStrindex":15},"period":"10000000",
//	       "profileId":"010102030405060708090a0b0c0d0e0f","attributeIndices":[3]}]}],
//	   "schemaUrl":"..."}],
//	 "dictionary":{
//	   "mappingTable":[{},{"memoryStart":"4194304","memoryLimit":"5242880","fileOffset":"4096","filenameStrindex":1}],
//	   "locationTable":[{},{"mappingIndex":1,"address":"4198964","lines":[{"functionIndex":1,"line":"12","column":"3"}]}],
//	   "functionTable":[{},{"nameStrindex":2,"systemNameStrindex":3,"filenameStrindex":4,"startLine":"10"}],
//	   "linkTable":[{},{"traceId":"<32 hex>","spanId":"<16 hex>"}],
//	   "stringTable":["","/usr/bin/app",...],
//	   "attributeTable":[{"value":{}},{"keyStrindex":8,"value":{"stringValue":"..."}}],
//	   "stackTable":[{},{"locationIndices":[2,1]}]}}
//
// Notes on this shape:
//   - 64-bit integers are JSON strings, 32-bit ones numbers; zero values are
//     omitted (so index 0 entries show up as {}).
//   - profileId/traceId/spanId are lowercase hex (OTLP/JSON), not base64.
//   - pdata's marshaler moves resource and scope attribute keys and string
//     values into the dictionary string table (keyStrindex /
//     stringValueStrindex, fields of common.proto in OTLP >= 1.10), appending
//     strings to stringTable. ResolveAttributeRefs undoes that.

// ReadOutput parses every line of the file exporter output at path (the
// collector's OutPath), one ProfilesData a line. With strict set, a field
// unknown to the v0.4.0 profiles proto is an error.
func ReadOutput(path string, strict bool) ([]*profilespb.ProfilesData, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*profilespb.ProfilesData
	r := bufio.NewReaderSize(f, 1<<20)
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			pd, perr := parseProfilesJSON(line, strict)
			if perr != nil {
				return nil, fmt.Errorf("%s line %d: %w", path, lineNo, perr)
			}
			out = append(out, pd)
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parseProfilesJSON converts one OTLP/JSON line into the v0.4.0 message.
func parseProfilesJSON(line []byte, strict bool) (*profilespb.ProfilesData, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	if err := hexIDsToBase64(generic); err != nil {
		return nil, err
	}
	canon, err := json.Marshal(generic)
	if err != nil {
		return nil, err
	}
	pd := &profilespb.ProfilesData{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: !strict}).Unmarshal(canon, pd); err != nil {
		return nil, err
	}
	return pd, nil
}

// hexIDsToBase64 rewrites the hex-encoded id fields of OTLP/JSON into the
// base64 that protojson expects for bytes fields.
func hexIDsToBase64(v any) error {
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			switch k {
			case "profileId", "traceId", "spanId":
				s, ok := child.(string)
				if !ok {
					return fmt.Errorf("%s: want string, got %T", k, child)
				}
				b, err := hex.DecodeString(s)
				if err != nil {
					return fmt.Errorf("%s: %w", k, err)
				}
				v[k] = base64.StdEncoding.EncodeToString(b)
			default:
				if err := hexIDsToBase64(child); err != nil {
					return err
				}
			}
		}
	case []any:
		for _, child := range v {
			if err := hexIDsToBase64(child); err != nil {
				return err
			}
		}
	}
	return nil
}

// ResolveAttributeRefs turns keyStrindex/stringValueStrindex in resource and
// scope attributes back into plain strings (see the notes above) and clears
// the *_strindex fields. It returns an error on an out-of-range index.
func ResolveAttributeRefs(pd *profilespb.ProfilesData) error {
	strs := pd.GetDictionary().GetStringTable()
	lookup := func(i int32) (string, error) {
		if i < 0 || int(i) >= len(strs) {
			return "", fmt.Errorf("string index %d out of range (%d strings)", i, len(strs))
		}
		return strs[i], nil
	}
	var anyValue func(*commonpb.AnyValue) error
	kvs := func(list []*commonpb.KeyValue) error {
		for _, kv := range list {
			if kv.KeyStrindex != 0 {
				s, err := lookup(kv.KeyStrindex)
				if err != nil {
					return err
				}
				kv.Key, kv.KeyStrindex = s, 0
			}
			if err := anyValue(kv.Value); err != nil {
				return err
			}
		}
		return nil
	}
	anyValue = func(v *commonpb.AnyValue) error {
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValueStrindex:
			s, err := lookup(x.StringValueStrindex)
			if err != nil {
				return err
			}
			v.Value = &commonpb.AnyValue_StringValue{StringValue: s}
		case *commonpb.AnyValue_KvlistValue:
			return kvs(x.KvlistValue.GetValues())
		case *commonpb.AnyValue_ArrayValue:
			for _, e := range x.ArrayValue.GetValues() {
				if err := anyValue(e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, rp := range pd.GetResourceProfiles() {
		if err := kvs(rp.GetResource().GetAttributes()); err != nil {
			return err
		}
		for _, sp := range rp.GetScopeProfiles() {
			if err := kvs(sp.GetScope().GetAttributes()); err != nil {
				return err
			}
		}
	}
	return nil
}

// ResourceAttr returns a resource's string attribute (after ResolveAttributeRefs).
func ResourceAttr(rp *profilespb.ResourceProfiles, key string) string {
	for _, kv := range rp.GetResource().GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// SampleCount is how many samples one Sample stands for: the sum of its
// values, or its number of timestamps when it has no values.
func SampleCount(s *profilespb.Sample) int64 {
	if len(s.GetValues()) == 0 {
		return int64(len(s.GetTimestampsUnixNano()))
	}
	var n int64
	for _, v := range s.GetValues() {
		n += v
	}
	return n
}

// SamplesByProcess sums SampleCount over all samples by the resource
// attribute process.executable.name ("" for resources without it). It
// resolves the attribute references of pds in place first.
func SamplesByProcess(pds []*profilespb.ProfilesData) (map[string]int64, error) {
	out := map[string]int64{}
	for _, pd := range pds {
		if err := ResolveAttributeRefs(pd); err != nil {
			return nil, err
		}
		for _, rp := range pd.GetResourceProfiles() {
			name := ResourceAttr(rp, "process.executable.name")
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					for _, s := range p.GetSamples() {
						out[name] += SampleCount(s)
					}
				}
			}
		}
	}
	return out, nil
}

package reporter

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"
	"google.golang.org/protobuf/proto"
)

// Validate checks the structural rules of an OTLP profiles request that a
// receiver relies on: every dictionary table present with its zero value at
// index 0, no duplicate entries in any table, every index in range,
// attribute keys unique within each attribute list, and samples whose values
// and timestamps pair up and lie within their profile's time window. Values
// and timestamps pair up when either is empty or both have the same length,
// as the profiles proto requires; a sample of n events from this package has
// n timestamps and n values of 1. Validate returns the first violation found,
// naming where it is.
func Validate(req *collectorpb.ExportProfilesServiceRequest) error {
	if req == nil {
		return errors.New("nil request")
	}
	d := req.GetDictionary()
	if d == nil {
		return errors.New("request has no dictionary")
	}
	v := validator{d: d}
	if err := v.dictionary(); err != nil {
		return fmt.Errorf("dictionary: %w", err)
	}
	for i, rp := range req.GetResourceProfiles() {
		if err := v.resourceProfiles(rp); err != nil {
			return fmt.Errorf("resource_profiles[%d]: %w", i, err)
		}
	}
	return nil
}

type validator struct {
	d *profilespb.ProfilesDictionary
}

func (v *validator) dictionary() error {
	d := v.d
	isEmpty := func(m proto.Message) bool { return proto.Size(m) == 0 }
	errs := []error{
		checkStrings(d.StringTable),
		checkTable("mapping_table", d.MappingTable, isEmpty),
		checkTable("location_table", d.LocationTable, isEmpty),
		checkTable("function_table", d.FunctionTable, isEmpty),
		checkTable("link_table", d.LinkTable, isZeroLink),
		checkTable("attribute_table", d.AttributeTable, isEmpty),
		checkTable("stack_table", d.StackTable, isEmpty),
	}
	if err := errors.Join(errs...); err != nil {
		// Reference checks below index into these tables, so stop here.
		return err
	}
	for i, a := range d.AttributeTable[1:] {
		if err := v.attribute(a); err != nil {
			return fmt.Errorf("attribute_table[%d]: %w", i+1, err)
		}
	}
	for i, f := range d.FunctionTable {
		if err := v.function(f); err != nil {
			return fmt.Errorf("function_table[%d]: %w", i, err)
		}
	}
	for i, m := range d.MappingTable {
		err := errors.Join(v.str("filename_strindex", m.FilenameStrindex), v.attrList(m.AttributeIndices))
		if err == nil {
			err = v.fileID(m.AttributeIndices)
		}
		if err != nil {
			return fmt.Errorf("mapping_table[%d]: %w", i, err)
		}
	}
	for i, l := range d.LocationTable {
		if err := v.location(l); err != nil {
			return fmt.Errorf("location_table[%d]: %w", i, err)
		}
	}
	for i, s := range d.StackTable {
		for j, l := range s.LocationIndices {
			if err := inRange(fmt.Sprintf("location_indices[%d]", j), l, len(d.LocationTable)); err != nil {
				return fmt.Errorf("stack_table[%d]: %w", i, err)
			}
		}
	}
	for i, l := range d.LinkTable {
		if n := len(l.TraceId); n != 0 && n != 16 {
			return fmt.Errorf("link_table[%d]: trace_id has %d bytes, want 16", i, n)
		}
		if n := len(l.SpanId); n != 0 && n != 8 {
			return fmt.Errorf("link_table[%d]: span_id has %d bytes, want 8", i, n)
		}
	}
	return nil
}

// fileID checks a mapping's htlhash: 32 hex digits of a real (non-zero) id.
func (v *validator) fileID(attrs []int32) error {
	for _, i := range attrs {
		a := v.d.AttributeTable[i]
		if v.d.StringTable[a.KeyStrindex] != attrBuildIDHTL {
			continue
		}
		id, err := hex.DecodeString(a.GetValue().GetStringValue())
		switch {
		case err != nil || len(id) != 16:
			return fmt.Errorf("%s %q is not 32 hex digits", attrBuildIDHTL, a.GetValue().GetStringValue())
		case bytes.Equal(id, make([]byte, 16)):
			return fmt.Errorf("%s is the zero file id", attrBuildIDHTL)
		}
	}
	return nil
}

func checkStrings(table []string) error {
	if len(table) == 0 || table[0] != "" {
		return errors.New(`string_table[0] must be present and ""`)
	}
	seen := make(map[string]int, len(table))
	for i, s := range table {
		if j, dup := seen[s]; dup {
			return fmt.Errorf("string_table[%d] duplicates string_table[%d] (%q)", i, j, s)
		}
		seen[s] = i
	}
	return nil
}

// checkTable checks that a message table has its zero value at index 0, no
// nil entries and no duplicates. Entries are compared by their deterministic
// encoding, which is equality of content.
func checkTable[T proto.Message](name string, table []T, isZero func(proto.Message) bool) error {
	if len(table) == 0 {
		return fmt.Errorf("%s is empty: index 0 must hold the zero value", name)
	}
	seen := make(map[string]int, len(table))
	for i, m := range table {
		if !m.ProtoReflect().IsValid() {
			return fmt.Errorf("%s[%d] is nil", name, i)
		}
		switch zero := isZero(m); {
		case i == 0 && !zero:
			return fmt.Errorf("%s[0] is not the zero value", name)
		case i > 0 && zero:
			// Caught here rather than by encoding because a zero link has
			// two encodings (empty or all-zero ids).
			return fmt.Errorf("%s[%d] duplicates %s[0], the zero value", name, i, name)
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return fmt.Errorf("encoding %s[%d]: %w", name, i, err)
		}
		if j, dup := seen[string(b)]; dup {
			return fmt.Errorf("%s[%d] duplicates %s[%d]", name, i, name, j)
		}
		seen[string(b)] = i
	}
	return nil
}

// isZeroLink accepts both encodings of the zero link the spec allows: empty
// ids, or all-zero ids of full length.
func isZeroLink(m proto.Message) bool {
	l, ok := m.(*profilespb.Link)
	if !ok {
		return false
	}
	zero := func(b []byte, n int) bool { return len(b) == 0 || bytes.Equal(b, make([]byte, n)) }
	return zero(l.TraceId, 16) && zero(l.SpanId, 8)
}

func (v *validator) attribute(a *profilespb.KeyValueAndUnit) error {
	if a.KeyStrindex == 0 {
		return errors.New("empty key")
	}
	err := errors.Join(v.str("key_strindex", a.KeyStrindex), v.str("unit_strindex", a.UnitStrindex))
	if err != nil {
		return err
	}
	if s, ok := a.GetValue().GetValue().(*commonpb.AnyValue_StringValueStrindex); ok {
		return v.str("value.string_value_strindex", s.StringValueStrindex)
	}
	return nil
}

func (v *validator) function(f *profilespb.Function) error {
	return errors.Join(
		v.str("name_strindex", f.NameStrindex),
		v.str("system_name_strindex", f.SystemNameStrindex),
		v.str("filename_strindex", f.FilenameStrindex),
	)
}

func (v *validator) location(l *profilespb.Location) error {
	if err := inRange("mapping_index", l.MappingIndex, len(v.d.MappingTable)); err != nil {
		return err
	}
	for j, ln := range l.Lines {
		if ln == nil {
			return fmt.Errorf("lines[%d] is nil", j)
		}
		if err := inRange(fmt.Sprintf("lines[%d].function_index", j), ln.FunctionIndex, len(v.d.FunctionTable)); err != nil {
			return err
		}
	}
	return v.attrList(l.AttributeIndices)
}

func (v *validator) str(field string, i int32) error {
	return inRange(field, i, len(v.d.StringTable))
}

// attrList checks an attribute_indices list: in range, no reference to the
// key-less zero attribute, and each key at most once. Keys are compared by
// string index, which is enough because the string table has no duplicates.
func (v *validator) attrList(indices []int32) error {
	keys := make(map[int32]int, len(indices))
	for i, a := range indices {
		field := fmt.Sprintf("attribute_indices[%d]", i)
		if err := inRange(field, a, len(v.d.AttributeTable)); err != nil {
			return err
		}
		if a == 0 {
			return fmt.Errorf("%s references the zero attribute", field)
		}
		k := v.d.AttributeTable[a].KeyStrindex
		if j, dup := keys[k]; dup {
			return fmt.Errorf("attribute key %q repeated at attribute_indices[%d] and [%d]", v.d.StringTable[k], j, i)
		}
		keys[k] = i
	}
	return nil
}

func (v *validator) resourceProfiles(rp *profilespb.ResourceProfiles) error {
	if rp == nil {
		return errors.New("nil")
	}
	keys := make(map[string]bool)
	for i, kv := range rp.GetResource().GetAttributes() {
		if kv.GetKey() == "" {
			return fmt.Errorf("resource.attributes[%d]: empty key", i)
		}
		if keys[kv.Key] {
			return fmt.Errorf("resource.attributes[%d]: key %q repeated", i, kv.Key)
		}
		keys[kv.Key] = true
	}
	for i, sp := range rp.ScopeProfiles {
		if sp == nil {
			return fmt.Errorf("scope_profiles[%d] is nil", i)
		}
		for j, p := range sp.Profiles {
			if err := v.profile(p); err != nil {
				return fmt.Errorf("scope_profiles[%d].profiles[%d]: %w", i, j, err)
			}
		}
	}
	return nil
}

func (v *validator) profile(p *profilespb.Profile) error {
	if p == nil {
		return errors.New("nil")
	}
	if p.SampleType == nil {
		return errors.New("no sample_type")
	}
	errs := []error{
		v.str("sample_type.type_strindex", p.SampleType.TypeStrindex),
		v.str("sample_type.unit_strindex", p.SampleType.UnitStrindex),
		v.str("period_type.type_strindex", p.GetPeriodType().GetTypeStrindex()),
		v.str("period_type.unit_strindex", p.GetPeriodType().GetUnitStrindex()),
		v.attrList(p.AttributeIndices),
	}
	if n := len(p.ProfileId); n != 0 && n != 16 {
		errs = append(errs, fmt.Errorf("profile_id has %d bytes, want 16", n))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, s := range p.Samples {
		if err := v.sample(s, p.TimeUnixNano, p.DurationNano); err != nil {
			return fmt.Errorf("samples[%d]: %w", i, err)
		}
	}
	return nil
}

func (v *validator) sample(s *profilespb.Sample, start, duration uint64) error {
	if s == nil {
		return errors.New("nil")
	}
	err := errors.Join(
		inRange("stack_index", s.StackIndex, len(v.d.StackTable)),
		inRange("link_index", s.LinkIndex, len(v.d.LinkTable)),
		v.attrList(s.AttributeIndices),
	)
	if err != nil {
		return err
	}
	nv, nt := len(s.Values), len(s.TimestampsUnixNano)
	switch {
	case nv == 0 && nt == 0:
		return errors.New("neither values nor timestamps")
	case nv > 0 && nt > 0 && nv != nt:
		return fmt.Errorf("%d values but %d timestamps: they must pair up", nv, nt)
	}
	for i, ts := range s.TimestampsUnixNano {
		if ts < start || ts-start >= duration {
			return fmt.Errorf("timestamps_unix_nano[%d] = %d outside profile window [%d, %d)", i, ts, start, start+duration)
		}
	}
	return nil
}

func inRange(field string, i int32, n int) error {
	if i < 0 || int(i) >= n {
		return fmt.Errorf("%s %d out of range [0, %d)", field, i, n)
	}
	return nil
}

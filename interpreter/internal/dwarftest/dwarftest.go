// Package dwarftest reads C struct layouts from DWARF, for the tests that
// check a runtime's hand-kept offsets against a binary's debug
// information.
package dwarftest

import (
	"debug/dwarf"
	"fmt"
	"strings"
)

// StructTypes indexes the complete struct and union types of d by name,
// the first definition of each name.
func StructTypes(d *dwarf.Data) (map[string]dwarf.Offset, error) {
	out := map[string]dwarf.Offset{}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, err
		}
		if e == nil {
			return out, nil
		}
		if e.Tag != dwarf.TagStructType && e.Tag != dwarf.TagUnionType {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); name != "" && !decl {
			if _, seen := out[name]; !seen {
				out[name] = e.Offset
			}
		}
	}
}

// Offset is the byte offset of a member path ("location.label") in the
// struct of d named name (indexed by StructTypes), or the struct's size
// for path "sizeof".
func Offset(d *dwarf.Data, types map[string]dwarf.Offset, name, path string) (uint64, error) {
	off, ok := types[name]
	if !ok {
		return 0, fmt.Errorf("no struct %s", name)
	}
	typ, err := d.Type(off)
	if err != nil {
		return 0, err
	}
	if path == "sizeof" {
		return uint64(typ.Size()), nil
	}
	_, at, err := Member(typ, path)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return uint64(at), nil
}

// Member follows a dotted member path from t, through typedefs,
// qualifiers and anonymous structs and unions, and returns the last
// member and its byte offset in t. A bit-field's offsets stay relative to
// the struct that holds it.
func Member(t dwarf.Type, path string) (*dwarf.StructField, int64, error) {
	var at int64
	var f *dwarf.StructField
	for name := range strings.SplitSeq(path, ".") {
		st, ok := Unwrap(t).(*dwarf.StructType)
		if !ok {
			return nil, 0, fmt.Errorf("%s: %s is not a struct", path, t)
		}
		var off int64
		f, off = field(st, name)
		if f == nil {
			return nil, 0, fmt.Errorf("%s: no member %s in %s", path, name, st)
		}
		at += off
		t = f.Type
	}
	return f, at, nil
}

// field finds a member of st by name, looking into its anonymous members
// when st has none of that name itself (C11 anonymous structs and unions).
func field(st *dwarf.StructType, name string) (*dwarf.StructField, int64) {
	for _, f := range st.Field {
		if f.Name == name {
			return f, f.ByteOffset
		}
	}
	for _, f := range st.Field {
		if inner, ok := Unwrap(f.Type).(*dwarf.StructType); ok && f.Name == "" {
			if g, off := field(inner, name); g != nil {
				return g, f.ByteOffset + off
			}
		}
	}
	return nil, 0
}

// Unwrap strips typedefs and qualifiers (const, volatile) off t.
func Unwrap(t dwarf.Type) dwarf.Type {
	for {
		switch u := t.(type) {
		case *dwarf.TypedefType:
			t = u.Type
		case *dwarf.QualType:
			t = u.Type
		default:
			return t
		}
	}
}

// Package dwarftest reads C struct layouts from DWARF, for the tests that
// check a runtime's hand-kept offsets against a binary's debug
// information.
package dwarftest

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"strings"
)

// Structs are the complete struct and union types of a binary's DWARF,
// by name: the first definition of each name.
type Structs struct {
	d      *dwarf.Data
	byName map[string]dwarf.Offset
}

// Read reads the DWARF of the ELF file at path.
func Read(path string) (*dwarf.Data, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Load indexes the structs of the DWARF of the ELF file at path.
func Load(path string) (*Structs, error) {
	d, err := Read(path)
	if err != nil {
		return nil, err
	}
	s := &Structs{d: d, byName: map[string]dwarf.Offset{}}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if e == nil {
			return s, nil
		}
		if e.Tag != dwarf.TagStructType && e.Tag != dwarf.TagUnionType {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); name != "" && !decl {
			if _, seen := s.byName[name]; !seen {
				s.byName[name] = e.Offset
			}
		}
	}
}

// Has says whether there is a struct or union named name.
func (s *Structs) Has(name string) bool {
	_, ok := s.byName[name]
	return ok
}

// Offset is the byte offset of a member path ("location.label") in the
// struct named name, or the struct's size for path "sizeof".
func (s *Structs) Offset(name, path string) (uint64, error) {
	off, ok := s.byName[name]
	if !ok {
		return 0, fmt.Errorf("no struct %s", name)
	}
	typ, err := s.d.Type(off)
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

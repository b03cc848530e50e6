package perl

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/utils/perlfetch"
)

// structTypes indexes the complete struct and union types of d by name.
func structTypes(d *dwarf.Data) (map[string]dwarf.Offset, error) {
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

// member is the byte offset of a member path ("blk_u.blku_sub") in the
// struct of d named name, or the struct's size for path "sizeof".
func member(d *dwarf.Data, types map[string]dwarf.Offset, name, path string) (uint64, error) {
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
	var at uint64
	for _, part := range strings.Split(path, ".") {
		for {
			td, ok := typ.(*dwarf.TypedefType)
			if !ok {
				break
			}
			typ = td.Type
		}
		st, ok := typ.(*dwarf.StructType)
		if !ok {
			return 0, fmt.Errorf("%s.%s: %s is no struct", name, path, typ)
		}
		var field *dwarf.StructField
		for _, f := range st.Field {
			if f.Name == part {
				field = f
			}
		}
		if field == nil {
			return 0, fmt.Errorf("%s has no member %s", st.StructName, part)
		}
		at += uint64(field.ByteOffset)
		typ = field.Type
	}
	return at, nil
}

// TestLayoutFromDWARF checks the offset tables of 5.32, 5.36 and 5.40
// against the DWARF of Debian's builds (perl-debug's dwz file of libperl,
// which holds the types the build's objects share). 5.34 and 5.38 have no
// Debian build (internals.md §9).
func TestLayoutFromDWARF(t *testing.T) {
	for _, v := range perlfetch.Versions {
		t.Run(v, func(t *testing.T) { checkLayoutFromDWARF(t, v) })
	}
}

func checkLayoutFromDWARF(t *testing.T, v string) {
	path, err := perlfetch.DebugInfo(v)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	types, err := structTypes(d)
	if err != nil {
		t.Fatal(err)
	}
	var minor int
	fmt.Sscanf(v, "5.%d", &minor)
	l, err := LayoutFor(interpreter.Version{Major: 5, Minor: minor})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := member(d, types, "block", "blk_u")
	if err != nil {
		t.Fatal(err)
	}
	type check struct {
		name, path string
		want       uint64
	}
	checks := []check{
		{"interpreter", "Icurcop", l.InterpCurcop},
		{"interpreter", "Icurstackinfo", l.InterpCurstackinfo},
		{"interpreter", "sizeof", l.InterpSize},
		{"stackinfo", "si_cxstack", l.SICxstack},
		{"stackinfo", "si_prev", l.SIPrev},
		{"stackinfo", "si_cxix", l.SICxix},
		{"stackinfo", "si_cxmax", l.SICxmax},
		{"stackinfo", "si_type", l.SIType},
		{"context", "sizeof", l.CXSize},
		{"block", "blku_type", l.CXType},
		{"block", "blku_oldcop", l.CXOldcop},
		{"block_sub", "retop", l.CXRetop - sub},
		{"block_sub", "cv", l.CXCV - sub},
		{"block_eval", "retop", l.CXRetop - sub},
		{"cop", "cop_line", l.COPLine},
		{"cop", "cop_file", l.COPFile},
		{"sv", "sv_any", svAny},
		{"sv", "sv_flags", svFlags},
		{"sv", "sv_u", svU},
		{"xpvcv", "xcv_stash", l.CVStash},
		{"xpvcv", "xcv_gv_u", l.CVGv},
		{"xpvcv", "xcv_flags", l.CVFlags},
		{"xpvgv", "xiv_u", l.GVNameHEK},
		{"xpvgv", "xnv_u", l.GVStash},
		{"gp", "gp_egv", l.GPEgv},
		{"xpvhv", "xhv_max", l.HvMax},
		{"hek", "hek_len", hekLen},
		{"hek", "hek_key", hekKey},
	}
	if l.HvAuxBody != 0 {
		checks = append(checks, check{"xpvhv_with_aux", "xhv_aux", l.HvAuxBody},
			check{"xpvhv_aux", "xhv_name_u", l.AuxName}, check{"xpvhv_aux", "xhv_name_count", l.AuxNameCount})
	} else if _, ok := types["xpvhv_with_aux"]; ok {
		t.Errorf("%s has struct xpvhv_with_aux: the layout keeps HvAUX after the buckets", v)
	} else {
		// 5.32's dwz file lacks struct xpvhv_aux (no two objects share
		// it); TestSymbolize reads package names through it live.
		t.Logf("%s: struct xpvhv_aux is not in the dwz file: its offsets are checked live only", v)
	}
	for _, c := range checks {
		got, err := member(d, types, c.name, c.path)
		switch {
		case err != nil:
			t.Errorf("%s.%s: %v", c.name, c.path, err)
		case got != c.want:
			t.Errorf("%s.%s is at %d in DWARF, the table says %d", c.name, c.path, got, c.want)
		}
	}
}

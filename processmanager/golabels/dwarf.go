package golabels

import (
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
)

// errNoDWARF says a file has no DWARF, or none of the runtime's types.
var errNoDWARF = errors.New("no DWARF of the Go runtime's types")

// maxDWARFEntries bounds the entries read of one file's DWARF: the
// runtime's compile unit comes early, and a hostile file must not make the
// search walk forever.
const maxDWARFEntries = 1 << 20

// offsetsFromDWARF reads the offsets from the runtime's own type
// descriptions: runtime.g's members m and labels, runtime.m's curg.
func offsetsFromDWARF(f *elf.File) (offsets, error) {
	d, err := f.DWARF()
	if err != nil {
		return offsets{}, fmt.Errorf("%w: %v", errNoDWARF, err)
	}
	members := map[string]map[string]int64{"runtime.g": {"m": -1, "labels": -1}, "runtime.m": {"curg": -1}}
	r := d.Reader()
	found := 0
	for n := 0; n < maxDWARFEntries && found < len(members); n++ {
		e, err := r.Next()
		if err != nil {
			return offsets{}, fmt.Errorf("reading DWARF: %w", err)
		}
		if e == nil {
			break
		}
		switch e.Tag {
		case dwarf.TagCompileUnit:
			// The runtime's types are in its own unit.
			if name, _ := e.Val(dwarf.AttrName).(string); name != "runtime" {
				r.SkipChildren()
			}
			continue
		case dwarf.TagStructType:
		default:
			if e.Children {
				r.SkipChildren()
			}
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		want, ok := members[name]
		if !ok || !e.Children {
			if e.Children {
				r.SkipChildren()
			}
			continue
		}
		if err := readMembers(r, want); err != nil {
			return offsets{}, fmt.Errorf("%s: %w", name, err)
		}
		found++
	}
	o := offsets{gM: members["runtime.g"]["m"], gLabels: members["runtime.g"]["labels"], mCurg: members["runtime.m"]["curg"]}
	if o.gM < 0 || o.gLabels < 0 || o.mCurg < 0 {
		return offsets{}, errNoDWARF
	}
	return o, nil
}

// readMembers fills want's offsets from a struct's member entries, which r
// is at.
func readMembers(r *dwarf.Reader, want map[string]int64) error {
	for {
		e, err := r.Next()
		if err != nil {
			return err
		}
		if e == nil || e.Tag == 0 {
			return nil
		}
		if e.Children {
			r.SkipChildren()
		}
		if e.Tag != dwarf.TagMember {
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		if _, ok := want[name]; !ok {
			continue
		}
		off, ok := e.Val(dwarf.AttrDataMemberLoc).(int64)
		if !ok || off < 0 || off > maxOffset {
			return fmt.Errorf("member %s has no usable offset", name)
		}
		want[name] = off
	}
}

package debuginfo

import (
	"debug/dwarf"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// debug/dwarf parses the header and abbreviations of every unit when the
// data is made, and keeps them: for libc's 2,083 units, 11 MiB of maps,
// more than its sections. A unit refers into another only through forms
// that carry a section offset (DW_FORM_ref_addr, the supplementary file's
// forms); where no abbreviation uses them, each unit is read on its own,
// from a dwarf.Data made of its bytes alone, when an address in it is
// looked up. A few recent ones are kept.

// recentUnits is how many units read on their own are kept parsed.
const recentUnits = 8

// unitSpan is where a unit's bytes are in .debug_info.
type unitSpan struct{ off, end uint64 }

// unitView is a unit's entries: d holds them at their offset less base,
// and the unit's entry is at cu.
type unitView struct {
	d        *dwarf.Data
	base, cu dwarf.Offset
}

// parsedUnit is a unit read on its own.
type parsedUnit struct {
	off uint64
	d   *dwarf.Data
}

// newData makes a dwarf.Data of secs with info as .debug_info.
func newData(secs map[string][]byte, info []byte) (*dwarf.Data, error) {
	d, err := dwarf.New(secs["abbrev"], nil, nil, info, secs["line"], nil, secs["ranges"], secs["str"])
	if err != nil {
		return nil, fmt.Errorf("reading DWARF: %w", err)
	}
	for _, name := range dwarf5Sections {
		if b := secs[name]; b != nil {
			if err := d.AddSection(".debug_"+name, b); err != nil {
				return nil, fmt.Errorf("reading DWARF: %w", err)
			}
		}
	}
	return d, nil
}

// splitUnits returns the units of a little-endian .debug_info by their
// headers (initial length, then a version from 2 to 5).
func splitUnits(info []byte) ([]unitSpan, error) {
	var spans []unitSpan
	for off := uint64(0); off < uint64(len(info)); {
		rest := info[off:]
		if len(rest) < 6 {
			return nil, fmt.Errorf("unit header at %#x cut short", off)
		}
		length, hdr := uint64(binary.LittleEndian.Uint32(rest)), uint64(4)
		if length == 0xffffffff {
			if len(rest) < 14 {
				return nil, fmt.Errorf("unit header at %#x cut short", off)
			}
			length, hdr = binary.LittleEndian.Uint64(rest[4:]), 12
		} else if length >= 0xfffffff0 {
			return nil, fmt.Errorf("unit at %#x: reserved length %#x", off, length)
		}
		if v := binary.LittleEndian.Uint16(rest[hdr:]); v < 2 || v > 5 {
			return nil, fmt.Errorf("unit at %#x: version %d", off, v)
		}
		if length > uint64(len(rest))-hdr {
			return nil, fmt.Errorf("unit at %#x runs past the section", off)
		}
		end := off + hdr + length
		spans = append(spans, unitSpan{off, end})
		off = end
	}
	return spans, nil
}

// crossUnitForms says whether an abbreviation of abbrev uses a form that
// may refer into another unit, or that gives its form only in the data.
func crossUnitForms(abbrev []byte) (bool, error) {
	r := dwarfReader{b: abbrev}
	for r.pos < len(r.b) && !r.err {
		if code := r.uleb(); code == 0 {
			continue // the end of a table
		}
		r.uleb()  // tag
		r.skip(1) // has children
		for !r.err {
			attr, form := r.uleb(), r.uleb()
			if attr == 0 && form == 0 {
				break
			}
			switch form {
			case formRefAddr, formIndirect, formRefSup4, formRefSup8, formGNURefAlt:
				return true, nil
			case formImplicit:
				r.uleb() // its value, signed: the same bytes
			}
		}
	}
	if r.err {
		return false, errors.New("abbreviations cut short or malformed")
	}
	return false, nil
}

// indexUnits records the address ranges of every unit, reading each on
// its own.
func (l *dwarfLines) indexUnits() error {
	for _, s := range l.spans {
		d, err := newData(l.secs, l.secs["info"][s.off:s.end:s.end])
		if err != nil {
			return err
		}
		e, err := d.Reader().Next()
		if err != nil || e == nil {
			continue // a damaged unit costs only its lines
		}
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
			ranges, _ := d.Ranges(e)
			for _, rg := range ranges {
				if rg[1] > rg[0] && len(l.units) < maxUnitRanges {
					l.units = append(l.units, unitRange{rg[0], rg[1], dwarf.Offset(s.off)})
				}
			}
		}
	}
	return nil
}

// view returns the entries of the unit that unitAt named.
func (l *dwarfLines) view(unit dwarf.Offset) (unitView, error) {
	if l.d != nil {
		return unitView{d: l.d, cu: unit}, nil
	}
	off := uint64(unit)
	for i, p := range l.recent {
		if p.off == off {
			copy(l.recent[1:i+1], l.recent[:i])
			l.recent[0] = p
			return unitView{d: p.d, base: unit}, nil
		}
	}
	i := sort.Search(len(l.spans), func(i int) bool { return l.spans[i].off >= off })
	if i == len(l.spans) || l.spans[i].off != off {
		return unitView{}, fmt.Errorf("no unit at %#x", off)
	}
	s := l.spans[i]
	d, err := newData(l.secs, l.secs["info"][s.off:s.end:s.end])
	if err != nil {
		return unitView{}, err
	}
	if len(l.recent) < recentUnits {
		l.recent = append(l.recent, parsedUnit{})
	}
	copy(l.recent[1:], l.recent[:len(l.recent)-1])
	l.recent[0] = parsedUnit{off, d}
	return unitView{d: d, base: unit}, nil
}

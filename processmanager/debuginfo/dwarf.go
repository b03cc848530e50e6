package debuginfo

import (
	"compress/zlib"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"runtime/metrics"
	"sort"
	"strings"
)

// Limits that keep a hostile or enormous file from costing unbounded
// memory or time.
const (
	// maxUnitRanges bounds the address ranges indexed per file (24 bytes
	// each).
	maxUnitRanges = 1 << 22
	// maxScopeEntries bounds the entries read to find the scopes at one
	// address.
	maxScopeEntries = 1 << 20
	// maxNameHops bounds the abstract origin and specification links
	// followed to name a function.
	maxNameHops = 8
	// maxNames bounds the cache of function names per file.
	maxNames = 1 << 16
)

// dwarfLines resolves addresses through DWARF: the compilation unit from
// an index of their address ranges, the line from its line table, the
// inlined calls from its subprogram and inlined-subroutine entries.
//
// Go's debug/dwarf parses the header and abbreviations of every unit it is
// given up front, which for libc's 2,083 units keeps more memory than its
// sections take. So where no unit refers into another (no
// DW_FORM_ref_addr, as GCC writes without LTO or dwz), each unit is read
// on its own from its bytes and only a few recently used ones are kept.
type dwarfLines struct {
	secs map[string][]byte
	// whole is all units read at once, when some unit refers into
	// another; then unitRange.unit is a unit entry's offset. Else it is
	// nil, spans are the units' bytes in .debug_info and unitRange.unit
	// indexes spans.
	whole  *dwarf.Data
	spans  []unitSpan
	parsed unitCache
	units  []unitRange // sorted by lo
	names  map[nameKey]string
}

// unitRange is an address range of a compilation unit.
type unitRange struct {
	lo, hi uint64
	unit   dwarf.Offset
}

// unitSpan is a unit's bytes in .debug_info.
type unitSpan struct{ start, end uint64 }

// nameKey is a function's entry: its unit (span index + 1, or 0 when all
// units are read at once) and its offset there.
type nameKey struct {
	unit int
	off  dwarf.Offset
}

// readUnitsAlone is cleared by tests to read every file's units at once.
var readUnitsAlone = true

// parsedUnits is how many units read on their own are kept per file.
const parsedUnits = 16

// unitData returns the data holding unit u (a unitRange.unit) and a
// reader at u's entry.
func (l *dwarfLines) unitData(u dwarf.Offset) (*dwarf.Data, *dwarf.Reader, int, error) {
	if l.whole != nil {
		r := l.whole.Reader()
		r.Seek(u)
		return l.whole, r, 0, nil
	}
	i := int(u)
	d := l.parsed.get(i)
	if d == nil {
		var err error
		if d, err = l.parseUnit(l.spans[i]); err != nil {
			return nil, nil, 0, err
		}
		l.parsed.add(i, d)
	}
	return d, d.Reader(), i + 1, nil
}

// unitCache keeps the units read last, most recent first.
type unitCache struct {
	idx  []int
	data []*dwarf.Data
}

func (c *unitCache) get(i int) *dwarf.Data {
	for j, k := range c.idx {
		if k == i {
			d := c.data[j]
			copy(c.idx[1:j+1], c.idx[:j])
			copy(c.data[1:j+1], c.data[:j])
			c.idx[0], c.data[0] = i, d
			return d
		}
	}
	return nil
}

func (c *unitCache) add(i int, d *dwarf.Data) {
	if len(c.idx) < parsedUnits {
		c.idx, c.data = append(c.idx, 0), append(c.data, nil)
	}
	copy(c.idx[1:], c.idx)
	copy(c.data[1:], c.data)
	c.idx[0], c.data[0] = i, d
}

// unitSpans returns where each unit lies in info, or false when a unit
// must not be read on its own: it refers to entries of other units
// (DW_FORM_ref_addr, or dwz's alternate file), its references' forms are
// chosen per entry (DW_FORM_indirect), or the headers do not parse.
func unitSpans(info, abbrev []byte, order binary.ByteOrder) ([]unitSpan, bool) {
	var spans []unitSpan
	checked := map[uint64]bool{}
	for off := uint64(0); off < uint64(len(info)); {
		if uint64(len(info))-off < 11 {
			return nil, false
		}
		length, hdr, offSize := uint64(order.Uint32(info[off:])), uint64(4), uint64(4)
		if length == 0xffffffff {
			if uint64(len(info))-off < 23 {
				return nil, false
			}
			length, hdr, offSize = order.Uint64(info[off+4:]), 12, 8
		} else if length >= 0xfffffff0 {
			return nil, false
		}
		end := off + hdr + length
		if length < 7 || end > uint64(len(info)) || end < off {
			return nil, false
		}
		version := order.Uint16(info[off+hdr:])
		at := off + hdr + 2 // abbrev offset (DWARF 2-4)
		if version == 5 {
			at += 2 // unit type, address size
		} else if version < 2 || version > 5 {
			return nil, false
		}
		if at+offSize > end {
			return nil, false
		}
		abbrevOff := uint64(order.Uint32(info[at:]))
		if offSize == 8 {
			abbrevOff = order.Uint64(info[at:])
		}
		if !checked[abbrevOff] {
			if !unitLocalForms(abbrev, abbrevOff) {
				return nil, false
			}
			checked[abbrevOff] = true
		}
		spans = append(spans, unitSpan{off, end})
		off = end
	}
	return spans, len(spans) > 0
}

// DWARF forms that refer outside the unit or are chosen per entry.
const (
	formRefAddr   = 0x10
	formIndirect  = 0x16
	formImplicit  = 0x21 // DW_FORM_implicit_const: a value follows in the table
	formGNURefAlt = 0x1f20
	formGNUStrAlt = 0x1f21
)

// unitLocalForms says whether the abbreviation table at off in abbrev
// uses only forms that stay within a unit.
func unitLocalForms(abbrev []byte, off uint64) bool {
	if off >= uint64(len(abbrev)) {
		return false
	}
	b := abbrev[off:]
	for {
		code, ok := uleb(&b)
		if !ok {
			return false
		}
		if code == 0 {
			return true
		}
		if _, ok := uleb(&b); !ok { // tag
			return false
		}
		if len(b) == 0 {
			return false
		}
		b = b[1:] // children
		for {
			attr, ok1 := uleb(&b)
			form, ok2 := uleb(&b)
			if !ok1 || !ok2 {
				return false
			}
			if attr == 0 && form == 0 {
				break
			}
			switch form {
			case formRefAddr, formIndirect, formGNURefAlt, formGNUStrAlt:
				return false
			case formImplicit:
				if _, ok := uleb(&b); !ok { // the value, signed: same length
					return false
				}
			}
		}
	}
}

// uleb reads an unsigned LEB128 number from the front of *b.
func uleb(b *[]byte) (uint64, bool) {
	var v uint64
	for i := 0; i < len(*b) && i < 10; i++ {
		c := (*b)[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			*b = (*b)[i+1:]
			return v, true
		}
	}
	return 0, false
}

// parseUnit reads one unit from its bytes.
func (l *dwarfLines) parseUnit(sp unitSpan) (*dwarf.Data, error) {
	return newData(l.secs, l.secs["info"][sp.start:sp.end])
}

// newData is debug/dwarf's reader of the units in info.
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

// dwarfSections are the sections debug/dwarf reads, without the prefix.
var dwarfSections = []string{"abbrev", "info", "line", "ranges", "str"}

// dwarf5Sections are added to the data when present (DWARF 5, GCC 11+'s
// default).
var dwarf5Sections = []string{"addr", "line_str", "str_offsets", "rnglists"}

// openDWARF reads the DWARF of ef, whose bytes are img: uncompressed
// sections are used in place, compressed ones inflated within
// maxDecompressed bytes. It returns the cost in bytes.
func openDWARF(ef *elf.File, img []byte, maxDecompressed int64) (*dwarfLines, int64, error) {
	budget := maxDecompressed
	var cost int64
	secs := map[string][]byte{}
	for _, name := range append(dwarfSections, dwarf5Sections...) {
		b, err := section(ef, img, name, &budget)
		if err != nil {
			return nil, 0, err
		}
		secs[name] = b
		cost += int64(len(b))
		// A compressed section's own pages were read too (mapped, they
		// stay resident while the file is open).
		if s := compressedSection(ef, name); s != nil {
			cost += int64(s.FileSize)
		}
	}
	l, parsed, err := newDWARFLines(secs, ef.ByteOrder)
	if err != nil {
		return nil, 0, err
	}
	return l, cost + parsed + int64(len(l.units))*24, nil
}

// heapAllocs is the bytes allocated on the heap since the start.
func heapAllocs() uint64 {
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return sample[0].Value.Uint64()
}

// newDWARFLines reads DWARF from its sections, named without ".debug_",
// and indexes its units. It returns about how many bytes the parsed units
// keep (what parsing allocates is counted, with other goroutines'
// allocations meanwhile, a small error on the safe side).
func newDWARFLines(secs map[string][]byte, order binary.ByteOrder) (*dwarfLines, int64, error) {
	l := &dwarfLines{secs: secs, names: map[nameKey]string{}}
	allocs := heapAllocs()
	spans, ok := unitSpans(secs["info"], secs["abbrev"], order)
	if !ok || !readUnitsAlone {
		d, err := newData(secs, secs["info"])
		if err != nil {
			return nil, 0, err
		}
		parsed := int64(heapAllocs() - allocs)
		l.whole = d
		if err := l.indexWhole(); err != nil {
			return nil, 0, err
		}
		return l, parsed, nil
	}
	l.spans = spans
	if err := l.indexUnits(); err != nil {
		return nil, 0, err
	}
	// The units kept at most, at the average cost of reading one.
	perUnit := int64(heapAllocs()-allocs) / int64(max(len(spans), 1))
	return l, perUnit * int64(min(len(spans), parsedUnits)), nil
}

// section returns the bytes of .debug_NAME (or the older .zdebug_NAME),
// nil if the file has none.
func section(ef *elf.File, img []byte, name string, budget *int64) ([]byte, error) {
	s := ef.Section(".debug_" + name)
	zdebug := false
	if s == nil {
		if s = ef.Section(".zdebug_" + name); s == nil {
			return nil, nil
		}
		zdebug = true
	}
	if s.Type == elf.SHT_NOBITS || s.FileSize == 0 {
		return nil, nil
	}
	if s.Flags&elf.SHF_COMPRESSED == 0 && !zdebug {
		if s.Offset > uint64(len(img)) || s.FileSize > uint64(len(img))-s.Offset {
			return nil, fmt.Errorf("section %s runs past the end of the file", s.Name)
		}
		return img[s.Offset : s.Offset+s.FileSize : s.Offset+s.FileSize], nil
	}
	if zdebug {
		return inflateZdebug(s, budget)
	}
	// debug/elf gives the inflated size of an SHF_COMPRESSED section.
	if int64(s.Size) < 0 || int64(s.Size) > *budget {
		return nil, fmt.Errorf("%w: %s inflates to %d bytes", ErrTooLarge, s.Name, s.Size)
	}
	*budget -= int64(s.Size)
	b, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("inflating %s: %w", s.Name, err)
	}
	return b, nil
}

// compressedSection returns .debug_NAME or .zdebug_NAME if it is
// compressed.
func compressedSection(ef *elf.File, name string) *elf.Section {
	if s := ef.Section(".debug_" + name); s != nil {
		if s.Flags&elf.SHF_COMPRESSED != 0 {
			return s
		}
		return nil
	}
	return ef.Section(".zdebug_" + name)
}

// inflateZdebug inflates a .zdebug section: "ZLIB", the inflated size as
// a big-endian uint64, then a zlib stream.
func inflateZdebug(s *elf.Section, budget *int64) ([]byte, error) {
	r := s.Open()
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || string(hdr[:4]) != "ZLIB" {
		return nil, fmt.Errorf("%s: no ZLIB header", s.Name)
	}
	size := binary.BigEndian.Uint64(hdr[4:])
	if size > uint64(*budget) {
		return nil, fmt.Errorf("%w: %s inflates to %d bytes", ErrTooLarge, s.Name, size)
	}
	*budget -= int64(size)
	zr, err := zlib.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("inflating %s: %w", s.Name, err)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(zr, b); err != nil {
		return nil, fmt.Errorf("inflating %s: %w", s.Name, err)
	}
	return b, nil
}

// indexUnits records the address ranges of every unit, read one at a
// time.
func (l *dwarfLines) indexUnits() error {
	for i, sp := range l.spans {
		d, err := l.parseUnit(sp)
		if err != nil {
			continue // a damaged unit costs only its lines
		}
		e, err := d.Reader().Next()
		if err != nil || e == nil {
			continue
		}
		l.addUnitRanges(d, e, dwarf.Offset(i))
	}
	return l.sortUnits()
}

func (l *dwarfLines) addUnitRanges(d *dwarf.Data, e *dwarf.Entry, unit dwarf.Offset) {
	if e.Tag != dwarf.TagCompileUnit && e.Tag != dwarf.TagPartialUnit {
		return
	}
	// A unit whose ranges are damaged costs only its lines.
	ranges, _ := d.Ranges(e)
	for _, rg := range ranges {
		if rg[1] > rg[0] && len(l.units) < maxUnitRanges {
			l.units = append(l.units, unitRange{rg[0], rg[1], unit})
		}
	}
}

func (l *dwarfLines) sortUnits() error {
	if len(l.units) == 0 {
		return fmt.Errorf("%w: no compilation unit has addresses", ErrNoDebugInfo)
	}
	sort.Slice(l.units, func(i, j int) bool { return l.units[i].lo < l.units[j].lo })
	return nil
}

// indexWhole records the address ranges of every unit of l.whole.
func (l *dwarfLines) indexWhole() error {
	r := l.whole.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return fmt.Errorf("reading DWARF units: %w", err)
		}
		if e == nil {
			break
		}
		l.addUnitRanges(l.whole, e, e.Offset)
		r.SkipChildren()
	}
	return l.sortUnits()
}

// unitAt returns the unit whose ranges hold addr. Ranges of units rarely
// overlap; a few predecessors are checked for those that do.
func (l *dwarfLines) unitAt(addr uint64) (dwarf.Offset, bool) {
	i := sort.Search(len(l.units), func(i int) bool { return l.units[i].lo > addr }) - 1
	for j := i; j >= 0 && j > i-8; j-- {
		if addr < l.units[j].hi {
			return l.units[j].unit, true
		}
	}
	return 0, false
}

func (l *dwarfLines) lookup(addr uint64) ([]Frame, error) {
	unit, ok := l.unitAt(addr)
	if !ok {
		return nil, nil
	}
	d, r, ukey, err := l.unitData(unit)
	if err != nil {
		return nil, err
	}
	cu, err := r.Next()
	if err != nil || cu == nil {
		return nil, fmt.Errorf("reading the unit at %#x: %v", unit, err)
	}
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	var files []*dwarf.LineFile
	var file string
	var line uint32
	if lr, err := d.LineReader(cu); err == nil && lr != nil {
		le, err := rowAt(lr, addr)
		if err != nil {
			return nil, fmt.Errorf("line table of the unit at %#x: %w", unit, err)
		}
		if le != nil {
			if le.File != nil {
				file = sourcePath(compDir, le.File.Name)
			}
			line = uint32(max(le.Line, 0))
		}
		files = lr.Files()
	}
	scopes, err := scopes(d, r, addr)
	if err != nil {
		return nil, err
	}
	if len(scopes) == 0 {
		if line == 0 {
			return nil, nil
		}
		return []Frame{{File: file, Line: line}}, nil
	}
	// The line table gives the innermost position; each inlined call
	// says where in its caller it was made.
	frames := make([]Frame, len(scopes))
	for k := len(scopes) - 1; k >= 0; k-- {
		e := scopes[k]
		frames[len(scopes)-1-k] = Frame{Function: l.name(d, ukey, e), File: file, Line: line, Inlined: k > 0}
		file, line = callSite(e, files)
		file = sourcePath(compDir, file)
	}
	return frames, nil
}

// rowAt returns the line table row whose addresses hold addr, nil if
// none does. Sequences need not be in address order (GCC puts main's
// .text.startup before .text but its rows after), which
// LineReader.SeekPC assumes, so every row is read.
func rowAt(lr *dwarf.LineReader, addr uint64) (*dwarf.LineEntry, error) {
	var prev, row dwarf.LineEntry
	have := false
	for {
		if err := lr.Next(&row); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		if have && !prev.EndSequence && prev.Address <= addr && addr < row.Address {
			return &prev, nil
		}
		prev, have = row, true
	}
}

// scopes returns the subprogram holding addr and the inlined subroutines
// inside it that hold addr, outermost first. r is positioned after the
// unit's entry.
func scopes(d *dwarf.Data, r *dwarf.Reader, addr uint64) ([]*dwarf.Entry, error) {
	var scopes []*dwarf.Entry
	// entered has an element per entry whose children are being read:
	// true for a scope holding addr (its end ends the search), false for
	// a namespace, which holds functions but no addresses of its own.
	entered := []bool{false}
	for range maxScopeEntries {
		e, err := r.Next()
		if err != nil {
			return scopes, fmt.Errorf("reading DWARF entries: %w", err)
		}
		if e == nil {
			return scopes, nil
		}
		if e.Tag == 0 {
			last := entered[len(entered)-1]
			entered = entered[:len(entered)-1]
			if last || len(entered) == 0 {
				return scopes, nil
			}
			continue
		}
		switch e.Tag {
		case dwarf.TagNamespace, dwarf.TagModule:
			if e.Children {
				entered = append(entered, false)
				continue
			}
		case dwarf.TagSubprogram, dwarf.TagInlinedSubroutine, dwarf.TagLexDwarfBlock,
			dwarf.TagTryDwarfBlock, dwarf.TagCatchDwarfBlock:
			if holds(d, e, addr) {
				if e.Tag == dwarf.TagSubprogram || e.Tag == dwarf.TagInlinedSubroutine {
					scopes = append(scopes, e)
				}
				if !e.Children {
					return scopes, nil
				}
				entered = append(entered, true)
				continue
			}
		}
		r.SkipChildren()
	}
	return scopes, fmt.Errorf("more than %d DWARF entries around %#x", maxScopeEntries, addr)
}

// holds says whether e's address ranges hold addr.
func holds(d *dwarf.Data, e *dwarf.Entry, addr uint64) bool {
	if e.Val(dwarf.AttrLowpc) == nil && e.Val(dwarf.AttrRanges) == nil {
		return false
	}
	ranges, err := d.Ranges(e)
	if err != nil {
		return false
	}
	for _, rg := range ranges {
		if addr >= rg[0] && addr < rg[1] {
			return true
		}
	}
	return false
}

// name returns a function's linkage name, else its name, following the
// abstract origin of an inlined or out-of-line instance and the
// specification of a definition to the declaration that has them.
func (l *dwarfLines) name(d *dwarf.Data, unit int, e *dwarf.Entry) string {
	start := nameKey{unit, e.Offset}
	if n, ok := l.names[start]; ok {
		return n
	}
	var plain string
	for range maxNameHops {
		for _, a := range []dwarf.Attr{dwarf.AttrLinkageName, attrMIPSLinkageName} {
			if s, ok := e.Val(a).(string); ok && s != "" {
				return l.remember(start, s)
			}
		}
		if plain == "" {
			plain, _ = e.Val(dwarf.AttrName).(string)
		}
		off, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset)
		if !ok {
			off, ok = e.Val(dwarf.AttrSpecification).(dwarf.Offset)
		}
		if !ok {
			break
		}
		r := d.Reader()
		r.Seek(off)
		next, err := r.Next()
		if err != nil || next == nil {
			break
		}
		e = next
	}
	return l.remember(start, plain)
}

func (l *dwarfLines) remember(k nameKey, name string) string {
	if len(l.names) >= maxNames {
		clear(l.names)
	}
	l.names[k] = name
	return name
}

// sourcePath is a line table's file name relative to the unit's
// directory made relative to nothing: LineReader joins a file to its
// directory entry, which in DWARF 5 is itself relative to the unit's
// directory, except entry 0, the unit's directory (then the name starts
// with it already). The unit's directory may be relative too, where the
// build mapped its prefix away (as Debian's do).
func sourcePath(compDir, name string) string {
	if name == "" {
		return ""
	}
	if !path.IsAbs(name) && compDir != "" && !strings.HasPrefix(name, path.Clean(compDir)+"/") {
		name = path.Join(compDir, name)
	}
	return path.Clean(name)
}

// callSite returns where an inlined subroutine was called from.
func callSite(e *dwarf.Entry, files []*dwarf.LineFile) (string, uint32) {
	var file string
	if i, ok := e.Val(dwarf.AttrCallFile).(int64); ok && i >= 0 && i < int64(len(files)) && files[i] != nil {
		file = files[i].Name
	}
	line, _ := e.Val(dwarf.AttrCallLine).(int64)
	return file, uint32(min(max(line, 0), 1<<32-1))
}

// attrMIPSLinkageName is DW_AT_MIPS_linkage_name, which GCC wrote before
// DWARF 4 named DW_AT_linkage_name.
const attrMIPSLinkageName dwarf.Attr = 0x2007

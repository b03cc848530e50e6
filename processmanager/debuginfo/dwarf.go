package debuginfo

import (
	"compress/zlib"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime/metrics"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
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
type dwarfLines struct {
	secs map[string][]byte
	// d holds every unit, where units refer into each other; nil where
	// each is read on its own (units.go): spans are then their places,
	// recent the last read, first first.
	d      *dwarf.Data
	spans  []unitSpan
	recent []parsedUnit
	units  []unitRange // sorted by lo
	// names are function names by their entry's section offset.
	names map[dwarf.Offset]string
}

// unitRange is an address range of a compilation unit: the offset of its
// entry (of its header where units are read on their own).
type unitRange struct {
	lo, hi uint64
	unit   dwarf.Offset
}

// dwarfSections are the sections debug/dwarf reads, without the prefix.
var dwarfSections = []string{"abbrev", "info", "line", "ranges", "str"}

// dwarf5Sections are added to the data when present (DWARF 5, GCC 11+'s
// default).
var dwarf5Sections = []string{"addr", "line_str", "str_offsets", "rnglists"}

// openDWARF reads the DWARF of ef, whose bytes are img: uncompressed
// sections are used in place, compressed ones inflated by in. It returns
// the cost in bytes.
func openDWARF(ef *elf.File, img []byte, in *inflater) (*dwarfLines, int64, error) {
	var cost int64
	secs := map[string][]byte{}
	for _, name := range append(dwarfSections, dwarf5Sections...) {
		b, err := section(ef, img, name, in)
		if err != nil {
			return nil, 0, err
		}
		secs[name] = b
		cost += int64(len(b))
		// A compressed section's own pages were read too.
		if s := compressedSection(ef, name); s != nil {
			cost += int64(s.FileSize)
		}
	}
	l, parsed, err := newDWARFLines(secs)
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
// and indexes its units. It returns about how many bytes parsing kept
// where every unit is parsed up front (what the parse allocates is
// counted, with other goroutines' allocations meanwhile, a small error on
// the safe side); where units are read on their own, the few kept.
func newDWARFLines(secs map[string][]byte) (*dwarfLines, int64, error) {
	l := &dwarfLines{secs: secs, names: map[dwarf.Offset]string{}}
	if cross, err := crossUnitForms(secs["abbrev"]); err == nil && !cross {
		if l.spans, err = splitUnits(secs["info"]); err == nil {
			if err := l.indexUnits(); err != nil {
				return nil, 0, err
			}
			kept, err := l.sorted()
			if err != nil {
				return nil, 0, err
			}
			return l, kept, nil
		}
	}
	allocs := heapAllocs()
	d, err := newData(secs, secs["info"])
	if err != nil {
		return nil, 0, err
	}
	parsed := int64(heapAllocs() - allocs)
	l.d, l.spans = d, nil
	if err := l.index(); err != nil {
		return nil, 0, err
	}
	if _, err := l.sorted(); err != nil {
		return nil, 0, err
	}
	return l, parsed, nil
}

// section returns the bytes of .debug_NAME (or the older .zdebug_NAME),
// nil if the file has none.
func section(ef *elf.File, img []byte, name string, in *inflater) ([]byte, error) {
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
		return inflateZdebug(s, in)
	}
	// debug/elf gives the inflated size of an SHF_COMPRESSED section, and
	// inflates it as it is read.
	b, err := in.inflate(s.Name, s.Size, func() (io.Reader, error) { return s.Open(), nil })
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
func inflateZdebug(s *elf.Section, in *inflater) ([]byte, error) {
	r := s.Open()
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || string(hdr[:4]) != "ZLIB" {
		return nil, fmt.Errorf("%s: no ZLIB header", s.Name)
	}
	b, err := in.inflate(s.Name, binary.BigEndian.Uint64(hdr[4:]), func() (io.Reader, error) {
		r := s.Open()
		if _, err := r.Seek(int64(len(hdr)), io.SeekStart); err != nil {
			return nil, err
		}
		return zlib.NewReader(r)
	})
	if err != nil {
		return nil, fmt.Errorf("inflating %s: %w", s.Name, err)
	}
	return b, nil
}

// inflater inflates a file's compressed sections within a budget, into
// mapped unlinked files of dir or, without one, on the heap.
type inflater struct {
	dir    string
	budget int64
	// maps are the files mapped so far; their owner unmaps them.
	maps [][]byte
}

// inflate reads the size bytes open returns.
func (in *inflater) inflate(name string, size uint64, open func() (io.Reader, error)) ([]byte, error) {
	if size > uint64(in.budget) {
		return nil, fmt.Errorf("%w: %s inflates to %d bytes", ErrTooLarge, name, size)
	}
	in.budget -= int64(size)
	if size == 0 {
		return nil, nil
	}
	if in.dir != "" {
		if b, err := in.inflateToFile(size, open); err == nil {
			in.maps = append(in.maps, b)
			return b, nil
		} else if !errors.Is(err, errNoFile) {
			return nil, err
		}
		// No room or no file there: the heap, for this file's sections.
		in.dir = ""
	}
	r, err := open()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// errNoFile says an inflated section could not be written to a file.
var errNoFile = errors.New("no file for the inflated section")

// inflateToFile copies the size bytes open returns into an unlinked file
// of in.dir and maps them. A failure to make or write the file wraps
// errNoFile.
func (in *inflater) inflateToFile(size uint64, open func() (io.Reader, error)) ([]byte, error) {
	f, err := os.OpenFile(in.dir, os.O_RDWR|unix.O_TMPFILE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoFile, err)
	}
	defer f.Close()
	r, err := open()
	if err != nil {
		return nil, err
	}
	// A read error is the section's; a write error the directory's (the
	// caller falls back to the heap).
	buf := make([]byte, min(size, 256<<10))
	for n := uint64(0); n < size; {
		chunk := buf[:min(uint64(len(buf)), size-n)]
		if _, err := io.ReadFull(r, chunk); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if _, err := f.Write(chunk); err != nil {
			return nil, fmt.Errorf("%w: %v", errNoFile, err)
		}
		n += uint64(len(chunk))
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mapping it: %v", errNoFile, err)
	}
	return b, nil
}

// index records the address ranges of every compilation unit.
func (l *dwarfLines) index() error {
	r := l.d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return fmt.Errorf("reading DWARF units: %w", err)
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
			// A unit whose ranges are damaged costs only its lines.
			ranges, _ := l.d.Ranges(e)
			for _, rg := range ranges {
				if rg[1] > rg[0] && len(l.units) < maxUnitRanges {
					l.units = append(l.units, unitRange{rg[0], rg[1], e.Offset})
				}
			}
		}
		r.SkipChildren()
	}
	return nil
}

// sorted sorts the index and returns the bytes the units read on their
// own may keep.
func (l *dwarfLines) sorted() (int64, error) {
	if len(l.units) == 0 {
		return 0, fmt.Errorf("%w: no compilation unit has addresses", ErrNoDebugInfo)
	}
	sort.Slice(l.units, func(i, j int) bool { return l.units[i].lo < l.units[j].lo })
	const perUnit = 64 << 10 // a unit's header and abbreviations, generously
	return int64(len(l.spans))*16 + int64(min(len(l.spans), recentUnits))*perUnit, nil
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
	v, err := l.view(unit)
	if err != nil {
		return nil, err
	}
	r := v.d.Reader()
	r.Seek(v.cu)
	cu, err := r.Next()
	if err != nil || cu == nil {
		return nil, fmt.Errorf("reading the unit at %#x: %v", unit, err)
	}
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	var files []*dwarf.LineFile
	var file string
	var line uint32
	// A header debug/dwarf would spend minutes or gigabytes on leaves the
	// unit without lines, like any other it cannot read.
	var lr *dwarf.LineReader
	if stmt, ok := cu.Val(dwarf.AttrStmtList).(int64); ok && stmt >= 0 && checkLineHeader(l.secs["line"], uint64(stmt)) == nil {
		lr, _ = v.d.LineReader(cu)
	}
	if lr != nil {
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
	scopes, err := scopes(v.d, r, addr)
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
		frames[len(scopes)-1-k] = Frame{Function: l.name(v, e), File: file, Line: line, Inlined: k > 0}
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
// unit's entry, in d.
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

// holds says whether e's address ranges hold addr; d holds e.
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
// specification of a definition to the declaration that has them. v
// holds e.
func (l *dwarfLines) name(v unitView, e *dwarf.Entry) string {
	start := v.base + e.Offset
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
		r := v.d.Reader()
		r.Seek(off)
		next, err := r.Next()
		if err != nil || next == nil {
			break
		}
		e = next
	}
	return l.remember(start, plain)
}

func (l *dwarfLines) remember(off dwarf.Offset, name string) string {
	if len(l.names) >= maxNames {
		clear(l.names)
	}
	l.names[off] = name
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

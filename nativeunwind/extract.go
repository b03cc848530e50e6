package nativeunwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ErrUnsupportedArch is returned for ELF files of machines other than
// x86_64 and arm64.
var ErrUnsupportedArch = errors.New("nativeunwind: unsupported architecture")

// Stats describes one extraction, for tools and tests.
type Stats struct {
	CIEs, FDEs int
	// Rows is the number of CFA table rows read from FDEs.
	Rows int
	// SkippedFDEs are FDEs not used: empty, outside the file's code, or
	// whose CIE has an augmentation we do not understand.
	SkippedFDEs int
	// Overlaps counts FDEs cut short because another covered part of their
	// range (the first in address order wins; .eh_frame beats .debug_frame).
	Overlaps int
	// Unsupported counts CFA table rows mapped to CFAUnknown, by reason.
	Unsupported map[string]int
	// StopSymbols are the entry point symbols marked CFAStop (or, for
	// signal trampolines, CFASignal).
	StopSymbols []string
}

// Extract returns the stack deltas of an x86_64 or arm64 ELF file: from
// its .eh_frame, .gopclntab (Go executables) and .debug_frame, with the
// entry points of processes and threads marked CFAStop. Without section
// headers, .eh_frame is found through PT_GNU_EH_FRAME; then there is no
// .debug_frame, and no symbol table for the entry points.
func Extract(f *elf.File) (Deltas, error) {
	d, _, err := ExtractWithStats(f)
	return d, err
}

// ExtractVersion numbers what Extract makes of a file: bump it with any
// change that makes Extract return other deltas for the same file, so that
// deltas an older daemon cached on disk (unwindmaps.DeltaCache) are
// extracted again.
const ExtractVersion = 2

// ExtractReader is Extract for an ELF file read from r.
// Large sections are used in place when r is an open file
// (WithMappedFile).
func ExtractReader(r io.ReaderAt) (d Deltas, err error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("nativeunwind: %w", err)
	}
	err = WithMappedFile(r, func(mapped []byte) (err error) {
		d, _, err = extract(elfImage{f: f, mapped: mapped}, true)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nativeunwind: %w", err)
	}
	return d, nil
}

// ExtractWithStats is Extract that also says what it met.
func ExtractWithStats(f *elf.File) (Deltas, Stats, error) {
	return extract(elfImage{f: f}, true)
}

// extract is extractUnmarked with the entry points of f's symbol tables
// marked.
func extract(img elfImage, withGo bool) (d Deltas, st Stats, err error) {
	defer func() {
		// A last resort: the parsers check their bounds, but a file must
		// never take the daemon down.
		if p := recover(); p != nil {
			d, err = nil, fmt.Errorf("nativeunwind: internal error: %v", p)
		}
	}()
	d, st, err = extractUnmarked(img, withGo)
	if err != nil {
		return nil, st, err
	}
	d = markEntryPoints(img.f, d, &st)
	d = markFramelessLeaves(img.f, d)
	// Like entry points, the PLT is found by its section header.
	if plt := pltLayer(img.f); plt != nil {
		if d, err = mergeLayers([]layer{layerOf(d), *plt}, &st); err != nil {
			return nil, st, err
		}
	}
	return d, st, nil
}

// extractUnmarked merges, in this order of precedence: .eh_frame; the
// .gopclntab (if withGo), since the .debug_frame Go's linker writes does
// not say where the frame pointer is saved; .debug_frame.
func extractUnmarked(img elfImage, withGo bool) (Deltas, Stats, error) {
	f := img.f
	st := Stats{Unsupported: map[string]int{}}
	arch := archFor(f.Machine)
	if arch == nil || f.Class != elf.ELFCLASS64 {
		return nil, st, fmt.Errorf("%w: %v %v", ErrUnsupportedArch, f.Class, f.Machine)
	}
	code := codeRanges(f)
	sources := []func() (*layer, error){
		func() (*layer, error) { return cfiLayer(img, ".eh_frame", arch, code, &st) },
		func() (*layer, error) { return goLayer(img, withGo) },
		func() (*layer, error) { return cfiLayer(img, ".debug_frame", arch, code, &st) },
	}
	var layers []layer // highest precedence first
	for _, src := range sources {
		l, err := src()
		if err != nil {
			return nil, st, err
		}
		if l != nil {
			layers = append(layers, *l)
		}
	}
	if len(layers) == 1 && layers[0].alone != nil {
		// Nothing to overlay, and the rows are the deltas already.
		return compact(layers[0].alone), st, nil
	}
	d, err := mergeLayers(layers, &st)
	if err != nil {
		return nil, st, err
	}
	return d, st, nil
}

// cfiLayer parses a CFI section, or returns nil if the file has none.
func cfiLayer(img elfImage, name string, arch *archInfo, code []addrRange, st *Stats) (*layer, error) {
	sec, err := cfiSectionOf(img, name, arch)
	if sec == nil || err != nil {
		return nil, err
	}
	l, err := sec.layer(st, code)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// arm64PLT0 is the size of an arm64 PLT's first entry (binutils'
// PLT_ENTRY_SIZE in elfnn-aarch64.c), the lazy-binding trampoline, which
// pushes x16 and x30: the entries after it only branch.
const arm64PLT0 = 32

// pltLayer returns the rule of an arm64 .plt's entries, or nil for other
// files. Unlike x86_64's, arm64 linkers write no CFI for them: an entry
// (adrp x16; ldr x17; add x16; br x17, after a bti c in BTI PLTs) moves
// neither sp nor x29, and the return address is in the link register.
func pltLayer(f *elf.File) *layer {
	sec := f.Section(".plt")
	if f.Machine != elf.EM_AARCH64 || sec == nil || sec.Size <= arm64PLT0 || sec.Flags&elf.SHF_EXECINSTR == 0 {
		return nil
	}
	l := layerOf(Deltas{{Address: sec.Addr + arm64PLT0, Rule: Rule{CFA: CFASP}}, {Address: sec.Addr + sec.Size}})
	return &l
}

// goLayer returns the deltas of a Go executable's .gopclntab, or nil if f
// is not one.
func goLayer(img elfImage, enabled bool) (*layer, error) {
	if !enabled {
		return nil, nil
	}
	d, err := goDeltas(img)
	if errors.Is(err, ErrNoGoPclntab) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nativeunwind: .gopclntab: %w", err)
	}
	l := layerOf(d)
	return &l, nil
}

// layerOf turns deltas into a layer whose spans are the runs of known
// rules.
func layerOf(d Deltas) layer {
	l := layer{rows: d, alone: mergedAlone(d)}
	for i := 0; i < len(d); {
		if d[i].Rule.CFA == CFAUnknown {
			i++
			continue
		}
		j := i + 1
		for j < len(d) && d[j].Rule.CFA != CFAUnknown {
			j++
		}
		if j == len(d) {
			break // no end: the deltas always end with CFAUnknown
		}
		l.spans = append(l.spans, span{start: d[i].Address, end: d[j].Address, first: i, last: j})
		i = j
	}
	return l
}

// mergedAlone is what mergeLayers makes of layerOf(d) alone: d without
// the unknown rows before its first rule.
func mergedAlone(d Deltas) Deltas {
	for len(d) > 0 && d[0].Rule.CFA == CFAUnknown {
		d = d[1:]
	}
	return d
}

// addrRange is [start, end).
type addrRange struct{ start, end uint64 }

// codeRanges returns the executable address ranges of f, sorted, or nil
// if f has no program headers (then FDEs are not filtered).
func codeRanges(f *elf.File) []addrRange {
	var rs []addrRange
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Memsz > 0 {
			rs = append(rs, addrRange{p.Vaddr, p.Vaddr + p.Memsz})
		}
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return cmpUint(a.start, b.start) })
	return rs
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// clipToCode returns the part of [start, end) in the code range holding
// start, or false if start is not in code.
func clipToCode(code []addrRange, start, end uint64) (uint64, bool) {
	if code == nil {
		return end, true
	}
	i, _ := slices.BinarySearchFunc(code, start, func(r addrRange, a uint64) int { return cmpUint(r.start, a) })
	if i < len(code) && code[i].start == start {
		return min(end, code[i].end), true
	}
	if i > 0 && start < code[i-1].end {
		return min(end, code[i-1].end), true
	}
	return 0, false
}

// span is one FDE's range with its rows: rows[first:last] of its layer,
// ascending, the first at start.
type span struct {
	start, end  uint64
	first, last int
}

// layer is the deltas of one source (a section), spans sorted by start and
// not overlapping.
type layer struct {
	spans []span
	rows  []Delta
	// alone, when not nil, is what mergeLayers makes of the layer alone
	// but for compaction. It shares the rows: merging a large file's
	// only layer copied them (25 MiB for libLLVM's million deltas, 8 for
	// a large Go executable's), and compacting it in place spoils them.
	alone Deltas
}

// cut returns the part of sp from start on, whose first row is the one in
// force at start.
func (l *layer) cut(sp span, start uint64) span {
	rows := l.rows[sp.first:sp.last]
	i, found := slices.BinarySearchFunc(rows, start, func(d Delta, a uint64) int { return cmpUint(d.Address, a) })
	if !found {
		i-- // rows[0] is at sp.start < start, so i > 0
	}
	return span{start: start, end: sp.end, first: sp.first + i, last: sp.last}
}

// piece is the part of a layer's span that ends up in the deltas.
type piece struct {
	span
	layer int
}

// mergeLayers overlays the layers, each filling only what the ones before
// it left uncovered, and turns the result into compact deltas with
// CFAUnknown in the gaps.
func mergeLayers(layers []layer, st *Stats) (Deltas, error) {
	var covered []addrRange // sorted, disjoint
	nSpans := 0
	for _, l := range layers {
		nSpans += len(l.spans)
	}
	pieces := make([]piece, 0, nSpans)
	for li, l := range layers {
		added := make([]addrRange, 0, len(l.spans))
		j := 0
		for _, sp := range l.spans {
			for j < len(covered) && covered[j].end <= sp.start {
				j++
			}
			cur, cut := sp.start, false
			for k := j; k < len(covered) && covered[k].start < sp.end; k++ {
				cut = true
				if covered[k].start > cur {
					pieces = append(pieces, piece{l.cut(sp, cur).withEnd(covered[k].start), li})
					added = append(added, addrRange{cur, covered[k].start})
				}
				cur = max(cur, covered[k].end)
			}
			if cur < sp.end {
				pieces = append(pieces, piece{l.cut(sp, cur), li})
				added = append(added, addrRange{cur, sp.end})
			}
			if cut {
				st.Overlaps++
			}
		}
		covered = mergeRanges(covered, added)
	}
	slices.SortFunc(pieces, func(a, b piece) int { return cmpUint(a.start, b.start) })

	n := len(pieces)
	for _, l := range layers {
		n += len(l.rows)
	}
	d := make(Deltas, 0, n)
	for i, pc := range pieces {
		rows := layers[pc.layer].rows[pc.first:pc.last]
		d = append(d, Delta{Address: pc.start, Rule: rows[0].Rule})
		for _, r := range rows[1:] {
			if r.Address >= pc.end {
				break
			}
			d = append(d, r)
		}
		if i+1 == len(pieces) || pieces[i+1].start > pc.end {
			d = append(d, Delta{Address: pc.end})
		}
		if len(d) > maxRows {
			return nil, fmt.Errorf("nativeunwind: more than %d deltas", maxRows)
		}
	}
	return compact(d), nil
}

func (sp span) withEnd(end uint64) span {
	sp.end = end
	return sp
}

// mergeRanges merges two sorted lists of disjoint ranges.
func mergeRanges(a, b []addrRange) []addrRange {
	if len(b) == 0 {
		return a
	}
	all := append(slices.Clip(a), b...)
	slices.SortFunc(all, func(x, y addrRange) int { return cmpUint(x.start, y.start) })
	out := all[:0]
	for _, r := range all {
		if n := len(out); n > 0 && r.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, r.end)
			continue
		}
		out = append(out, r)
	}
	return out
}

// compact drops deltas whose rule equals the previous one's.
func compact(d Deltas) Deltas {
	out := d[:0]
	for _, x := range d {
		if n := len(out); n > 0 && out[n-1].Rule == x.Rule {
			continue
		}
		out = append(out, x)
	}
	return out
}

// maxEntryPointSymbols bounds the symbols markEntryPoints applies (each
// costs a pass over the deltas); real files have a handful.
const maxEntryPointSymbols = 64

// Entry points: the outermost frames of processes and threads. The whole
// function stops the unwinding.
var stopSymbols = map[string]bool{
	"_start":         true,
	"start_thread":   true,
	"runtime.goexit": true,
	"runtime.mstart": true,
	"runtime.rt0_go": true,
}

// The clone system call wrappers run both in the parent, where they are
// ordinary functions, and as the child's outermost frame. glibc's CFI says
// which part is the child's (its return address rule is undefined, which
// becomes CFAStop); what the CFI leaves uncovered, around the system call
// itself, may be either, and stopping there is the safe choice.
var cloneSymbols = map[string]bool{
	"__clone": true, "clone": true, "__clone3": true, "clone3": true,
}

// Signal trampolines, where the CFI may be missing (musl) or describe only
// the frame record (the arm64 vDSO).
var signalSymbols = map[string]bool{
	"__restore_rt": true, "__kernel_rt_sigreturn": true,
}

// symbolName strips the version (clone@@GLIBC_2.2.5) and Go's ABI suffix
// (runtime.goexit.abi0) from a symbol name.
func symbolName(name string) string {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	return strings.TrimSuffix(name, ".abi0")
}

// markEntryPoints applies the stop and signal symbols of f's symbol tables
// to d.
func markEntryPoints(f *elf.File, d Deltas, st *Stats) Deltas {
	seen := map[addrRange]bool{}
	for _, s := range entryPointSymbols(f) {
		t := elf.ST_TYPE(s.Info)
		if (t != elf.STT_FUNC && t != elf.STT_NOTYPE) || s.Section == elf.SHN_UNDEF || s.Size == 0 {
			continue
		}
		name := symbolName(s.Name)
		var mark func(Rule) Rule
		switch {
		case stopSymbols[name]:
			mark = func(Rule) Rule { return Rule{CFA: CFAStop} }
		case cloneSymbols[name]:
			mark = func(r Rule) Rule {
				if r.CFA == CFAUnknown {
					return Rule{CFA: CFAStop}
				}
				return r
			}
		case signalSymbols[name]:
			mark = func(Rule) Rule { return Rule{CFA: CFASignal} }
		default:
			continue
		}
		rg := addrRange{s.Value, s.Value + s.Size}
		if rg.end < rg.start || seen[rg] || len(seen) == maxEntryPointSymbols {
			continue
		}
		seen[rg] = true
		st.StopSymbols = append(st.StopSymbols, name)
		d = overlay(d, rg.start, rg.end, mark)
	}
	return d
}

// overlay rewrites the rules of d in [start, end) with mark.
func overlay(d Deltas, start, end uint64, mark func(Rule) Rule) Deltas {
	search := func(a uint64) int {
		i, _ := slices.BinarySearchFunc(d, a, func(x Delta, a uint64) int { return cmpUint(x.Address, a) })
		return i
	}
	i, j := search(start), search(end)
	var before, after Rule // in force at start and at end
	if i > 0 {
		before = d[i-1].Rule
	}
	if j > 0 {
		after = d[j-1].Rule
	}
	out := make(Deltas, 0, len(d)+2)
	out = append(out, d[:i]...)
	if i == len(d) || d[i].Address > start {
		out = append(out, Delta{Address: start, Rule: mark(before)})
	}
	for _, x := range d[i:j] {
		out = append(out, Delta{Address: x.Address, Rule: mark(x.Rule)})
	}
	if j == len(d) || d[j].Address > end {
		out = append(out, Delta{Address: end, Rule: after})
	}
	out = append(out, d[j:]...)
	return compact(out)
}

// elf64SymSize is the size of an Elf64_Sym: st_name (4), st_info (1),
// st_other (1), st_shndx (2), st_value (8), st_size (8).
const elf64SymSize = 24

// entryPointSymbols returns the symbols of f's .symtab and .dynsym whose
// names are entry points. It reads the tables in place rather than through
// elf.File.Symbols, which builds every symbol with its name: libLLVM's
// 14 MB of them (a sixth of its extraction's allocations) for none.
func entryPointSymbols(f *elf.File) []elf.Symbol {
	var out []elf.Symbol
	for _, typ := range []elf.SectionType{elf.SHT_SYMTAB, elf.SHT_DYNSYM} {
		sec := f.SectionByType(typ)
		if sec == nil || sec.Link == 0 || int(sec.Link) >= len(f.Sections) {
			continue
		}
		strs, err := f.Sections[sec.Link].Data()
		if err != nil {
			continue
		}
		r := bufio.NewReader(sec.Open())
		var ent [elf64SymSize]byte
		for {
			if _, err := io.ReadFull(r, ent[:]); err != nil {
				break
			}
			off := f.ByteOrder.Uint32(ent[0:])
			if int(off) >= len(strs) {
				continue
			}
			name := strs[off:]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if !isEntryPointName(name) {
				continue
			}
			out = append(out, elf.Symbol{
				Name:    string(name),
				Info:    ent[4],
				Other:   ent[5],
				Section: elf.SectionIndex(f.ByteOrder.Uint16(ent[6:])),
				Value:   f.ByteOrder.Uint64(ent[8:]),
				Size:    f.ByteOrder.Uint64(ent[16:]),
			})
		}
	}
	return out
}

// isEntryPointName reports whether a symbol name, without its version or
// ABI suffix, is one markEntryPoints applies.
func isEntryPointName(name []byte) bool {
	if i := bytes.IndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	name = bytes.TrimSuffix(name, []byte(".abi0"))
	return stopSymbols[string(name)] || cloneSymbols[string(name)] || signalSymbols[string(name)]
}

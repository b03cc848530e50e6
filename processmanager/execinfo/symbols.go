package execinfo

import (
	"cmp"
	"debug/elf"
	"slices"
	"sort"
	"strings"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// symbolTable maps addresses to function names. Names live in one string and
// entries refer to them by offset, so a table with a million symbols is a
// few dozen megabytes and a handful of allocations.
type symbolTable struct {
	entries []symbolEntry
	names   string
}

type symbolEntry struct {
	start, end       uint64
	nameOff, nameEnd uint32
}

// symbolCandidate is a function symbol before the table is built.
type symbolCandidate struct {
	start, size uint64
	// sectionEnd bounds a symbol of unknown size that is last in the table.
	sectionEnd uint64
	name       string
	rank       int
}

// elfSymbolCandidates returns the function symbols (STT_FUNC and
// STT_GNU_IFUNC with an address) of a file. A symbol of size 0 (hand-written
// assembly often has no .size) is taken to extend to the next symbol or the
// end of its section.
func elfSymbolCandidates(f *elf.File, syms []elf.Symbol) []symbolCandidate {
	// Counted first: appending to a growing slice made twice the garbage
	// of the table itself, a third of a restart's allocations.
	n := 0
	for _, s := range syms {
		if isFunctionSymbol(s) {
			n++
		}
	}
	cands := make([]symbolCandidate, 0, n)
	for _, s := range syms {
		if !isFunctionSymbol(s) {
			continue
		}
		c := symbolCandidate{start: s.Value, size: s.Size, name: s.Name, rank: symbolRank(s)}
		if i := int(s.Section); i < len(f.Sections) {
			sec := f.Sections[i]
			c.sectionEnd = sec.Addr + sec.Size
		}
		cands = append(cands, c)
	}
	return cands
}

// isFunctionSymbol says s is a function (STT_FUNC or STT_GNU_IFUNC) defined
// at an address in a section of the file.
func isFunctionSymbol(s elf.Symbol) bool {
	typ := elf.ST_TYPE(s.Info)
	return (typ == elf.STT_FUNC || typ == elf.STT_GNU_IFUNC) &&
		s.Value != 0 && s.Name != "" && s.Section != elf.SHN_UNDEF && s.Section < elf.SHN_LORESERVE
}

// goSymbolRank puts functions named by .gopclntab behind any ELF symbol at
// the same address: a Go binary that kept .symtab has the same names there.
const goSymbolRank = 100

// goSymbolCandidates returns the functions of a Go binary's .gopclntab,
// which names them even when the binary is stripped. It stops at the first
// function the table cannot describe.
func goSymbolCandidates(syms *nativeunwind.GoSymbols) ([]symbolCandidate, error) {
	cands := make([]symbolCandidate, 0, syms.Len())
	for i := range syms.Len() {
		fn, err := syms.Func(i)
		if err != nil {
			return cands, err
		}
		if fn.End > fn.Entry && fn.Name != "" {
			cands = append(cands, symbolCandidate{start: fn.Entry, size: fn.End - fn.Entry, name: fn.Name, rank: goSymbolRank})
		}
	}
	return cands, nil
}

// symbolRank orders symbols at one address; lower is preferred.
func symbolRank(s elf.Symbol) int {
	rank := 0
	if s.Size == 0 {
		rank += 10
	}
	switch elf.ST_BIND(s.Info) {
	case elf.STB_GLOBAL:
	case elf.STB_WEAK:
		rank++
	default:
		rank += 2
	}
	if strings.HasPrefix(s.Name, "__GI_") {
		// glibc's alias for its own calls of a function (a debug
		// file's .symtab has both): the function's name is the other.
		rank += 3
	}
	return rank
}

// buildSymbolTable builds a table from candidates; of several at one address
// it keeps the lowest rank. It returns nil when there are none.
func buildSymbolTable(cands []symbolCandidate) *symbolTable {
	if len(cands) == 0 {
		return nil
	}
	// Sorted by a pointer-free key: moving the candidates themselves (a
	// runtime's binary has 200,000) was most of a process's set-up.
	type sortKey struct {
		start uint64
		rank  int32
		i     int32
	}
	keys := make([]sortKey, len(cands))
	for i, c := range cands {
		keys[i] = sortKey{c.start, int32(c.rank), int32(i)}
	}
	slices.SortFunc(keys, func(a, b sortKey) int {
		// Not cmp.Or, which would compare the names every time.
		if a.start != b.start {
			return cmp.Compare(a.start, b.start)
		}
		if a.rank != b.rank {
			return cmp.Compare(a.rank, b.rank)
		}
		return strings.Compare(cands[a.i].name, cands[b.i].name)
	})
	keys = slices.CompactFunc(keys, func(a, b sortKey) bool { return a.start == b.start })

	// Sized up front: the table lives as long as its file is mapped, and a
	// doubling builder's spare room was up to half of it.
	var names strings.Builder
	size := 0
	for _, k := range keys {
		size += len(cands[k.i].name)
	}
	names.Grow(min(size, 1<<32-1))
	t := &symbolTable{entries: make([]symbolEntry, 0, len(keys))}
	for i, k := range keys {
		c := &cands[k.i]
		end := c.start + c.size
		if c.size == 0 {
			end = c.start + 1
			if i+1 < len(keys) {
				end = keys[i+1].start
			}
			if c.sectionEnd > c.start && (i+1 == len(keys) || c.sectionEnd < end) {
				end = c.sectionEnd
			}
		}
		if end <= c.start {
			continue
		}
		off := names.Len()
		if off+len(c.name) > 1<<32-1 {
			break
		}
		names.WriteString(c.name)
		t.entries = append(t.entries, symbolEntry{
			start: c.start, end: end,
			nameOff: uint32(off), nameEnd: uint32(names.Len()),
		})
	}
	t.names = names.String()
	return t
}

// lookup returns the name of the function containing addr.
func (t *symbolTable) lookup(addr uint64) (string, bool) {
	if t == nil {
		return "", false
	}
	i := sort.Search(len(t.entries), func(i int) bool { return t.entries[i].start > addr }) - 1
	if i < 0 {
		return "", false
	}
	e := &t.entries[i]
	if addr >= e.end {
		return "", false
	}
	return t.names[e.nameOff:e.nameEnd], true
}

// len is the number of symbols.
func (t *symbolTable) len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strings"
	"sync"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Bounds on what is read from a process, which may be hostile or change
// under the reader, and on what is kept of it.
const (
	maxString    = 4096    // bytes of a label, path or name
	maxInsnInfos = 1 << 24 // entries of an instruction sequence's line table
	maxIvars     = 256     // entries of a class's instance variable table (3.1)
	// A Symbolizer's cache: objects, bytes, and pcs whose lines one
	// entry keeps (the hot ones of a method are few).
	cacheEntries = 4096
	cacheBytes   = 2 << 20
	cachedLines  = 64
	// entryOverhead approximates an entry's cost beyond its strings: the
	// entry, its LRU node and map slot; a cached line costs lineCost.
	entryOverhead = 200
	lineCost      = 24
)

// errBadObject says memory did not hold the object expected there: freed,
// moved by the garbage collector, or never one.
var errBadObject = errors.New("not the Ruby object expected")

// Frame is a Ruby frame as symbolized.
type Frame struct {
	// Function is a method's label with its class where the class has a
	// name ("Integer#times", "Chain.top", "fib"), a block's or other
	// code's label ("block in outer", "<main>", "<class:Foo>"), or a C
	// function's method name with its class.
	Function string
	File     string
	Line     int
}

// Symbolizer names a process's frames from its memory. It is safe for
// concurrent use.
//
// It caches what it read per object, bounded by entries and bytes. The
// garbage collector frees instruction sequences and method entries (code
// loaded again, a method redefined) and reuses their slots, so every hit
// is checked with the one read a miss starts with anyway, the object's
// first words: an entry counts only if the object is still the same kind
// of object with the same body (an instruction sequence's, which is freed
// with it) or the same definition and owner (a method entry's). A live
// object's body or definition does not change what is read from it.
type Symbolizer struct {
	mem io.ReaderAt
	l   *Layout
	// symbols is the process address of ruby_global_symbols.
	symbols uint64

	cache *interpreter.SymbolCache[uint64, *cachedObject]

	// mu guards the lines of the cached objects and ivarIDs.
	mu sync.Mutex
	// ivarIDs are the IDs of the hidden instance variables found so far,
	// by name (before 3.3).
	ivarIDs map[string]uint64
}

// NewSymbolizer reads a process of version v through mem; symbols is the
// process address of ruby_global_symbols.
func NewSymbolizer(mem io.ReaderAt, v interpreter.Version, symbols uint64) (*Symbolizer, error) {
	l, err := LayoutFor(v)
	if err != nil {
		return nil, err
	}
	return &Symbolizer{mem: mem, l: l, symbols: symbols, cache: newCache(), ivarIDs: map[string]uint64{}}, nil
}

// newCache counts an entry at what it holds when added; Frame counts the
// lines it adds later.
func newCache() *interpreter.SymbolCache[uint64, *cachedObject] {
	return interpreter.NewSymbolCache[uint64](cacheEntries, cacheBytes, (*cachedObject).cost)
}

// Stats returns the counts of the lookups so far.
func (s *Symbolizer) Stats() interpreter.CacheStats { return s.cache.Stats() }

func (s *Symbolizer) word(addr uint64) (uint64, error) {
	var b [8]byte
	if _, err := s.mem.ReadAt(b[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("reading %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (s *Symbolizer) u32(addr uint64) (uint32, error) {
	var b [4]byte
	if _, err := s.mem.ReadAt(b[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("reading %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// objectID is what identifies an object between lookups: its imemo type
// and the fields its entry was built from.
type objectID struct {
	typ  uint64
	a, b uint64
}

// cachedObject is what a frame of an object is named from.
type cachedObject struct {
	id       objectID
	function string
	file     string
	// body is the instruction sequence's body lines are read from; 0 for
	// a C function.
	body  uint64
	lines map[uint64]int
}

func (e *cachedObject) cost() int {
	return len(e.function) + len(e.file) + entryOverhead + lineCost*len(e.lines)
}

// Frame names the frame of the object obj at pc, as the unwinder reports
// it: a method entry (a method's frame, or a C function's), or an
// instruction sequence (a block, a class body, <main>). pc is 0 for a
// frame that has not started; a C function's is ignored.
func (s *Symbolizer) Frame(obj, pc uint64) (Frame, error) {
	if obj == 0 || obj&7 != 0 || obj >= 1<<56 {
		return Frame{}, fmt.Errorf("%w: object address %#x", errBadObject, obj)
	}
	var hdr [40]byte // rb_method_entry_t; an rb_iseq_t's first fields
	if _, err := s.mem.ReadAt(hdr[:], int64(obj)); err != nil {
		return Frame{}, fmt.Errorf("reading %#x: %w", obj, err)
	}
	field := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	flags := field(0)
	if flags&typeMask == typeMoved {
		// Compaction moved the object since the sample; the slot forwards
		// to it until the next collection.
		dest := field(movedDestination)
		if dest == 0 || dest&7 != 0 || dest >= 1<<56 {
			return Frame{}, fmt.Errorf("%w: %#x moved to %#x", errBadObject, obj, dest)
		}
		if _, err := s.mem.ReadAt(hdr[:], int64(dest)); err != nil {
			return Frame{}, fmt.Errorf("reading %#x: %w", dest, err)
		}
		flags = field(0)
	}
	if flags&typeMask != typeIMemo {
		return Frame{}, fmt.Errorf("%w: flags %#x at %#x", errBadObject, flags, obj)
	}
	id := objectID{typ: flags >> imemoShift & imemoMask}
	switch id.typ {
	case imemoISeq:
		id.a = field(s.l.ISeqBody)
	case imemoMEnt:
		id.a, id.b = field(s.l.MEDef), field(s.l.MEOwner)
	default:
		return Frame{}, fmt.Errorf("%w: imemo type %d at %#x", errBadObject, id.typ, obj)
	}

	e, err := s.cache.Get(obj, func(e *cachedObject) bool { return e.id == id },
		func() (*cachedObject, error) { return s.load(id) })
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Function: e.function, File: e.file}
	if e.body == 0 {
		return f, nil
	}
	if f.Line, err = s.cachedLine(obj, e, pc); err != nil {
		return Frame{}, fmt.Errorf("line: %w", err)
	}
	return f, nil
}

// cachedLine is the line of pc in the cached object e, kept in e while it
// holds few.
func (s *Symbolizer) cachedLine(obj uint64, e *cachedObject, pc uint64) (int, error) {
	s.mu.Lock()
	line, ok := e.lines[pc]
	s.mu.Unlock()
	if ok {
		return line, nil
	}
	line, err := s.line(e.body, pc)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	grew := len(e.lines) < cachedLines
	if grew {
		e.lines[pc] = line
	}
	cost := e.cost()
	s.mu.Unlock()
	if grew {
		s.cache.SetCost(obj, e, cost)
	}
	return line, nil
}

// load reads what the frames of the object id describes are named from.
func (s *Symbolizer) load(id objectID) (*cachedObject, error) {
	if id.typ == imemoISeq {
		return s.loadISeq(id, id.a, "")
	}
	def, owner := id.a, id.b
	typ, err := s.u32(def)
	if err != nil {
		return nil, err
	}
	class, sep := s.className(owner)
	switch typ & defTypeMask {
	case methodTypeISeq:
		iseq, err := s.word(def + defBody)
		if err != nil {
			return nil, err
		}
		if err := s.checkIMemo(iseq, imemoISeq); err != nil {
			return nil, err
		}
		body, err := s.word(iseq + s.l.ISeqBody)
		if err != nil {
			return nil, err
		}
		return s.loadISeq(id, body, class+sep)
	case methodTypeCFunc:
		mid, err := s.word(def + s.l.DefOriginalID)
		if err != nil {
			return nil, err
		}
		name, err := s.idName(mid)
		if err != nil {
			return nil, fmt.Errorf("method name: %w", err)
		}
		return &cachedObject{id: id, function: class + sep + name}, nil
	}
	return nil, fmt.Errorf("%w: method type %d", errBadObject, typ&defTypeMask)
}

// loadISeq reads the label and path of an instruction sequence's body;
// prefix goes before the label (a method's class).
func (s *Symbolizer) loadISeq(id objectID, body uint64, prefix string) (*cachedObject, error) {
	label, err := s.stringAt(body + s.l.BodyLabel)
	if err != nil {
		return nil, fmt.Errorf("label: %w", err)
	}
	file, err := s.path(body + s.l.BodyPathObj)
	if err != nil {
		return nil, fmt.Errorf("path: %w", err)
	}
	return &cachedObject{id: id, function: prefix + label, file: file, body: body, lines: map[uint64]int{}}, nil
}

// checkIMemo checks that addr holds an imemo of the type.
func (s *Symbolizer) checkIMemo(addr uint64, typ uint64) error {
	flags, err := s.word(addr)
	if err != nil {
		return err
	}
	if flags&typeMask != typeIMemo || flags>>imemoShift&imemoMask != typ {
		return fmt.Errorf("%w: flags %#x at %#x", errBadObject, flags, addr)
	}
	return nil
}

// line is the source line of pc in the body's line table: the entry of
// the instruction before pc (pc points past the one running), found
// through positions or, in release builds, the succinct index table
// (iseq.c's succ_index_lookup; internals.md §5).
func (s *Symbolizer) line(body, pc uint64) (int, error) {
	first, err := s.word(body + s.l.BodyFirstLine)
	if err != nil {
		return 0, err
	}
	firstLine := int(int32(first))
	if s.l.FirstLineFixnum {
		firstLine = int(int64(first) >> 1)
	}
	encoded, err := s.word(body + s.l.BodyEncoded)
	if err != nil {
		return 0, err
	}
	info := body + s.l.BodyInsnsInfo
	entries, err := s.word(info)
	if err != nil {
		return 0, err
	}
	positions, err := s.word(info + 8)
	if err != nil {
		return 0, err
	}
	n, err := s.u32(info + 16)
	if err != nil {
		return 0, err
	}
	table, err := s.word(info + 24)
	if err != nil {
		return 0, err
	}
	if pc == 0 || pc < encoded || n == 0 {
		return firstLine, nil
	}
	size, err := s.u32(body + s.l.BodyEncoded - 4) // iseq_size, in words
	if err != nil {
		return 0, err
	}
	if pc > encoded+8*uint64(size) {
		// Not this sequence's: YJIT leaves a frame's pc unset until its
		// code saves one (a callee's frame holds its caller's).
		return 0, nil
	}
	if n > maxInsnInfos {
		return 0, fmt.Errorf("%w: %d line table entries", errBadObject, n)
	}
	pos := (pc - encoded) / 8
	if pos > 0 {
		pos--
	}
	var idx uint64
	switch {
	case n == 1:
		idx = 0
	case positions != 0:
		// The last entry whose position is at or before pos.
		lo, hi := uint64(0), uint64(n)
		for lo+1 < hi {
			mid := (lo + hi) / 2
			p, err := s.u32(positions + 4*mid)
			if err != nil {
				return 0, err
			}
			if uint64(p) <= pos {
				lo = mid
			} else {
				hi = mid
			}
		}
		idx = lo
	default:
		rank, err := s.succRank(table, pos)
		if err != nil {
			return 0, err
		}
		if rank == 0 || rank > uint64(n) {
			return 0, fmt.Errorf("%w: line table rank %d of %d", errBadObject, rank, n)
		}
		idx = rank - 1
	}
	line, err := s.u32(entries + idx*s.l.InsnInfoSize)
	return int(int32(line)), err
}

// Succinct index table (iseq.c): the ranks of the first immediateSize
// positions packed 9 to a word, 7 bits each; the rest in blocks of 512
// positions: a base rank, the ranks of its 64-position small blocks (9
// bits each after the first), and the bits.
const (
	immediateSize  = 54
	succBlockStart = 48 // 6 words of immediate ranks
	succBlockSize  = 80 // u32 rank, pad, u64 small ranks, u64 bits[8]
)

func (s *Symbolizer) succRank(table, pos uint64) (uint64, error) {
	if table == 0 {
		return 0, fmt.Errorf("%w: no line table", errBadObject)
	}
	if pos < immediateSize {
		w, err := s.word(table + 8*(pos/9))
		return w >> (7 * (pos % 9)) & 0x7f, err
	}
	x := pos - immediateSize
	blk := table + succBlockStart + x/512*succBlockSize
	b := x % 512
	sb := b / 64
	base, err := s.u32(blk)
	if err != nil {
		return 0, err
	}
	small := uint64(0)
	if sb > 0 {
		ranks, err := s.word(blk + 8)
		if err != nil {
			return 0, err
		}
		small = ranks >> (9 * (sb - 1)) & 0x1ff
	}
	w, err := s.word(blk + 16 + 8*sb)
	if err != nil {
		return 0, err
	}
	return uint64(base) + small + uint64(bits.OnesCount64(w<<(63-b%64))), nil
}

// stringAt reads the String whose VALUE is at addr.
func (s *Symbolizer) stringAt(addr uint64) (string, error) {
	v, err := s.word(addr)
	if err != nil {
		return "", err
	}
	return s.str(v)
}

// str reads the String v.
func (s *Symbolizer) str(v uint64) (string, error) {
	if v == 0 || v&7 != 0 {
		return "", fmt.Errorf("%w: %#x is no String", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return "", err
	}
	if flags&typeMask != typeString {
		return "", fmt.Errorf("%w: %#x is no String (flags %#x)", errBadObject, v, flags)
	}
	var n, ptr uint64
	switch {
	case flags&strNoEmbed != 0:
		if n, err = s.word(v + s.l.StrLen); err != nil {
			return "", err
		}
		if ptr, err = s.word(v + s.l.StrPtr); err != nil {
			return "", err
		}
	case s.l.StrEmbedLenInFlags:
		n, ptr = flags>>14&0x1f, v+s.l.StrEmbedded
	default:
		if n, err = s.word(v + s.l.StrLen); err != nil {
			return "", err
		}
		ptr = v + s.l.StrEmbedded
	}
	if n > maxString {
		return "", fmt.Errorf("%w: String of %d bytes", errBadObject, n)
	}
	b := make([]byte, n)
	if _, err := s.mem.ReadAt(b, int64(ptr)); err != nil {
		return "", fmt.Errorf("reading a String at %#x: %w", ptr, err)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

// path reads the path of a pathobj: a String, or an Array [path, realpath]
// of which the first is the path backtraces show.
func (s *Symbolizer) path(addr uint64) (string, error) {
	v, err := s.word(addr)
	if err != nil {
		return "", err
	}
	if v == 0 || v&7 != 0 {
		return "", fmt.Errorf("%w: pathobj %#x", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return "", err
	}
	if flags&typeMask == typeArray {
		first, err := s.arrayEntry(v, flags, 0)
		if err != nil {
			return "", err
		}
		return s.str(first)
	}
	return s.str(v)
}

// arrayEntry reads element i of the Array v whose flags are given.
func (s *Symbolizer) arrayEntry(v, flags, i uint64) (uint64, error) {
	var n, elems uint64
	if flags&aryEmbedded != 0 {
		n, elems = flags&s.l.AryEmbedLenMask>>15, v+s.l.AryEmbedded
	} else {
		var err error
		if n, err = s.word(v + s.l.AryLen); err != nil {
			return 0, err
		}
		if elems, err = s.word(v + s.l.AryPtr); err != nil {
			return 0, err
		}
	}
	if i >= n {
		return 0, fmt.Errorf("%w: entry %d of an Array of %d", errBadObject, i, n)
	}
	return s.word(elems + 8*i)
}

// idName reads an ID's name from the global symbol table (symbol.c's
// get_id_serial_entry).
func (s *Symbolizer) idName(id uint64) (string, error) {
	serial := id
	if id > s.l.LastOpID {
		serial = id >> idScopeShift
	}
	last, err := s.u32(s.symbols)
	if err != nil {
		return "", err
	}
	if serial == 0 || serial > uint64(last) {
		return "", fmt.Errorf("%w: ID %#x (serial %d of %d)", errBadObject, id, serial, last)
	}
	ids, err := s.word(s.symbols + symbolsIDs)
	if err != nil {
		return "", err
	}
	chunk, err := s.arrayAt(ids, serial/idEntryUnit)
	if err != nil {
		return "", err
	}
	str, err := s.arrayAt(chunk, serial%idEntryUnit*idEntrySize)
	if err != nil {
		return "", err
	}
	return s.str(str)
}

// arrayAt reads element i of the Array v.
func (s *Symbolizer) arrayAt(v, i uint64) (uint64, error) {
	if v == 0 || v&7 != 0 {
		return 0, fmt.Errorf("%w: %#x is no Array", errBadObject, v)
	}
	flags, err := s.word(v)
	if err != nil {
		return 0, err
	}
	if flags&typeMask != typeArray {
		return 0, fmt.Errorf("%w: %#x is no Array (flags %#x)", errBadObject, v, flags)
	}
	return s.arrayEntry(v, flags, i)
}

// className is a class's path and the separator of its methods: "#" for
// instance methods, "." for a singleton class's (the attached class's
// methods). Empty where the class has none (anonymous).
func (s *Symbolizer) className(class uint64) (string, string) {
	if class == 0 || class&7 != 0 {
		return "", ""
	}
	flags, err := s.word(class)
	if err != nil {
		return "", ""
	}
	sep := "#"
	if flags&s.l.SingletonFlag != 0 {
		if class, err = s.classField(class, s.l.SingletonAttached, "__attached__"); err != nil || class == 0 || class&7 != 0 {
			return "", ""
		}
		sep = "."
	}
	path, err := s.classField(class, s.l.ClassPath, "__classpath__")
	if err != nil || path == 0 || path == s.l.Nil {
		return "", ""
	}
	name, err := s.str(path)
	if err != nil {
		return "", ""
	}
	return name, sep
}

// classField reads what a class keeps at offset off (3.3+) or, before,
// in its hidden instance variable ivar.
func (s *Symbolizer) classField(class, off uint64, ivar string) (uint64, error) {
	if s.l.ClassExt == 0 {
		return s.word(class + off)
	}
	return s.ivar(class, ivar)
}

// st_table (st.h, 3.1): where its live entries are, and an entry: {hash,
// key, record}, a deleted one's hash all ones (st.c).
const (
	stEntriesStart = 32
	stEntriesBound = 40
	stEntries      = 48
	stEntrySize    = 24
	stDeleted      = ^uint64(0)
)

// ivar reads a class's hidden instance variable before 3.3: the st_table
// at its classext's iv_tbl maps IDs to values. The variable's ID is found
// by its name the first time and kept.
func (s *Symbolizer) ivar(class uint64, name string) (uint64, error) {
	ext, err := s.word(class + s.l.ClassExt)
	if err != nil {
		return 0, err
	}
	tbl, err := s.word(ext + s.l.ExtIvTbl)
	if err != nil {
		return 0, err
	}
	var hdr [stEntries + 8]byte
	if _, err := s.mem.ReadAt(hdr[:], int64(tbl)); err != nil {
		return 0, fmt.Errorf("instance variables of %#x: %w", class, err)
	}
	start := binary.LittleEndian.Uint64(hdr[stEntriesStart:])
	bound := binary.LittleEndian.Uint64(hdr[stEntriesBound:])
	entries := binary.LittleEndian.Uint64(hdr[stEntries:])
	if bound < start || bound-start > maxIvars {
		return 0, fmt.Errorf("%w: instance variable table entries [%d, %d)", errBadObject, start, bound)
	}
	buf := make([]byte, stEntrySize*(bound-start))
	if _, err := s.mem.ReadAt(buf, int64(entries+stEntrySize*start)); err != nil {
		return 0, fmt.Errorf("instance variables of %#x: %w", class, err)
	}
	s.mu.Lock()
	want, known := s.ivarIDs[name]
	s.mu.Unlock()
	for e := buf; len(e) >= stEntrySize; e = e[stEntrySize:] {
		hash, key := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:])
		if hash == stDeleted {
			continue
		}
		if !known {
			if n, err := s.idName(key); err != nil || n != name {
				continue
			}
			s.mu.Lock()
			s.ivarIDs[name] = key
			s.mu.Unlock()
		} else if key != want {
			continue
		}
		return binary.LittleEndian.Uint64(e[16:]), nil
	}
	return 0, fmt.Errorf("%w: class %#x has no %s", errBadObject, class, name)
}

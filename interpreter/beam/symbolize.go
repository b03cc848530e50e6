package beam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
)

// Layout of the emulator's code structures read to name a JIT address
// (internals.md §4, measured on Debian's OTP 27 and 29 for amd64; the
// arm64 builds' loads agree).
const (
	// BeamCodeHeader (beam_code.h): num_functions, line_table, and the
	// functions[] array of ErtsCodeInfo pointers, num_functions+1 long
	// (the last is the module's code end). OTP 29's header has two more
	// words before functions[].
	headerNumFunctions = 0
	headerLineTable    = 72
	headerFunctions27  = 136
	headerFunctions29  = 152
	// ErtsCodeInfo (code_ix.h): the MFA {module atom, function atom,
	// arity} after the JIT's prologue bytes.
	codeInfoMFA = 16
	mfaSize     = 24
)

// Bounds on what is trusted of the target's memory.
const (
	maxModules   = 1 << 20 // entries of a ranges table
	maxFunctions = 1 << 20 // functions of a module
	maxArity     = 255     // MAX_ARG in the emulator
	// searchWindow is how few sorted entries a search reads at once
	// instead of halving further with one read per step.
	searchWindow = 64
)

// Cache bounds: frames by PC, atom names by atom, modules' line tables
// (with their file names) by code header.
const (
	frameEntries   = 16384
	frameBytes     = 4 << 20
	atomEntries    = 16384
	atomBytes      = 1 << 20
	moduleEntries  = 4096
	moduleBytes    = 2 << 20
	entryOverhead  = 120 // an entry's LRU node, map slot and struct
	moduleOverhead = 400 // a cachedModule and its lineTable
)

// errNoFunction says an address lies in no module's function: a stale
// continuation pointer, a trampoline, or the JIT's shared fragments.
var errNoFunction = errors.New("beam: address in no Erlang function")

// errBadObject says memory did not hold the structure expected there.
var errBadObject = errors.New("beam: not the emulator structure expected")

// symbolizer names JIT addresses of one BEAM process from its memory. It
// is safe for concurrent use.
//
// Frames are cached by the address looked up, with the code generation
// (the active ranges table) they were named in and the ErtsCodeInfo and
// MFA found: a hit counts only in the same generation (read again at
// most every genTTL, so any load, reload or purge drops every frame) and
// if that ErtsCodeInfo still holds the same MFA (one read). Modules' line
// tables are cached by code header while the header's words are the same.
// Atom names are cached by atom: the emulator never frees atoms.
type symbolizer struct {
	mem       io.ReaderAt
	r         *procmem.Reader
	tables    Tables
	otp       int
	functions uint64 // offset of BeamCodeHeader.functions

	atomsMu    sync.Mutex
	atomTab    atomTable // found on first use
	atomErr    error
	atomFailed time.Time

	genMu sync.Mutex
	gen   codeGen // the last read, at genAt
	genAt time.Time

	frames  *interpreter.SymbolCache[uint64, *cachedFrame]
	atoms   *interpreter.SymbolCache[uint64, string]
	modules *interpreter.SymbolCache[uint64, *cachedModule]
}

// cachedFrame is a symbolized address and what identifies its function
// between lookups.
type cachedFrame struct {
	gen      codeGen
	codeInfo uint64
	mfa      [3]uint64
	frame    libpf.Frame
}

// newSymbolizer reads a BEAM process's code through mem; tables are
// FindTables' addresses relocated to the process (load bias added), otp
// the major release (27 or 29). Another release fails every frame.
func newSymbolizer(mem io.ReaderAt, tables Tables, otp int) *symbolizer {
	s := &symbolizer{
		mem:    mem,
		r:      procmem.New(mem),
		tables: tables,
		otp:    otp,
		frames: interpreter.NewSymbolCache[uint64](frameEntries, frameBytes, func(f *cachedFrame) int {
			return len(f.frame.FunctionName) + len(f.frame.SourceFile) + entryOverhead
		}),
		atoms: interpreter.NewSymbolCache[uint64](atomEntries, atomBytes, func(name string) int {
			return len(name) + entryOverhead
		}),
		modules: interpreter.NewSymbolCache[uint64](moduleEntries, moduleBytes, func(m *cachedModule) int {
			return int(m.cost.Load())
		}),
	}
	switch otp {
	case 27:
		s.functions = headerFunctions27
	case 29:
		s.functions = headerFunctions29
	}
	return s
}

// Stats returns the counts of the frame lookups so far.
func (s *symbolizer) Stats() interpreter.CacheStats { return s.frames.Stats() }

// frame names the code at pc, a process address in JIT code: the
// interrupted PC (returnAddress false) or a return address/continuation
// pointer (true: look up pc-1, the call). The frame's Kind is left to the
// caller. An address in no function is errNoFunction.
func (s *symbolizer) frame(pc uint64, returnAddress bool) (libpf.Frame, error) {
	if s.functions == 0 {
		return libpf.Frame{}, fmt.Errorf("beam: OTP %d is not supported", s.otp)
	}
	if returnAddress {
		pc--
	}
	f, err := s.frames.Get(pc, s.stillValid, func() (*cachedFrame, error) { return s.lookup(pc) })
	if err != nil {
		return libpf.Frame{}, err
	}
	return f.frame, nil
}

// stillValid says whether f was named in the current code generation
// and its ErtsCodeInfo still holds its MFA.
func (s *symbolizer) stillValid(f *cachedFrame) bool {
	if g, err := s.generation(); err != nil || g != f.gen {
		return false
	}
	mfa, err := s.mfa(f.codeInfo)
	return err == nil && mfa == f.mfa
}

func (s *symbolizer) mfa(codeInfo uint64) ([3]uint64, error) {
	var b [mfaSize]byte
	if err := s.r.Read(codeInfo+codeInfoMFA, b[:]); err != nil {
		return [3]uint64{}, err
	}
	return [3]uint64{binary.LittleEndian.Uint64(b[:]), binary.LittleEndian.Uint64(b[8:]),
		binary.LittleEndian.Uint64(b[16:])}, nil
}

// lookup symbolizes pc without the frame cache: the module from the
// active ranges table, the function from the module's code header, its
// name from the atom table and its line from the module's line table.
func (s *symbolizer) lookup(pc uint64) (*cachedFrame, error) {
	g, err := s.readGeneration()
	if err != nil {
		return nil, err
	}
	header, err := s.module(g, pc)
	if err != nil {
		return nil, err
	}
	var hb [headerLineTable + 8]byte
	if err := s.r.Read(header, hb[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(hb[headerNumFunctions:])
	if n == 0 || n > maxFunctions {
		return nil, fmt.Errorf("%w: code header %#x with %d functions", errBadObject, header, n)
	}
	// The module's line table, cached while its header holds the same
	// words (counts, and pointers to what the loader allocated for it).
	mod, err := s.modules.Get(header, func(m *cachedModule) bool { return m.head == hb },
		func() (*cachedModule, error) { return s.readModule(hb) })
	if err != nil {
		return nil, err
	}
	funcs := header + s.functions
	// functions[n] is the module's end: pc must be below it. The JIT puts
	// a stub and jump veneers between the last function's code and
	// functions[n] (the JIT's own symbol listing, +JPperf, counts them to
	// the module's footer); they are named as the last function: nothing
	// in memory marks where that function's code ends.
	i, rec, err := s.search(funcs, n+1, 8, pc)
	if err != nil {
		return nil, err
	}
	if i >= n {
		return nil, fmt.Errorf("%w: %#x after the last function of the module at %#x", errNoFunction, pc, header)
	}
	codeInfo := rec[0]
	mfa, err := s.mfa(codeInfo)
	if err != nil {
		return nil, err
	}
	if !isAtom(mfa[0]) || !isAtom(mfa[1]) || mfa[2] > maxArity {
		return nil, fmt.Errorf("%w: ErtsCodeInfo at %#x holds MFA %#x", errBadObject, codeInfo, mfa)
	}
	module, err := s.atomName(mfa[0])
	if err != nil {
		return nil, fmt.Errorf("module of %#x: %w", pc, err)
	}
	function, err := s.atomName(mfa[1])
	if err != nil {
		return nil, fmt.Errorf("function of %#x: %w", pc, err)
	}
	f := &cachedFrame{gen: g, codeInfo: codeInfo, mfa: mfa}
	f.frame.FunctionName = functionName(module, function, mfa[2])
	// A missing or unreadable line table leaves the frame without a line:
	// its name is still right.
	if mod.lines != nil {
		if file, line, grew, err := s.line(mod.lines, i, pc); err == nil {
			f.frame.SourceFile, f.frame.SourceLine = file, line
			if grew > 0 {
				s.modules.SetCost(header, mod, int(mod.cost.Add(int64(grew))))
			}
		}
	}
	return f, nil
}

// cachedModule is what a module's code header says beyond its functions:
// its line table, if any.
type cachedModule struct {
	head  [headerLineTable + 8]byte
	lines *lineTable
	cost  atomic.Int64
}

func (s *symbolizer) readModule(head [headerLineTable + 8]byte) (*cachedModule, error) {
	m := &cachedModule{head: head}
	m.cost.Store(moduleOverhead)
	if lt := binary.LittleEndian.Uint64(head[headerLineTable:]); lt != 0 {
		var err error
		if m.lines, err = s.readLineTable(lt); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// functionName spells an MFA as Erlang does ("lists:map/2",
// "erl_init:'-restart/0-fun-0-'/0"), and an Elixir module's function as
// Elixir does ("Foo.Bar.baz?/1" for the module atom 'Elixir.Foo.Bar',
// "anonymous fn/1 in Foo.Bar.baz?/1" for its fun '-baz?/1-fun-0-').
func functionName(module, function string, arity uint64) string {
	a := strconv.FormatUint(arity, 10)
	if m, ok := strings.CutPrefix(module, "Elixir."); ok && m != "" {
		if parent, ok := elixirFunParent(function); ok {
			return "anonymous fn/" + a + " in " + m + "." + parent
		}
		return m + "." + function + "/" + a
	}
	return quoteAtom(module) + ":" + quoteAtom(function) + "/" + a
}

// elixirFunParent returns "name/arity" of the function whose fun the
// compiler named "-name/arity-fun-N-".
func elixirFunParent(function string) (string, bool) {
	rest, ok := strings.CutPrefix(function, "-")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "-fun-")
	if i < 0 || !strings.HasSuffix(rest, "-") || !isDigits(rest[i+len("-fun-"):len(rest)-1]) {
		return "", false
	}
	parent := rest[:i]
	slash := strings.LastIndexByte(parent, '/')
	if slash <= 0 || !isDigits(parent[slash+1:]) {
		return "", false
	}
	return parent, true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// quoteAtom writes an atom as the emulator's own printer does (its
// +JPperf symbol listing, crash dumps): bare if it is a lower-case letter followed by
// letters, digits, _ and @, else in single quotes with ' and \ escaped.
// Reserved words stay bare, as there (prim_eval:receive/2), unlike
// io_lib. Non-ASCII letters are quoted (the printer knows Latin-1 ones;
// they are rare in code).
func quoteAtom(a string) string {
	bare := a != "" && a[0] >= 'a' && a[0] <= 'z'
	for i := 0; bare && i < len(a); i++ {
		c := a[i]
		bare = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '@'
	}
	if bare {
		return a
	}
	var b strings.Builder
	b.WriteByte('\'')
	for _, r := range a {
		if r == '\'' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('\'')
	return b.String()
}

// codeGen identifies the active ranges table. The emulator commits every
// code change (a load, a reload, a purge) by switching the active code
// index to a table built for it (code_ix.c, beam_ranges.c).
type codeGen struct {
	ix         uint32
	modules, n uint64
}

// genTTL is how long a code generation read is trusted for cached
// frames: a code change reaches them at most this late.
const genTTL = 20 * time.Millisecond

// readGeneration reads the active code index and its ranges table.
func (s *symbolizer) readGeneration() (codeGen, error) {
	ix, err := s.r.U32(s.tables.ActiveCodeIndex)
	if err != nil {
		return codeGen{}, err
	}
	if ix >= numCodeIx {
		return codeGen{}, fmt.Errorf("%w: active code index %d", errBadObject, ix)
	}
	var rec [16]byte
	if err := s.r.Read(s.tables.Ranges+uint64(ix)*rangesSize, rec[:]); err != nil {
		return codeGen{}, err
	}
	g := codeGen{ix: ix, modules: binary.LittleEndian.Uint64(rec[:]), n: binary.LittleEndian.Uint64(rec[rangesNOffset:])}
	if g.n == 0 || g.n > maxModules {
		return codeGen{}, fmt.Errorf("%w: ranges table of %d modules", errBadObject, g.n)
	}
	s.genMu.Lock()
	s.gen, s.genAt = g, time.Now()
	s.genMu.Unlock()
	return g, nil
}

// firstModule is the code header of the first module of the active
// ranges table: an address in the JIT's code.
func (s *symbolizer) firstModule() (uint64, error) {
	g, err := s.readGeneration()
	if err != nil {
		return 0, err
	}
	return s.r.U64(g.modules)
}

// generation is the code generation, read again once genTTL has passed.
func (s *symbolizer) generation() (codeGen, error) {
	s.genMu.Lock()
	g, fresh := s.gen, time.Since(s.genAt) < genTTL
	s.genMu.Unlock()
	if fresh {
		return g, nil
	}
	return s.readGeneration()
}

// module returns the code header of the module whose range holds pc in
// the ranges table of generation g (beam_ranges.c: Range {start, end}
// sorted by start; start is the code header).
func (s *symbolizer) module(g codeGen, pc uint64) (uint64, error) {
	_, rng, err := s.search(g.modules, g.n, 1<<rangeSizeShift, pc)
	if err != nil {
		return 0, err
	}
	start, end := rng[0], rng[1]
	if pc >= end {
		return 0, fmt.Errorf("%w: %#x in no module's range", errNoFunction, pc)
	}
	return start, nil
}

// search finds, in n records of stride bytes at addr whose first words
// ascend, the last whose first word is at most key, and returns its
// index and its words: it halves with one read per step down to
// searchWindow records, then reads those at once. Memory that changes
// under it gives a wrong index or an error, never a longer search: every
// step halves the window.
func (s *symbolizer) search(addr, n, stride, key uint64) (uint64, []uint64, error) {
	if n == 0 || n > 1<<24 || addr > procmem.MaxPointer {
		return 0, nil, fmt.Errorf("%w: array of %d at %#x", errBadObject, n, addr)
	}
	lo, hi := uint64(0), n // the answer is in [lo, hi) if any
	for hi-lo > searchWindow {
		mid := lo + (hi-lo)/2
		v, err := s.r.U64(addr + mid*stride)
		if err != nil {
			return 0, nil, err
		}
		if v <= key {
			lo = mid
		} else {
			hi = mid
		}
	}
	var window [searchWindow * 16]byte
	buf := window[:(hi-lo)*stride]
	if err := s.r.Read(addr+lo*stride, buf); err != nil {
		return 0, nil, err
	}
	found := -1
	for j := 0; j < int(hi-lo); j++ {
		if binary.LittleEndian.Uint64(buf[uint64(j)*stride:]) > key {
			break
		}
		found = j
	}
	if found < 0 {
		return 0, nil, fmt.Errorf("%w: %#x before the first entry at %#x", errNoFunction, key, addr)
	}
	rec := make([]uint64, stride/8)
	for k := range rec {
		rec[k] = binary.LittleEndian.Uint64(buf[uint64(found)*stride+8*uint64(k):])
	}
	return lo + uint64(found), rec, nil
}

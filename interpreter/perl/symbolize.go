package perl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Bounds on what is read from a process, which may be hostile or change
// under the reader, and on what is kept of it.
const (
	maxString = 4096 // bytes of a name or file name
	// maxLine bounds a statement's line: larger ones are not read from a
	// live statement.
	maxLine = 1 << 28
	// The chunk a file name is read in first: most paths fit.
	fileChunk = 256
	// A Symbolizer's caches: subs (entries, bytes) and file names.
	cacheEntries = 4096
	cacheBytes   = 1 << 20
	fileEntries  = 1024
	fileBytes    = 256 << 10
	// entryOverhead approximates an entry's cost beyond its string: the
	// entry, its LRU node and map slot.
	entryOverhead = 120
)

// errBadObject says memory did not hold the object expected there: freed,
// reused, or never one.
var errBadObject = errors.New("not the Perl object expected")

// Frame is a Perl frame as symbolized.
type Frame struct {
	// Function is a sub's name with its package ("main::top",
	// "Foo::Bar::baz"), "(eval)" for eval {} and eval STRING (what
	// caller() says; the code of a string eval is in a file "(eval N)"),
	// "(require)" for require and do FILE, and "main" for the file-level
	// code.
	Function string
	File     string
	Line     int
}

// Symbolizer names a process's frames from its memory. It is safe for
// concurrent use.
//
// Sub names are cached by CV, file names by the address of their string,
// bounded by entries and bytes. A sub redefined frees its CV, whose head
// and body perl reuses for other SVs, so every hit is checked with one read
// of the CV's head and one of its body, which a miss starts with anyway:
// the entry counts only if the head still holds a CV with the same body,
// the same GV (or name) and the same kind of name. A cached file name
// counts if the bytes at its address still spell it.
type Symbolizer struct {
	mem   io.ReaderAt
	l     *Layout
	subs  *interpreter.SymbolCache[uint64, *cachedSub]
	files *interpreter.SymbolCache[uint64, string]
}

// cachedSub is what a sub's frames are named from, and what identifies
// its CV between lookups.
type cachedSub struct {
	body, gv uint64
	named    bool
	function string
}

// NewSymbolizer reads a process of version v through mem.
func NewSymbolizer(mem io.ReaderAt, v interpreter.Version) (*Symbolizer, error) {
	l, err := LayoutFor(v)
	if err != nil {
		return nil, err
	}
	return &Symbolizer{mem: mem, l: l, subs: newSubCache(), files: newFileCache()}, nil
}

func newSubCache() *interpreter.SymbolCache[uint64, *cachedSub] {
	return interpreter.NewSymbolCache[uint64](cacheEntries, cacheBytes,
		func(e *cachedSub) int { return len(e.function) + entryOverhead })
}

func newFileCache() *interpreter.SymbolCache[uint64, string] {
	return interpreter.NewSymbolCache[uint64](fileEntries, fileBytes,
		func(name string) int { return len(name) + entryOverhead })
}

// Stats returns the counts of the sub lookups so far.
func (s *Symbolizer) Stats() interpreter.CacheStats { return s.subs.Stats() }

func (s *Symbolizer) read(addr uint64, b []byte) error {
	if addr == 0 || addr >= 1<<56 {
		return fmt.Errorf("%w: address %#x", errBadObject, addr)
	}
	if _, err := s.mem.ReadAt(b, int64(addr)); err != nil {
		return fmt.Errorf("reading %#x: %w", addr, err)
	}
	return nil
}

func (s *Symbolizer) word(addr uint64) (uint64, error) {
	var b [8]byte
	if err := s.read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// svHeadAt reads the head of an SV: its body, its flags and sv_u.
func (s *Symbolizer) svHeadAt(addr uint64) (body uint64, flags uint32, u uint64, err error) {
	var b [svHead]byte
	if addr&7 != 0 {
		return 0, 0, 0, fmt.Errorf("%w: SV at %#x", errBadObject, addr)
	}
	if err := s.read(addr, b[:]); err != nil {
		return 0, 0, 0, err
	}
	return binary.LittleEndian.Uint64(b[svAny:]), binary.LittleEndian.Uint32(b[svFlags:]), binary.LittleEndian.Uint64(b[svU:]), nil
}

// Frame names the frame the unwinder reported as id (a CV, or a frame
// tag: main, an eval) at the statement cop.
func (s *Symbolizer) Frame(id, cop uint64) (Frame, error) {
	var f Frame
	var err error
	switch {
	case id == frameMain:
		f.Function = "main"
	case id&^0xff == frameEval:
		typ := id & 0xff
		if typ&cxTypeMask != cxtEval {
			return Frame{}, fmt.Errorf("%w: eval frame of context type %#x", errBadObject, typ)
		}
		f.Function = "(eval)"
		if typ == cxtEval {
			// Neither CXp_REAL (eval STRING) nor CXp_EVALBLOCK: require
			// or do FILE (internals.md §4).
			f.Function = "(require)"
		}
	default:
		if f.Function, err = s.subName(id); err != nil {
			return Frame{}, err
		}
	}
	// A statement is part of its sub's op tree, freed with it, and a
	// string eval's are freed when it ends, perhaps before the sample is
	// symbolized: the frame keeps its name without a position then.
	f.File, f.Line, _ = s.position(cop)
	return f, nil
}

// position reads a statement's file and line; on an error, neither.
func (s *Symbolizer) position(cop uint64) (string, int, error) {
	off := s.l.COPLine
	var b [24]byte
	if cop&7 != 0 {
		return "", 0, fmt.Errorf("%w: COP at %#x", errBadObject, cop)
	}
	if err := s.read(cop+off, b[:s.l.COPFile+8-off]); err != nil {
		return "", 0, err
	}
	line := binary.LittleEndian.Uint32(b[:])
	file, err := s.fileName(binary.LittleEndian.Uint64(b[s.l.COPFile-off:]))
	if err != nil {
		return "", 0, err
	}
	if line > maxLine {
		return "", 0, fmt.Errorf("%w: line %d", errBadObject, line)
	}
	return file, int(line), nil
}

// fileName reads the NUL-terminated file name at addr (a COP's cop_file),
// through the cache: a hit is checked by reading the name's bytes and its
// NUL again.
func (s *Symbolizer) fileName(addr uint64) (string, error) {
	return s.files.Get(addr, func(name string) bool {
		b := make([]byte, len(name)+1)
		return s.read(addr, b) == nil && b[len(name)] == 0 && string(b[:len(name)]) == name
	}, func() (string, error) { return s.readFileName(addr) })
}

// readFileName reads the NUL-terminated file name at addr.
func (s *Symbolizer) readFileName(addr uint64) (string, error) {
	var buf []byte
	for n := uint64(fileChunk); ; n *= 2 {
		buf = make([]byte, n)
		if err := s.read(addr, buf); err != nil {
			return "", err
		}
		if i := bytes.IndexByte(buf, 0); i >= 0 {
			buf = buf[:i]
			break
		}
		if n >= maxString {
			return "", fmt.Errorf("%w: file name at %#x longer than %d bytes", errBadObject, addr, maxString)
		}
	}
	if bytes.ContainsFunc(buf, func(r rune) bool { return r < 0x20 }) {
		return "", fmt.Errorf("%w: file name at %#x has control characters", errBadObject, addr)
	}
	return strings.ToValidUTF8(string(buf), "\uFFFD"), nil
}

// subName names the sub of a CV, through the cache.
func (s *Symbolizer) subName(cv uint64) (string, error) {
	body, flags, _, err := s.svHeadAt(cv)
	if err != nil {
		return "", err
	}
	if flags&svTypeMask != svtPVCV {
		return "", fmt.Errorf("%w: flags %#x at %#x, not a CV", errBadObject, flags, cv)
	}
	var b [96]byte
	if err := s.read(body, b[:s.l.CVFlags+4]); err != nil {
		return "", err
	}
	id := cachedSub{
		body:  body,
		gv:    binary.LittleEndian.Uint64(b[s.l.CVGv:]),
		named: binary.LittleEndian.Uint32(b[s.l.CVFlags:])&cvfNamed != 0,
	}
	stash := binary.LittleEndian.Uint64(b[s.l.CVStash:])

	e, err := s.subs.Get(cv, func(e *cachedSub) bool { return e.body == id.body && e.gv == id.gv && e.named == id.named },
		func() (*cachedSub, error) {
			name, err := s.name(id, stash)
			if err != nil {
				return nil, err
			}
			e := id
			e.function = name
			return &e, nil
		})
	if err != nil {
		return "", err
	}
	return e.function, nil
}

// name reads a sub's name with its package, as Perl_cv_name does
// (internals.md §6): a named CV's HEK and its CvSTASH's name, or its GV's
// (the effective GV of an aliased glob) name and GvSTASH's name.
func (s *Symbolizer) name(cv cachedSub, stash uint64) (string, error) {
	if cv.gv == 0 {
		return "", fmt.Errorf("%w: CV without GV or name", errBadObject)
	}
	var hek uint64
	if cv.named {
		hek = cv.gv
	} else {
		gv := cv.gv
		body, flags, gp, err := s.svHeadAt(gv)
		if err != nil {
			return "", fmt.Errorf("GV: %w", err)
		}
		if flags&svTypeMask != svtPVGV {
			return "", fmt.Errorf("%w: flags %#x at %#x, not a GV", errBadObject, flags, gv)
		}
		if gp != 0 {
			if egv, err := s.word(gp + s.l.GPEgv); err == nil && egv != 0 && egv != gv {
				if b, f, _, err := s.svHeadAt(egv); err == nil && f&svTypeMask == svtPVGV {
					body = b
				}
			}
		}
		if hek, err = s.word(body + s.l.GVNameHEK); err != nil {
			return "", err
		}
		if stash, err = s.word(body + s.l.GVStash); err != nil {
			return "", err
		}
	}
	sub, err := s.hek(hek)
	if err != nil {
		return "", fmt.Errorf("sub name: %w", err)
	}
	pkg, err := s.stashName(stash)
	if err != nil {
		return "", fmt.Errorf("package of %s: %w", sub, err)
	}
	return pkg + "::" + sub, nil
}

// stashName reads a stash's name (HvNAME), "__ANON__" for none.
func (s *Symbolizer) stashName(hv uint64) (string, error) {
	if hv == 0 {
		return "__ANON__", nil
	}
	body, flags, array, err := s.svHeadAt(hv)
	if err != nil {
		return "", err
	}
	if flags&svTypeMask != svtPVHV {
		return "", fmt.Errorf("%w: flags %#x at %#x, not a hash", errBadObject, flags, hv)
	}
	if flags&svfOOK == 0 {
		return "__ANON__", nil
	}
	aux := body + s.l.HvAuxBody
	if s.l.HvAuxBody == 0 {
		// Before 5.36 the aux part follows the bucket array.
		max, err := s.word(body + s.l.HvMax)
		if err != nil {
			return "", err
		}
		if max >= 1<<32 || array == 0 {
			return "", fmt.Errorf("%w: hash of %d buckets at %#x", errBadObject, max+1, array)
		}
		aux = array + (max+1)*8
	}
	var b [32]byte
	if err := s.read(aux, b[:]); err != nil {
		return "", err
	}
	hek := binary.LittleEndian.Uint64(b[s.l.AuxName:])
	if count := int32(binary.LittleEndian.Uint32(b[s.l.AuxNameCount:])); count != 0 && hek != 0 {
		if hek, err = s.word(hek); err != nil {
			return "", err
		}
	}
	if hek == 0 {
		return "__ANON__", nil
	}
	return s.hek(hek)
}

// hek reads a shared hash key: its length, then its bytes.
func (s *Symbolizer) hek(addr uint64) (string, error) {
	var h [hekKey]byte
	if err := s.read(addr, h[:]); err != nil {
		return "", err
	}
	n := int32(binary.LittleEndian.Uint32(h[hekLen:]))
	if n < 0 || n > maxString {
		return "", fmt.Errorf("%w: key of %d bytes at %#x", errBadObject, n, addr)
	}
	b := make([]byte, n)
	if err := s.read(addr+hekKey, b); err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

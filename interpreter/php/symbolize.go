package php

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// Bounds on what is read from a process, which may be hostile or change
// under the reader, and on what is kept of it.
const (
	maxString = 4096 // bytes of a name or path
	// A Symbolizer's cache: functions, bytes, and oplines whose lines one
	// entry keeps (the hot ones of a function are few).
	cacheEntries = 4096
	cacheBytes   = 2 << 20
	cachedLines  = 64
	// entryOverhead approximates an entry's cost beyond its strings: the
	// entry, its LRU node and map slot; a cached line costs lineCost.
	entryOverhead = 200
	lineCost      = 24
)

// Flags in the low bits of a frame's addr, which oplines (8-byte aligned)
// leave free (PHP_FRAME_* in php.ebpf.c).
const (
	// FrameTop: the frame is flagged ZEND_CALL_TOP (the one a call of the
	// VM was entered for): file-level code so flagged is the script's
	// {main}, otherwise an included file's.
	FrameTop = 1
	// FrameCode: file-level code, whose file id is its file name (a
	// zend_string), not its zend_function: the request's copy of the
	// script's zend_op_array is freed when it ends.
	FrameCode = 2
	// FrameEval: the code is eval'd.
	FrameEval = 4
	// FrameJIT, in the top bit (above user-space addresses): the frame ran
	// OPcache's JIT code when sampled.
	FrameJIT   = 1 << 63
	frameFlags = FrameTop | FrameCode | FrameEval | FrameJIT
)

// errBadFunction says memory did not hold the zend_function expected there:
// freed (a request's functions are, at its end, without OPcache), or never
// one.
var errBadFunction = errors.New("not the PHP function expected")

// Frame is a PHP frame as symbolized.
type Frame struct {
	// Function is "Class::method", "function", "{main}" (the script's
	// file-level code), "{include}" (an included file's) or "{eval}".
	Function string
	File     string
	// Line is 0 where unknown: a C function, the innermost frame of JIT
	// code, an opline that does not point into its function.
	Line int
	// JIT: the frame ran OPcache's JIT code when sampled (its tier).
	JIT bool
}

// Symbolizer names a process's frames from its memory. It is safe for
// concurrent use.
//
// It caches what it read per zend_function, bounded by entries and bytes.
// Without OPcache a request's functions are freed at its end and the next
// request's may be allocated at the same addresses, so every hit is checked
// with the one read a miss starts with anyway, the function's head: an
// entry counts only if type, name, class, instructions and file are still
// the ones it was built from.
type Symbolizer struct {
	mem   *procmem.Reader
	l     *Layout
	cache *interpreter.SymbolCache[uint64, *cachedFunction]

	// linesMu guards the lines of the cached functions.
	linesMu sync.Mutex
}

// NewSymbolizer reads a process of version v through mem.
func NewSymbolizer(mem io.ReaderAt, v interpreter.Version) (*Symbolizer, error) {
	l, err := LayoutFor(v)
	if err != nil {
		return nil, err
	}
	return &Symbolizer{mem: procmem.New(mem), l: l, cache: newCache()}, nil
}

func newCache() *interpreter.SymbolCache[uint64, *cachedFunction] {
	return interpreter.NewSymbolCache[uint64](cacheEntries, cacheBytes, (*cachedFunction).cost)
}

// Stats returns the counts of the lookups so far.
func (s *Symbolizer) Stats() interpreter.CacheStats { return s.cache.Stats() }

// functionID is what identifies a zend_function between lookups.
type functionID struct {
	typ                            uint8
	name, scope, opcodes, filename uint64
	last                           uint32
}

// cachedFunction is what a function's frames are named from.
type cachedFunction struct {
	id       functionID
	function string
	file     string
	// code: the function's file-level code (no name).
	code  bool
	lines map[uint64]int
}

// cost counts the lines the entry may come to keep.
func (e *cachedFunction) cost() int {
	return len(e.function) + len(e.file) + entryOverhead + lineCost*cachedLines
}

// Frame names the frame of the zend_function fn at opline, as the unwinder
// reports them (addr: opline, FrameTop set for a ZEND_CALL_TOP frame).
func (s *Symbolizer) Frame(fn, addr uint64) (Frame, error) {
	f, err := s.frame(fn, addr)
	f.JIT = addr&FrameJIT != 0
	return f, err
}

func (s *Symbolizer) frame(fn, addr uint64) (Frame, error) {
	opline, top := addr&^frameFlags, addr&FrameTop != 0
	if addr&FrameCode != 0 {
		return s.codeFrame(fn, opline, top, addr&FrameEval != 0)
	}
	head := make([]byte, s.l.functionHead())
	if err := s.mem.Read(fn, head); err != nil {
		return Frame{}, err
	}
	id := s.functionID(head)
	e, err := s.cache.Get(fn, func(e *cachedFunction) bool { return e.id == id },
		func() (*cachedFunction, error) { return s.load(id) })
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Function: e.function, File: e.file}
	if e.code {
		f.Function = codeName(top, id.typ == evalCode)
	}
	if id.typ == internalFunction {
		return f, nil
	}
	line, err := s.line(e, opline)
	if err != nil {
		return Frame{}, err
	}
	f.Line = line
	return f, nil
}

// codeName names file-level code.
func codeName(top, eval bool) string {
	switch {
	case eval:
		return "{eval}"
	case top:
		return "{main}"
	}
	return "{include}"
}

// codeFrame names a frame of file-level code from its file name (a
// zend_string at file) and its opline, which the unwinder checked (0 when
// unknown): OPcache keeps both in shared memory for as long as the script
// is cached.
func (s *Symbolizer) codeFrame(file, opline uint64, top, eval bool) (Frame, error) {
	name, err := s.str(file)
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Function: codeName(top, eval), File: name}
	if opline != 0 {
		line, err := s.mem.U32(opline + opLineno)
		if err != nil {
			return Frame{}, err
		}
		f.Line = int(line)
	}
	return f, nil
}

// functionID takes a function's identity from its head.
func (s *Symbolizer) functionID(head []byte) functionID {
	le := binary.LittleEndian
	id := functionID{typ: head[functionType], name: le.Uint64(head[functionName:]), scope: le.Uint64(head[functionScope:])}
	if id.typ != internalFunction {
		id.opcodes = le.Uint64(head[s.l.OpArrayOpcodes:])
		id.filename = le.Uint64(head[s.l.OpArrayFilename:])
		id.last = le.Uint32(head[s.l.OpArrayLast:])
	}
	return id
}

// load reads what a function is named from.
func (s *Symbolizer) load(id functionID) (*cachedFunction, error) {
	if id.typ != internalFunction && id.typ != userFunction && id.typ != evalCode {
		return nil, fmt.Errorf("%w: type %d", errBadFunction, id.typ)
	}
	e := &cachedFunction{id: id}
	if id.name == 0 {
		if id.typ == internalFunction {
			// The bottom frame of a fiber (zend_fiber_function).
			e.function = "{fiber}"
		}
		e.code = id.typ != internalFunction
	} else {
		name, err := s.str(id.name)
		if err != nil {
			return nil, err
		}
		e.function = name
		if id.scope != 0 {
			classNameStr, err := s.mem.Ptr(id.scope + className)
			if err != nil {
				return nil, err
			}
			class, err := s.str(classNameStr)
			if err != nil {
				return nil, err
			}
			e.function = class + "::" + name
		}
	}
	if id.typ != internalFunction {
		file, err := s.str(id.filename)
		if err != nil {
			return nil, err
		}
		e.file = file
		e.lines = map[uint64]int{}
	}
	return e, nil
}

// line reads the line of the instruction at opline, cached per entry; 0
// when opline is not one of the function's instructions (the innermost
// frame's EX(opline) can be stale, or unset under the JIT).
func (s *Symbolizer) line(e *cachedFunction, opline uint64) (int, error) {
	if opline < e.id.opcodes || opline >= e.id.opcodes+uint64(e.id.last)*opSize || (opline-e.id.opcodes)%opSize != 0 {
		return 0, nil
	}
	s.linesMu.Lock()
	line, ok := e.lines[opline]
	s.linesMu.Unlock()
	if ok {
		return line, nil
	}
	n, err := s.mem.U32(opline + opLineno)
	if err != nil {
		return 0, err
	}
	line = int(n)
	s.linesMu.Lock()
	if len(e.lines) < cachedLines {
		e.lines[opline] = line
	}
	s.linesMu.Unlock()
	return line, nil
}

// str reads the zend_string at addr.
func (s *Symbolizer) str(addr uint64) (string, error) {
	if addr == 0 || addr&7 != 0 {
		return "", fmt.Errorf("%w: %#x is no string", errBadFunction, addr)
	}
	n, err := s.mem.U64(addr + stringLen)
	if err != nil {
		return "", err
	}
	if n > maxString {
		return "", fmt.Errorf("%w: string of %d bytes", errBadFunction, n)
	}
	b := make([]byte, n)
	if err := s.mem.Read(addr+stringVal, b); err != nil {
		return "", err
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), nil
}

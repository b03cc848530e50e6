package v8

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unicode/utf16"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Frame types (enum v8_frame_type in support/ebpf/v8.ebpf.c): the top two
// bits of a frame's addr.
const (
	frameBytecode  = 0
	frameCode      = 1
	frameStub      = 2
	frameTypeShift = 62
	frameTop       = 1 << 61
	pcMask         = 1<<48 - 1
)

// The tiers of JavaScript frames (libpf.Frame.Tier).
const (
	TierInterpreted = "interpreted"
	TierBaseline    = "baseline"
	TierMaglev      = "Maglev"
	TierTurbofan    = "TurboFan"
	TierBuiltin     = "builtin"
)

// AnonymousName names a function that has none.
const AnonymousName = "<anonymous>"

// Bounds of the per-process caches.
const (
	maxFunctions = 1 << 16
	maxScripts   = 1 << 12
	maxCodes     = 1 << 14
	// maxTableBytes bounds the decoded tables the caches hold in all
	// (line ends, position and inlining tables): 16 MiB.
	maxTableBytes = 16 << 20
	// maxInlined bounds the inlined frames of one optimized frame.
	maxInlined = 64
)

// symbolizer names the JavaScript frames of one node process.
type symbolizer struct {
	h *heap
	// bytecodeSizes are the binary's (binaryInfo.BytecodeSizes).
	bytecodeSizes *[3][]byte

	mu        sync.Mutex
	functions map[uint64]*function
	scripts   map[uint64]*script
	// codes are the JIT code objects found, by instruction start.
	codes      map[uint64]*code
	codeStarts []uint64
	// tableBytes is what scripts and codes hold of decoded tables.
	tableBytes int
}

// charge counts n bytes of decoded tables; past maxTableBytes, the
// caches that hold them start over.
func (s *symbolizer) charge(n int) {
	if s.tableBytes += n; s.tableBytes > maxTableBytes {
		clear(s.scripts)
		clear(s.codes)
		s.codeStarts = s.codeStarts[:0]
		// Functions point at scripts: they go too.
		clear(s.functions)
		s.tableBytes = n
	}
}

func newSymbolizer(r *procmem.Reader, l *Layout, sizes *[3][]byte) *symbolizer {
	return &symbolizer{
		h:             &heap{r: r, l: l, mapTypes: map[uint64]uint16{}},
		bytecodeSizes: sizes,
		functions:     map[uint64]*function{},
		scripts:       map[uint64]*script{},
		codes:         map[uint64]*code{},
	}
}

// function is what a SharedFunctionInfo names.
type function struct {
	// nameOrScopeInfo, script and data are the SFI's fields as they were
	// read: a cached function is used only while they are unchanged.
	nameOrScopeInfo, scriptPtr, data uint64
	name                             string
	script                           *script
	// builtin is set for a function V8 implements as a builtin (its data
	// is the builtin's id).
	builtin bool
	// bytecode is its BytecodeArray, 0 if it has none; positions its
	// decoded table, read on first use.
	bytecode  uint64
	positions []posEntry
	posRead   bool
}

// script is a Script: its name and line ends.
type script struct {
	name string
	// lineEnds are the offsets of the line terminators, the last one the
	// source's length (internals.md §4.6); nil when unknown.
	lineEnds []int64
	// lineOffset and columnOffset shift the script's first line.
	lineOffset, columnOffset int64
}

// symbolize appends the frames a BPF frame stands for.
func (p *process) symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	s := p.sym
	s.mu.Lock()
	defer s.mu.Unlock()
	top := f.Addr&frameTop != 0
	switch f.Addr >> frameTypeShift {
	case frameBytecode:
		fn, err := s.function(f.FileID)
		if err != nil {
			return out, err
		}
		pos := int64(-1)
		if err := s.bytecodeCheck(fn, f.Addr>>32&0xffffff); err != nil {
			return out, err
		}
		if rows := s.bytecodePositions(fn); rows != nil {
			if sp, ok := positionAt(rows, int64(uint32(f.Addr))); ok {
				pos = scriptOffset(sp)
			}
		}
		return append(out, s.frame(fn, pos, TierInterpreted, false)), nil
	case frameCode:
		pc := f.Addr & pcMask
		lookup := pc
		if !top && lookup > 0 {
			lookup-- // inside the call instruction
		}
		fn, err := s.function(f.FileID)
		if err != nil {
			return out, err
		}
		if name, ok := p.builtinAt(pc); ok {
			if fn.builtin {
				return append(out, s.frame(fn, -1, TierBuiltin, false)), nil
			}
			// The function called a builtin that has no frame of its own.
			out = append(out, builtinFrame(name))
			return append(out, s.frame(fn, -1, "", false)), nil
		}
		return s.codeFrames(fn, f.FileID, lookup, top, out)
	case frameStub:
		pc := f.Addr & pcMask
		if name, ok := p.builtinAt(pc); ok {
			return append(out, builtinFrame(name)), nil
		}
		return append(out, libpf.Frame{Kind: Kind, FunctionName: fmt.Sprintf("<V8 %s frame>", p.frameTypeName(f.FileID))}), nil
	}
	return out, fmt.Errorf("V8 frame of unknown type %#x", f.Addr)
}

// builtinAt names the builtin at a process address, in either copy.
func (p *process) builtinAt(pc uint64) (string, bool) {
	info := p.bin.info
	addr, found := uint64(0), false
	for _, lo := range append([]uint64{info.BlobAddr + p.bias}, p.blobCopies...) {
		if pc >= lo && pc < lo+uint64(info.BlobSize) {
			addr, found = pc-lo+info.BlobAddr, true
		}
	}
	if !found {
		return "", false
	}
	name, ok := info.builtinAt(addr)
	if !ok {
		name = "<V8 builtin>"
	}
	return name, true
}

func builtinFrame(name string) libpf.Frame {
	return libpf.Frame{Kind: Kind, FunctionName: name, Tier: TierBuiltin}
}

// frameTypeName names a StackFrame::Type.
func (p *process) frameTypeName(t uint64) string {
	l := p.bin.layout
	switch int64(t) {
	case l.FrameEntry:
		return "entry"
	case l.FrameConstructEntry:
		return "construct entry"
	case l.FrameExit:
		return "exit"
	case l.FrameBuiltinExit:
		return "builtin exit"
	}
	return fmt.Sprintf("type %d", t)
}

// frame is a function's frame at a script offset (-1 if unknown).
func (s *symbolizer) frame(fn *function, offset int64, tier string, inlined bool) libpf.Frame {
	f := libpf.Frame{Kind: Kind, FunctionName: fn.name, Tier: tier, Inlined: inlined}
	if fn.script != nil {
		f.SourceFile = fn.script.name
		if line, col, ok := fn.script.position(offset); ok {
			f.SourceLine, f.SourceColumn = uint32(line), uint32(col)
		}
	}
	return f
}

// position turns a script offset into a line and column, both from 1.
func (sc *script) position(offset int64) (line, col int64, ok bool) {
	if offset < 0 || len(sc.lineEnds) == 0 || offset > sc.lineEnds[len(sc.lineEnds)-1] {
		return 0, 0, false
	}
	i := sort.Search(len(sc.lineEnds), func(i int) bool { return sc.lineEnds[i] >= offset })
	col = offset
	if i > 0 {
		col = offset - sc.lineEnds[i-1] - 1
	} else {
		col += sc.columnOffset
	}
	return int64(i) + sc.lineOffset + 1, col + 1, true
}

// function reads (or finds cached) what a SharedFunctionInfo names. The
// SFI is read again each time: it may have moved, and another taken its
// place.
func (s *symbolizer) function(sfi uint64) (*function, error) {
	h, l := s.h, s.h.l
	// The fields read, in one read.
	hdr, err := h.header(sfi, max(l.SFINameOrScopeInfo, l.SFIScript, l.SFIFunctionData)+8)
	if err == nil {
		err = h.expectMap(sfi, le.Uint64(hdr), "SharedFunctionInfo", l.TypeSFI)
	}
	if err != nil {
		if fn, ok := s.functions[sfi]; ok && errors.Is(err, procmem.ErrUnreadable) {
			// The process exited after the sample: nothing can have
			// taken the function's place since.
			return fn, nil
		}
		return nil, err
	}
	nameOrScope := le.Uint64(hdr[l.SFINameOrScopeInfo:])
	scriptPtr := le.Uint64(hdr[l.SFIScript:])
	data := le.Uint64(hdr[l.SFIFunctionData:])
	if fn, ok := s.functions[sfi]; ok && fn.nameOrScopeInfo == nameOrScope && fn.scriptPtr == scriptPtr &&
		fn.data == data {
		return fn, nil
	}
	fn := &function{nameOrScopeInfo: nameOrScope, scriptPtr: scriptPtr, data: data}
	if fn.name, err = s.functionName(nameOrScope); err != nil {
		return nil, err
	}
	if fn.name == "" {
		fn.name = AnonymousName
	}
	fn.builtin = isSmi(data)
	if !fn.builtin {
		fn.bytecode = s.bytecodeOf(data)
		if fn.script, err = s.script(scriptPtr); err != nil {
			return nil, err
		}
	}
	if len(s.functions) >= maxFunctions {
		clear(s.functions)
	}
	s.functions[sfi] = fn
	return fn, nil
}

// functionName reads a function's name from its name_or_scope_info: a
// String, or a ScopeInfo that holds it in its function variable slot, or
// else its inferred name (internals.md §2.1).
func (s *symbolizer) functionName(v uint64) (string, error) {
	h, l := s.h, s.h.l
	if isSmi(v) {
		return "", nil // no name
	}
	t, err := h.typeOf(v)
	if err != nil {
		return "", err
	}
	if t < l.FirstNonstringType {
		return h.str(v, maxNameBytes)
	}
	if t != l.TypeScopeInfo {
		return "", nil
	}
	flagsWord, err := h.field(v, l.ScopeInfoFlags)
	if err != nil {
		return "", err
	}
	flags := uint32(flagsWord >> 32)
	if l.ScopeInfoRawFlags {
		flags = uint32(flagsWord)
	}
	localsWord, err := h.field(v, l.ScopeInfoContextLocals)
	if err != nil {
		return "", err
	}
	locals := smi(localsWord)
	if locals < 0 || locals > 1<<16 {
		return "", fmt.Errorf("%w: scope info with %d locals", ErrObject, locals)
	}
	// The variable part: context local names (one hash table from
	// maxInlinedLocalNames on), their infos, then the optional saved
	// class variable, function variable (name, slot) and inferred name
	// (scope-info.tq, flags bits 10, 12-13, 14).
	names := locals
	if locals >= maxInlinedLocalNames {
		names = 1
	}
	slot := l.ScopeInfoFirstVar + names + locals
	if flags&(1<<10) != 0 {
		slot++
	}
	if (flags>>12)&3 != 0 {
		name, err := h.field(v, 8+8*slot)
		if err != nil {
			return "", err
		}
		if n, err := s.nameString(name); err != nil || n != "" {
			return n, err
		}
	}
	if flags&(1<<14) != 0 {
		if (flags>>12)&3 != 0 {
			slot += 2
		}
		inferred, err := h.field(v, 8+8*slot)
		if err != nil {
			return "", err
		}
		return s.nameString(inferred)
	}
	return "", nil
}

// maxInlinedLocalNames is kScopeInfoMaxInlinedLocalNamesSize ([10.2]
// src/common/globals.h).
const maxInlinedLocalNames = 75

// nameString reads a name that may be a String or not there.
func (s *symbolizer) nameString(v uint64) (string, error) {
	if !isHeapObject(v) {
		return "", nil
	}
	t, err := s.h.typeOf(v)
	if err != nil || t >= s.h.l.FirstNonstringType {
		return "", err
	}
	return s.h.str(v, maxNameBytes)
}

// bytecodeOf finds the BytecodeArray in an SFI's function data: the array
// itself, an InterpreterData holding it, or baseline code holding either
// (internals.md §2.1). 0 when there is none.
func (s *symbolizer) bytecodeOf(data uint64) uint64 {
	h, l := s.h, s.h.l
	for range 3 {
		t, err := h.typeOf(data)
		if err != nil {
			return 0
		}
		switch t {
		case l.TypeBytecodeArray:
			return data
		case l.TypeInterpreterData:
			data, err = h.field(data, l.InterpreterDataBytecode)
		case l.TypeCode:
			data, err = h.field(data, l.CodeDeoptData)
		default:
			return 0
		}
		if err != nil {
			return 0
		}
	}
	return 0
}

// bytecodeCheck fails when a frame's BytecodeArray (bits 3-26 of its
// address) is not the function's: the SFI the frame named moved, and
// another function's took its place.
func (s *symbolizer) bytecodeCheck(fn *function, cookie uint64) error {
	if fn.bytecode == 0 || (fn.bytecode>>3)&0xffffff != cookie {
		return fmt.Errorf("%w: the frame's bytecode is not its function's", ErrObject)
	}
	return nil
}

// bytecodePositions decodes a function's bytecode position table, nil when
// V8 has not made one (it makes them lazily, internals.md §4.3).
func (s *symbolizer) bytecodePositions(fn *function) []posEntry {
	if fn.posRead {
		return fn.positions
	}
	h, l := s.h, s.h.l
	table, err := h.field(fn.bytecode, l.BytecodeArrayPositionTable)
	if err != nil || !isHeapObject(table) {
		return nil // not made yet: looked for again next time
	}
	b, err := h.byteArray(table)
	if err != nil {
		return nil
	}
	fn.positions, _ = decodePositions(b, l.PositionFormat)
	fn.posRead = fn.positions != nil
	s.charge(16 * len(fn.positions))
	return fn.positions
}

// script reads (or finds cached) a Script.
func (s *symbolizer) script(ptr uint64) (*script, error) {
	h, l := s.h, s.h.l
	if !isHeapObject(ptr) {
		return nil, nil
	}
	if t, err := h.typeOf(ptr); err != nil || t != l.TypeScript {
		return nil, err // a DebugInfo, or undefined: no script
	}
	if sc, ok := s.scripts[ptr]; ok {
		return sc, nil
	}
	sc := &script{}
	name, err := h.field(ptr, l.ScriptName)
	if err != nil {
		return nil, err
	}
	if sc.name, err = s.nameString(name); err != nil {
		return nil, err
	}
	if w, err := h.field(ptr, l.ScriptLineOffset); err == nil && isSmi(w) {
		sc.lineOffset = smi(w)
	}
	if w, err := h.field(ptr, l.ScriptColumnOffset); err == nil && isSmi(w) {
		sc.columnOffset = smi(w)
	}
	sc.lineEnds = s.lineEnds(ptr)
	if len(s.scripts) >= maxScripts {
		clear(s.scripts)
	}
	s.charge(8 * len(sc.lineEnds))
	s.scripts[ptr] = sc
	return sc, nil
}

// lineEnds reads a script's line ends, or computes them from its source
// where V8 has not (it does lazily).
func (s *symbolizer) lineEnds(ptr uint64) []int64 {
	h, l := s.h, s.h.l
	if ends, err := h.field(ptr, l.ScriptLineEnds); err == nil && isHeapObject(ends) {
		if words, err := h.fixedArray(ends, maxTable); err == nil && len(words) > 0 {
			out := make([]int64, len(words))
			for i, w := range words {
				out[i] = smi(w)
			}
			return out
		}
	}
	src, err := h.field(ptr, l.ScriptSource)
	if err != nil {
		return nil
	}
	text, err := h.str(src, maxStringBytes)
	if err != nil {
		return nil
	}
	return computeLineEnds(utf16.Encode([]rune(text)))
}

// computeLineEnds lists the offsets of line terminators in UTF-16 units
// (\n, \r not before \n, U+2028, U+2029), then the length, as V8 does.
func computeLineEnds(src []uint16) []int64 {
	var out []int64
	for i, c := range src {
		switch {
		case c == '\n', c == 0x2028, c == 0x2029,
			c == '\r' && (i+1 == len(src) || src[i+1] != '\n'):
			out = append(out, int64(i))
		}
	}
	return append(out, int64(len(src)))
}

// errNoCode says no code object holds a PC.
var errNoCode = errors.New("no V8 code at the address")

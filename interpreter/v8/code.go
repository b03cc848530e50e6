package v8

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
)

// JIT code is found from a PC: V8 aligns every instruction start to
// codeAlignment, with the InstructionStream's header (or, in V8 10, the
// Code object's) just below it, so the code holding a PC is the nearest
// such header below it whose back pointer and size agree (internals.md
// §2.2, §5.3). A code object never spans V8's 256 KiB heap pages unless it
// is a large object, which starts its own page.
const (
	heapPage = 256 << 10
	// scanChunk is read at a time going down from the PC.
	scanChunk = 16 << 10
	// maxCodeScan bounds how far below a PC its code may start.
	maxCodeScan = 1 << 20
)

// codeAlignment is V8's kCodeAlignment on an architecture (GOARCH): 64
// bytes on x86_64, for its 64-byte loop headers, 32 on arm64 (internals.md
// §2.2, §11).
func codeAlignment(arch string) uint64 {
	if arch == "amd64" {
		return 64
	}
	return 32
}

// code is one JIT code object, as the symbolizer knows it.
type code struct {
	// obj is the Code object, start and size its instructions, kind its
	// CodeKind.
	obj         uint64
	start, size uint64
	kind        uint32
	// sfi is the function optimized code was made from (from its
	// deoptimization data), 0 for other code.
	sfi uint64
	// positions is its source position table, inlinedAt the caller
	// positions of its inlined functions and inlined their SFIs.
	positions []posEntry
	inlinedAt []uint64
	inlined   []uint64
	// bytecode and offsets: baseline code's BytecodeArray and bytecode
	// offset table.
	bytecode uint64
	offsets  []byte
}

// codeHeader reads what identifies a Code object: its instructions and
// kind. An error says obj is not a Code object.
func (s *symbolizer) codeHeader(obj uint64) (start, size uint64, kind uint32, err error) {
	h, l := s.h, s.h.l
	n := max(l.CodeInstructionSize, l.CodeFlags) + 4
	if !l.InlineCode {
		n = max(n, l.CodeInstructionStart+8)
	}
	hdr, err := h.header(obj, n)
	if err != nil {
		return
	}
	if err = h.expectMap(obj, le.Uint64(hdr), "Code", l.TypeCode); err != nil {
		return
	}
	if l.InlineCode {
		start = obj - 1 + uint64(l.CodeInstructionStart)
	} else {
		start = le.Uint64(hdr[l.CodeInstructionStart:])
	}
	size = uint64(le.Uint32(hdr[l.CodeInstructionSize:]))
	kind = (le.Uint32(hdr[l.CodeFlags:]) >> l.CodeKindShift) & l.CodeKindMask
	return start, size, kind, nil
}

// codeAt finds the code object holding pc.
func (s *symbolizer) codeAt(pc uint64) (*code, error) {
	// A cached code object that still is where it was.
	i, found := slices.BinarySearch(s.codeStarts, pc)
	if !found {
		i--
	}
	if i >= 0 {
		c := s.codes[s.codeStarts[i]]
		if pc < c.start+c.size {
			start, size, kind, err := s.codeHeader(c.obj)
			if (err == nil && start == c.start && size == c.size && kind == c.kind) ||
				errors.Is(err, procmem.ErrUnreadable) { // the process exited after the sample
				return c, nil
			}
			s.dropCode(c.start)
		}
	}
	obj, err := s.findCode(pc)
	if err != nil {
		return nil, err
	}
	c, err := s.readCode(obj)
	if err != nil {
		return nil, err
	}
	if pc < c.start || pc >= c.start+c.size {
		return nil, fmt.Errorf("%w: %#x (code at %#x is %d bytes)", errNoCode, pc, c.start, c.size)
	}
	s.charge(16*(len(c.positions)+len(c.inlined)) + len(c.offsets))
	if len(s.codes) >= maxCodes {
		clear(s.codes)
		s.codeStarts = s.codeStarts[:0]
	}
	s.codes[c.start] = c
	i, _ = slices.BinarySearch(s.codeStarts, c.start)
	s.codeStarts = slices.Insert(s.codeStarts, i, c.start)
	return c, nil
}

func (s *symbolizer) dropCode(start uint64) {
	delete(s.codes, start)
	if i, ok := slices.BinarySearch(s.codeStarts, start); ok {
		s.codeStarts = slices.Delete(s.codeStarts, i, i+1)
	}
}

// findCode scans down from pc for the header of its code object and
// returns the Code object.
func (s *symbolizer) findCode(pc uint64) (uint64, error) {
	h, l := s.h, s.h.l
	header := uint64(l.IStreamHeader)
	if l.InlineCode {
		header = uint64(l.CodeInstructionStart)
	}
	floor := uint64(0)
	if pc > maxCodeScan {
		floor = pc - maxCodeScan
	}
	align := codeAlignment(runtime.GOARCH)
	hi := pc &^ (align - 1) // the highest instruction start
	for hi >= floor+header {
		lo := max(hi-min(hi, scanChunk), floor)
		buf, err := h.r.ReadUpTo(lo, hi-lo+8)
		if err != nil || uint64(len(buf)) < hi-lo+8 {
			return 0, fmt.Errorf("%w: %#x: %v", errNoCode, pc, err)
		}
		for start := hi; start >= lo+header; start -= align {
			obj := start - header
			mapWord := le.Uint64(buf[obj-lo:])
			if !isHeapObject(mapWord) {
				continue
			}
			if t, ok := h.mapTypes[mapWord]; ok && t != l.TypeIStream && t != l.TypeCode {
				continue
			}
			code := obj + 1
			if !l.InlineCode {
				if t, err := h.typeOf(obj + 1); err != nil || t != l.TypeIStream {
					continue
				}
				if code, err = h.field(obj+1, l.IStreamCode); err != nil {
					continue
				}
			}
			if cs, _, _, err := s.codeHeader(code); err == nil && cs == start {
				return code, nil
			}
		}
		if lo == floor || lo < scanChunk {
			break
		}
		hi = lo
	}
	return 0, fmt.Errorf("%w: %#x", errNoCode, pc)
}

// readCode reads a code object's header and tables.
func (s *symbolizer) readCode(obj uint64) (*code, error) {
	h, l := s.h, s.h.l
	start, size, kind, err := s.codeHeader(obj)
	if err != nil {
		return nil, err
	}
	c := &code{obj: obj, start: start, size: size, kind: kind}
	switch kind {
	case l.KindBaseline:
		if c.bytecode, err = h.field(obj, l.CodeDeoptData); err != nil {
			return nil, err
		}
		c.bytecode = s.bytecodeOf(c.bytecode)
		table, err := h.field(obj, l.CodePositionTable)
		if err != nil {
			return nil, err
		}
		if c.offsets, err = h.byteArray(table); err != nil {
			return nil, err
		}
	case l.MaglevKind(), l.TurbofanKind():
		if err := s.readOptimized(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// readOptimized reads optimized code's function, position table and
// inlining table (internals.md §2.3, §4.4).
func (s *symbolizer) readOptimized(c *code) error {
	h, l := s.h, s.h.l
	deopt, err := h.field(c.obj, l.CodeDeoptData)
	if err != nil {
		return err
	}
	if c.sfi, err = h.element(deopt, l.DeoptSFI); err != nil {
		return err
	}
	if l.DeoptSFIWrapped {
		if c.sfi, err = h.field(c.sfi, l.SFIWrapperSFI); err != nil {
			return err
		}
	}
	if table, err := h.field(c.obj, l.CodePositionTable); err == nil && isHeapObject(table) {
		if b, err := h.byteArray(table); err == nil {
			c.positions, _ = decodePositions(b, l.PositionFormat)
		}
	}
	literals, err := h.element(deopt, l.DeoptLiterals)
	if err != nil {
		return err
	}
	inl, err := h.element(deopt, l.DeoptInliningPositions)
	if err != nil {
		return err
	}
	if !isHeapObject(inl) || !isHeapObject(literals) {
		return nil // nothing inlined
	}
	b, err := h.byteArray(inl)
	if err != nil {
		return err
	}
	// InliningPosition records: the caller's SourcePosition, then the
	// inlined function's index in the literal array (an int32), padded
	// to 16 bytes.
	n := min(len(b)/16, maxInlined*16)
	for i := range n {
		rec := b[16*i:]
		c.inlinedAt = append(c.inlinedAt, le.Uint64(rec))
		id := int32(le.Uint32(rec[8:]))
		sfi := uint64(0)
		if id >= 0 {
			if sfi, err = h.element(literals, int64(id)); err != nil {
				return err
			}
			sfi &^= 2 // a weak reference
		}
		c.inlined = append(c.inlined, sfi)
	}
	return nil
}

// codeFrames appends the frames of a JavaScript frame running JIT code at
// pc (a return address already moved into its call): the functions
// optimized code inlined at pc, innermost first, then the function.
func (s *symbolizer) codeFrames(fn *function, sfi, pc uint64, top bool, out []libpf.Frame) ([]libpf.Frame, error) {
	l := s.h.l
	c, err := s.codeAt(pc)
	if err != nil {
		// The code was freed (or never found): the function without a
		// line.
		return append(out, s.frame(fn, -1, "", false)), nil
	}
	off := int64(pc - c.start)
	switch c.kind {
	case l.KindBaseline:
		if fn.bytecode != c.bytecode {
			return append(out, s.frame(fn, -1, TierBaseline, false)), nil
		}
		pos := int64(-1)
		if bc, ok := s.baselineBytecodeOffset(c, s.bytecodeSizes, off); ok {
			if rows := s.bytecodePositions(fn); rows != nil {
				if sp, ok := positionAt(rows, bc); ok {
					pos = scriptOffset(sp)
				}
			}
		}
		return append(out, s.frame(fn, pos, TierBaseline, false)), nil
	case l.MaglevKind(), l.TurbofanKind():
		tier := TierTurbofan
		if c.kind == l.MaglevKind() {
			tier = TierMaglev
		}
		if c.sfi != sfi {
			if !top || !s.frameless(c, pc) {
				// Code freed since the sample, its place taken by
				// another function's: the frame's function, no line.
				return append(out, s.frame(fn, -1, tier, false)), nil
			}
			// The interrupted PC is in a function's prologue or epilogue,
			// whose frame is not set up: it runs on its caller's frame.
			callee, err := s.function(c.sfi)
			if err != nil {
				return append(out, s.frame(fn, -1, "", false)), nil
			}
			out, _ = s.inlinedFrames(c, callee, off, tier, out)
			return append(out, s.frame(fn, -1, "", false)), nil
		}
		return s.inlinedFrames(c, fn, off, tier, out)
	}
	return append(out, s.frame(fn, -1, "", false)), nil
}

// prologueBytes bounds an optimized function's code before its frame is
// set up (a deoptimization check, then push rbp; mov rbp, rsp on x86_64,
// stp x29, x30, [sp, #-16]!; mov x29, sp on arm64).
const prologueBytes = 32

// frameless says whether pc in optimized code c runs before c's frame is
// set up or after it was torn down: in its first instructions, or at its
// return.
func (s *symbolizer) frameless(c *code, pc uint64) bool {
	if pc-c.start < prologueBytes {
		return true
	}
	return atReturn(runtime.GOARCH, s.h.r, pc)
}

// atReturn says whether the instruction at pc returns: ret or ret imm16
// on x86_64; ret, retaa or retab on arm64 (Arm ARM C6.2).
func atReturn(arch string, r interface {
	U8(uint64) (uint8, error)
	U32(uint64) (uint32, error)
}, pc uint64) bool {
	switch arch {
	case "amd64":
		op, err := r.U8(pc)
		return err == nil && (op == 0xc3 || op == 0xc2)
	case "arm64":
		insn, err := r.U32(pc)
		return err == nil && (insn == 0xd65f03c0 || insn == 0xd65f0bff || insn == 0xd65f0fff)
	}
	return false
}

// inlinedFrames appends the frames optimized code c of function fn runs at
// code offset off: the inlined functions innermost first, then fn.
func (s *symbolizer) inlinedFrames(c *code, fn *function, off int64, tier string, out []libpf.Frame) ([]libpf.Frame, error) {
	p, ok := positionAt(c.positions, off)
	if !ok {
		return append(out, s.frame(fn, -1, tier, false)), nil
	}
	for range maxInlined {
		id := inliningID(p)
		if id < 0 || id >= int64(len(c.inlined)) {
			break
		}
		inner := fn // an id of -1 names the outer function
		if c.inlined[id] != 0 {
			var err error
			if inner, err = s.function(c.inlined[id]); err != nil {
				inner = &function{name: AnonymousName}
			}
		}
		out = append(out, s.frame(inner, scriptOffset(p), tier, true))
		p = c.inlinedAt[id]
	}
	return append(out, s.frame(fn, scriptOffset(p), tier, false)), nil
}

// The operand scale prefixes: Wide, ExtraWide and their DebugBreak forms
// are the first four bytecodes (bytecodes.h, V8 10.2-13.6).
const (
	bytecodeWide               = 0
	bytecodeExtraWide          = 1
	bytecodeDebugBreakWide     = 2
	bytecodeDebugBreakExtraWid = 3
)

// maxBytecodes bounds the bytecodes walked in one function.
const maxBytecodes = 1 << 20

// baselineBytecodeOffset maps a PC offset in baseline code to the bytecode
// it runs: the code's offset table lists, as unsigned VLQs, the machine
// code length of the prologue (bytecode offset -1) and then of each
// bytecode in order (internals.md §3.3).
func (s *symbolizer) baselineBytecodeOffset(c *code, sizes *[3][]byte, off int64) (int64, bool) {
	bytecodes, err := s.bytecodes(c.bytecode)
	if err != nil {
		return 0, false
	}
	pcEnd, bc := int64(0), int64(-1)
	next := int64(0) // the next bytecode's offset
	for i, n := 0, 0; i < len(c.offsets) && n < maxBytecodes; n++ {
		d, k := readUVLQ(c.offsets[i:])
		if k == 0 {
			return 0, false
		}
		i += k
		pcEnd += int64(d)
		if off < pcEnd {
			return bc, true
		}
		// On to the next bytecode.
		if next >= int64(len(bytecodes)) {
			return 0, false
		}
		bc = next
		op, scale := bytecodes[next], 0
		prefix := int64(0)
		switch op {
		case bytecodeWide, bytecodeDebugBreakWide:
			scale, prefix = 1, 1
		case bytecodeExtraWide, bytecodeDebugBreakExtraWid:
			scale, prefix = 2, 1
		}
		if prefix == 1 {
			if next+1 >= int64(len(bytecodes)) {
				return 0, false
			}
			op = bytecodes[next+1]
		}
		if int(op) >= len(sizes[scale]) || sizes[scale][op] == 0 {
			return 0, false
		}
		next += prefix + int64(sizes[scale][op])
	}
	return 0, false
}

// bytecodes reads a BytecodeArray's bytecodes.
func (s *symbolizer) bytecodes(array uint64) ([]byte, error) {
	h, l := s.h, s.h.l
	if _, err := h.expect(array, "BytecodeArray", l.TypeBytecodeArray); err != nil {
		return nil, err
	}
	n, err := h.field(array, l.FixedArrayLength)
	if err != nil {
		return nil, err
	}
	if !isSmi(n) || smi(n) < 0 || smi(n) > maxTable {
		return nil, fmt.Errorf("%w: bytecode array of length %#x", ErrObject, n)
	}
	buf := make([]byte, smi(n))
	return buf, h.r.Read(array-1+uint64(l.BytecodeArrayData), buf)
}

package nativeunwind

import (
	"debug/elf"
	"errors"
	"fmt"
)

// Go's inlining tree: a function into which the compiler inlined calls
// carries, as its function data FUNCDATA_InlTree, an array of inlined
// calls, and as its pc-value table PCDATA_InlTreeIndex the index of the
// innermost inlined call at each pc (-1 outside inlined code). Each call
// names the inlined function and a pc of the caller whose source position
// is the call site (parentPc), from which the next level is found the same
// way (runtime/symtabinl.go, inlineUnwinder).
const (
	pcdataInlTreeIndex = 2
	funcdataInlTree    = 3
)

// maxInlineDepth bounds the inlined calls followed at one pc, so that a
// damaged tree whose parents form a cycle ends.
const maxInlineDepth = 64

// maxInlineIndex bounds an inline tree index read from a table.
const maxInlineIndex = 1 << 20

// Word index of moduledata.gofunc, the base of Go 1.18+ function data
// offsets (runtime/symtab.go, moduledata): 38 in Go 1.18 and 1.19, 40
// from Go 1.20, which added covctrs and ecovctrs before it.
const (
	mdGofunc118 = 38
	mdGofunc120 = 40
)

// GoLines resolves a Go executable's code addresses to source positions
// with the calls the compiler inlined expanded into frames of their own.
// It reads the inline trees from the file as it goes: the file must stay
// open while GoLines is used.
type GoLines struct {
	syms *GoSymbols
	// read reads the file's loaded bytes by virtual address.
	read codeReader
	// gofunc is what Go 1.18+ function data offsets are from; zero when
	// it could not be found, and then inlined calls are not expanded.
	gofunc uint64
}

// ReadGoLines reads f's pclntab and finds where its function data lie.
// The error wraps ErrNoGoPclntab when f is not a Go executable. mapped,
// if not nil, is the whole file in memory (mapped): the table and the
// inline trees are then used in place, and must stay mapped while GoLines
// is used.
func ReadGoLines(f *elf.File, mapped []byte) (*GoLines, error) {
	img := elfImage{f: f, mapped: mapped}
	t, err := img.openPclntab()
	if err != nil {
		return nil, err
	}
	syms := &GoSymbols{t: t}
	g := &GoLines{syms: syms, read: img.read}
	if syms.t.version >= pcln118 {
		g.gofunc = findGofunc(img, syms.t)
	}
	return g, nil
}

// findGofunc returns the address of go:func.* from the symbol table, else
// from moduledata; zero when neither has it.
func findGofunc(img elfImage, t *pclntab) uint64 {
	for _, name := range []string{"go:func.*", "go.func.*"} {
		if v, ok := img.symbol(name); ok {
			return v
		}
	}
	idx := mdGofunc118
	if t.version >= pcln120 {
		idx = mdGofunc120
	}
	if v, ok := img.moduledataWord(t, idx); ok && img.segment(v, 1) != nil {
		return v
	}
	return 0
}

// Symbols returns the function table.
func (g *GoLines) Symbols() *GoSymbols { return g.syms }

// ExpandsInlined says whether Lookup can expand inlined calls: the table
// is of Go 1.16 or later and its function data were found.
func (g *GoLines) ExpandsInlined() bool {
	switch g.syms.t.version {
	case pcln12:
		return false
	case pcln116:
		return true
	}
	return g.gofunc != 0
}

// Lookup returns the frames at pc, innermost first: the inlined calls
// (Inlined set), then the function whose machine code holds pc. It
// returns ErrNotGoCode for addresses no function covers. A damaged inline
// tree costs the inlined frames, never the function's: the function comes
// back last with the error.
func (g *GoLines) Lookup(pc uint64) ([]GoFrame, error) {
	outer, err := g.syms.Lookup(pc)
	if err != nil {
		if errors.Is(err, ErrNotGoCode) || outer.Func.Name == "" {
			return nil, err
		}
		return []GoFrame{outer}, err
	}
	if !g.ExpandsInlined() {
		return []GoFrame{outer}, nil
	}
	t := g.syms.t
	i, _ := t.findFunc(pc)
	f, err := t.fn(i)
	if err != nil {
		return []GoFrame{outer}, fmt.Errorf("pclntab: %w", err)
	}
	return g.inlined(f, pc, outer)
}

// inlined returns the frames at pc of function f, innermost first: the
// inlined calls, then outer at the outermost call site. On an error it
// returns what it found and outer as it came.
func (g *GoLines) inlined(f goFunc, pc uint64, outer GoFrame) ([]GoFrame, error) {
	t := g.syms.t
	tabOff, ok, err := t.pcdata(f, pcdataInlTreeIndex)
	if err != nil || !ok {
		return []GoFrame{outer}, err
	}
	tree, ok, err := g.funcdata(f, funcdataInlTree)
	if err != nil || !ok {
		return []GoFrame{outer}, err
	}
	var frames []GoFrame
	pos := outer // the position of pc, innermost
	for range maxInlineDepth {
		idx, ok, err := t.pcValue(f, tabOff, pc)
		if err != nil {
			return append(frames, outer), fmt.Errorf("pclntab: inline index of %#x in %s: %w", pc, outer.Func.Name, err)
		}
		if !ok || idx < 0 {
			break
		}
		call, err := g.inlinedCall(tree, idx)
		if err != nil {
			return append(frames, outer), fmt.Errorf("pclntab: inlined call %d in %s: %w", idx, outer.Func.Name, err)
		}
		name, err := t.cstring(t.funcnames, uint64(call.nameOff), "inlined function name")
		if err != nil {
			return append(frames, outer), err
		}
		frames = append(frames, GoFrame{Func: GoFunc{Name: name}, File: pos.File, Line: pos.Line, Inlined: true})
		pc = f.entry + uint64(call.parentPC)
		if call.parentPC < 0 || pc >= f.end {
			return append(frames, outer), fmt.Errorf("pclntab: inlined call %d in %s: parent pc offset %#x outside the function", idx, outer.Func.Name, call.parentPC)
		}
		if pos, err = g.syms.Lookup(pc); err != nil {
			return append(frames, outer), err
		}
	}
	// The function itself is at the outermost call site.
	outer.File, outer.Line = pos.File, pos.Line
	return append(frames, outer), nil
}

// inlinedCall is the part of runtime.inlinedCall we use.
type inlinedCall struct {
	nameOff  uint32
	parentPC int32
}

// inlinedCall reads entry idx of the tree at address tree. Go 1.20 made
// the entries 16 bytes (funcID, padding, nameOff, parentPc, startLine);
// before they were 20 (parent, funcID, padding, file, line, nameOff,
// parentPc).
func (g *GoLines) inlinedCall(tree uint64, idx int32) (inlinedCall, error) {
	t := g.syms.t
	size, nameAt, parentAt := uint64(20), 12, 16
	if t.version >= pcln120 {
		size, nameAt, parentAt = 16, 4, 8
	}
	if idx >= maxInlineIndex {
		return inlinedCall{}, fmt.Errorf("index %d beyond the limit of %d", idx, maxInlineIndex)
	}
	b, err := g.read(tree+uint64(idx)*size, size)
	if err != nil {
		return inlinedCall{}, err
	}
	return inlinedCall{
		nameOff:  t.order.Uint32(b[nameAt:]),
		parentPC: int32(t.order.Uint32(b[parentAt:])),
	}, nil
}

// pcdata returns the offset of function f's pc-value table i, or false if
// it has none.
func (t *pclntab) pcdata(f goFunc, i uint32) (uint32, bool, error) {
	if i >= f.npcdata {
		return 0, false, nil
	}
	at := uint64(f.recOff) + uint64(t.funcRecordLen()) + 4*uint64(i)
	if at+4 > uint64(len(t.data)) {
		return 0, false, fmt.Errorf("pclntab: pcdata %d of function at %#x runs past the end", i, f.entry)
	}
	off := t.order.Uint32(t.data[at:])
	return off, off != 0, nil
}

// funcdata returns the address of function f's data i, or false if it has
// none. Go 1.18+ stores offsets from gofunc after the pc-value table
// offsets; Go 1.16 and 1.17 pointers, aligned to the pointer size.
func (g *GoLines) funcdata(f goFunc, i uint8) (uint64, bool, error) {
	t := g.syms.t
	if i >= f.nfuncdata {
		return 0, false, nil
	}
	at := uint64(f.recOff) + uint64(t.funcRecordLen()) + 4*uint64(f.npcdata)
	size := uint64(4)
	if t.version == pcln116 {
		size = uint64(t.ptrSize)
		if rem := (t.addr + at) % size; rem != 0 {
			at += size - rem
		}
	}
	at += uint64(i) * size
	if at+size > uint64(len(t.data)) {
		return 0, false, fmt.Errorf("pclntab: funcdata %d of function at %#x runs past the end", i, f.entry)
	}
	if t.version == pcln116 {
		v := t.word(int(at))
		return v, v != 0, nil
	}
	off := t.order.Uint32(t.data[at:])
	if off == ^uint32(0) {
		return 0, false, nil
	}
	return g.gofunc + uint64(off), true, nil
}

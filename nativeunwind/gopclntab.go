package nativeunwind

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// This file parses the Go runtime's function table (the pclntab), which the
// Go linker writes into every Go executable, stripped or not, because the
// runtime itself needs it for tracebacks and garbage collection.
//
// The layout facts come from the Go sources that define, write and read
// the table (they are cited, not copied): runtime/symtab.go (pcHeader,
// moduledata, functab, step), runtime/runtime2.go (_func),
// cmd/link/internal/ld/pcln.go (the writer) and debug/gosym/pclntab.go
// (the reader, which also documents the Go 1.2 and 1.16 layouts).

// pclnVersion is a layout of the table, named after the first Go release
// that wrote it.
type pclnVersion uint8

const (
	pcln12  pclnVersion = iota + 1 // Go 1.2–1.15
	pcln116                        // Go 1.16–1.17
	pcln118                        // Go 1.18–1.19
	pcln120                        // Go 1.20 and later
)

func (v pclnVersion) String() string {
	switch v {
	case pcln12:
		return "go1.2"
	case pcln116:
		return "go1.16"
	case pcln118:
		return "go1.18"
	case pcln120:
		return "go1.20"
	default:
		return fmt.Sprintf("pclnVersion(%d)", uint8(v))
	}
}

// The header magics (runtime/symtab.go, abi.PCLnTabMagic).
const (
	magic12  = 0xfffffffb
	magic116 = 0xfffffffa
	magic118 = 0xfffffff0
	magic120 = 0xfffffff1
)

func versionOfMagic(m uint32) pclnVersion {
	switch m {
	case magic12:
		return pcln12
	case magic116:
		return pcln116
	case magic118:
		return pcln118
	case magic120:
		return pcln120
	}
	return 0
}

// Limits that keep hostile input from costing unbounded time or memory.
// The largest Go binaries known have a few hundred thousand functions.
const (
	maxGoFuncs   = 1 << 22
	maxGoString  = 1 << 20 // a function or file name
	maxVarintLen = 5       // a uint32
)

// pclntab is a parsed table header with the sub-tables it points to. All
// offsets into it are checked when used; the header is checked when
// parsed.
type pclntab struct {
	data    []byte
	addr    uint64 // virtual address of data[0]
	order   binary.ByteOrder
	version pclnVersion
	quantum uint32 // instruction size unit of pc deltas: 1 on x86, 4 on arm64
	ptrSize int
	nfunc   int
	// textStart is what 1.18+ function entries are offsets from. The
	// header field holding it became unused (and zero) in Go 1.2x: then
	// the caller must set it from moduledata.text or runtime.text.
	textStart uint64

	funcnames []byte // function names; 1.2: the whole table
	cutab     []byte // compilation unit → file table offsets (1.16+)
	filetab   []byte // file names (1.16+) or the 1.2 file index table
	pctab     []byte // pc-value tables; 1.2: the whole table
	functab   []byte // (entry, _func offset) pairs, then the end pc
	funcs     []byte // what _func offsets are relative to
	nfiles    int    // 1.2: entries in filetab, counting the count itself
}

// pclnHeaderLen is the length of the fixed header of each version.
func pclnHeaderLen(v pclnVersion, ptrSize int) int {
	switch v {
	case pcln12:
		return 8 + ptrSize
	case pcln116:
		return 8 + 7*ptrSize
	default:
		return 8 + 8*ptrSize
	}
}

// parsePclntab parses the table at the start of data, which is mapped at
// addr. It checks the header and that the function table fits; functions
// themselves are checked as they are read.
func parsePclntab(data []byte, addr uint64, order binary.ByteOrder) (*pclntab, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("pclntab: %d bytes, too short for a header", len(data))
	}
	t := &pclntab{data: data, addr: addr, order: order}
	if t.version = versionOfMagic(order.Uint32(data)); t.version == 0 {
		return nil, fmt.Errorf("pclntab: unknown magic %#x at offset 0", order.Uint32(data))
	}
	if data[4] != 0 || data[5] != 0 {
		return nil, fmt.Errorf("pclntab: nonzero padding at offset 4")
	}
	switch q := data[6]; q {
	case 1, 2, 4:
		t.quantum = uint32(q)
	default:
		return nil, fmt.Errorf("pclntab: bad instruction quantum %d at offset 6", q)
	}
	switch ps := data[7]; ps {
	case 4, 8:
		t.ptrSize = int(ps)
	default:
		return nil, fmt.Errorf("pclntab: bad pointer size %d at offset 7", ps)
	}
	if hl := pclnHeaderLen(t.version, t.ptrSize); len(data) < hl {
		return nil, fmt.Errorf("pclntab: %d bytes, too short for the %s header of %d", len(data), t.version, hl)
	}
	nfunc := t.word(8)
	if nfunc > maxGoFuncs {
		return nil, fmt.Errorf("pclntab: %d functions at offset 8, more than the limit of %d", nfunc, maxGoFuncs)
	}
	t.nfunc = int(nfunc)
	var err error
	if t.version == pcln12 {
		err = t.parse12()
	} else {
		err = t.parse116()
	}
	if err != nil {
		return nil, fmt.Errorf("pclntab: %w", err)
	}
	return t, nil
}

// parse12 sets the sub-tables of the Go 1.2 layout: after the header the
// function table of word pairs and the end pc, then a uint32 offset of
// the file table; all offsets are from the table start.
func (t *pclntab) parse12() error {
	ps := t.ptrSize
	start := 8 + ps
	size := (2*t.nfunc + 1) * ps
	if start+size+4 > len(t.data) {
		return fmt.Errorf("function table of %d functions at offset %#x runs past the end (%#x)", t.nfunc, start, len(t.data))
	}
	t.functab = t.data[start : start+size]
	t.funcs, t.funcnames, t.pctab = t.data, t.data, t.data
	fileOff := int(t.order.Uint32(t.data[start+size:]))
	if fileOff+4 > len(t.data) || fileOff < 0 {
		return fmt.Errorf("file table offset %#x at offset %#x out of bounds", fileOff, start+size)
	}
	t.filetab = t.data[fileOff:]
	n := t.order.Uint32(t.filetab)
	if uint64(n)*4 > uint64(len(t.filetab)) {
		return fmt.Errorf("file table at offset %#x: %d entries run past the end", fileOff, n)
	}
	t.nfiles = int(n)
	return nil
}

// parse116 sets the sub-tables of the Go 1.16+ layouts, whose header
// words give each sub-table's offset from the table start. Go 1.18
// inserted textStart after nfiles.
func (t *pclntab) parse116() error {
	ps := t.ptrSize
	field := 2 // index of the first offset word, after nfunc and nfiles
	if t.version >= pcln118 {
		t.textStart = t.word(8 + 2*ps)
		field = 3
	}
	sub := func(i int) ([]byte, error) {
		at := 8 + (field+i)*ps
		off := t.word(at)
		if off >= uint64(len(t.data)) {
			return nil, fmt.Errorf("sub-table offset %#x at offset %#x out of bounds (%#x)", off, at, len(t.data))
		}
		return t.data[off:], nil
	}
	var err error
	tabs := []*[]byte{&t.funcnames, &t.cutab, &t.filetab, &t.pctab, &t.functab}
	for i, p := range tabs {
		if *p, err = sub(i); err != nil {
			return err
		}
	}
	t.funcs = t.functab
	size := (2*t.nfunc + 1) * t.entrySize()
	if size > len(t.functab) {
		return fmt.Errorf("function table of %d functions at offset %#x runs past the end (%#x)", t.nfunc, len(t.data)-len(t.functab), len(t.data))
	}
	t.functab = t.functab[:size]
	return nil
}

// word reads a pointer-sized value at off, which the caller has checked.
func (t *pclntab) word(off int) uint64 {
	if t.ptrSize == 4 {
		return uint64(t.order.Uint32(t.data[off:]))
	}
	return t.order.Uint64(t.data[off:])
}

// entrySize is the size of one function table field: a word before 1.18,
// then uint32 offsets.
func (t *pclntab) entrySize() int {
	if t.version >= pcln118 {
		return 4
	}
	return t.ptrSize
}

func (t *pclntab) functabField(i int) uint64 {
	off := i * t.entrySize()
	if t.version >= pcln118 {
		return uint64(t.order.Uint32(t.functab[off:]))
	}
	if t.ptrSize == 4 {
		return uint64(t.order.Uint32(t.functab[off:]))
	}
	return t.order.Uint64(t.functab[off:])
}

// entry returns the entry pc of function i; entry(nfunc) is the end of
// the last function.
func (t *pclntab) entry(i int) uint64 {
	v := t.functabField(2 * i)
	if t.version >= pcln118 {
		return t.textStart + v
	}
	return v
}

// goFunc is one function's record (runtime._func), the fields we use.
type goFunc struct {
	entry, end uint64
	recOff     int // offset of the record in the table, for errors
	nameOff    uint32
	pcsp       uint32
	pcfile     uint32
	pcln       uint32
	cuOff      uint32
	flag       uint8 // abi.FuncFlag, Go 1.17+
	// npcdata and nfuncdata count the pc-value tables and function data
	// offsets that follow the record (Go 1.16+; zero for 1.2).
	npcdata   uint32
	nfuncdata uint8
}

// The bits of _func.flag (internal/abi/symtab.go, FuncFlag).
const (
	funcFlagTopFrame = 1 << 0 // outermost frame of a stack
	funcFlagSPWrite  = 1 << 1 // writes SP other than by constant adjustments
	funcFlagAsm      = 1 << 2 // written in assembly (Go 1.21+)
)

// funcRecordLen is the size of the fixed part of _func for each layout.
func (t *pclntab) funcRecordLen() int {
	switch t.version {
	case pcln12:
		return t.ptrSize + 32
	case pcln116:
		return t.ptrSize + 36
	case pcln118:
		return 40
	default:
		return 44
	}
}

// fn reads function i's record. The record's own entry must match the
// function table's, which catches most misplaced offsets.
func (t *pclntab) fn(i int) (goFunc, error) {
	if i < 0 || i >= t.nfunc {
		return goFunc{}, fmt.Errorf("function index %d out of range [0,%d)", i, t.nfunc)
	}
	f := goFunc{entry: t.entry(i), end: t.entry(i + 1)}
	off := t.functabField(2*i + 1)
	base := len(t.data) - len(t.funcs)
	f.recOff = base + int(min(off, uint64(len(t.data))))
	if off > uint64(len(t.funcs)) || uint64(len(t.funcs))-off < uint64(t.funcRecordLen()) {
		return f, fmt.Errorf("function %d: record offset %#x (table offset %#x) runs past the end", i, off, f.recOff)
	}
	rec := t.funcs[off:]
	u32 := func(at int) uint32 { return t.order.Uint32(rec[at:]) }
	var recEntry uint64
	switch t.version {
	case pcln12, pcln116:
		ps := t.ptrSize
		if ps == 4 {
			recEntry = uint64(u32(0))
		} else {
			recEntry = t.order.Uint64(rec)
		}
		f.nameOff, f.pcsp, f.pcfile, f.pcln = u32(ps), u32(ps+12), u32(ps+16), u32(ps+20)
		if t.version == pcln116 {
			// funcID, then flag (a zero pad byte in Go 1.16).
			f.cuOff, f.flag = u32(ps+28), rec[ps+33]
			f.npcdata, f.nfuncdata = u32(ps+24), rec[ps+35]
		}
	default:
		recEntry = t.textStart + uint64(u32(0))
		f.nameOff, f.pcsp, f.pcfile, f.pcln, f.cuOff = u32(4), u32(16), u32(20), u32(24), u32(32)
		f.flag, f.npcdata, f.nfuncdata = rec[37], u32(28), rec[39]
		if t.version >= pcln120 {
			f.flag, f.nfuncdata = rec[41], rec[43] // after startLine
		}
	}
	if recEntry != f.entry {
		return f, fmt.Errorf("function %d: record at offset %#x has entry %#x, function table says %#x", i, f.recOff, recEntry, f.entry)
	}
	return f, nil
}

// findFunc returns the index of the function containing pc.
func (t *pclntab) findFunc(pc uint64) (int, bool) {
	if t.nfunc == 0 || pc < t.entry(0) || pc >= t.entry(t.nfunc) {
		return 0, false
	}
	lo, hi := 0, t.nfunc
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if t.entry(mid) <= pc {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1, true
}

// cstring reads a NUL-terminated string at off in tab, whose offset in
// the whole table is tabOff.
func (t *pclntab) cstring(tab []byte, off uint64, what string) (string, error) {
	at := len(t.data) - len(tab) + int(min(off, uint64(len(tab))))
	if off >= uint64(len(tab)) {
		return "", fmt.Errorf("%s at offset %#x out of bounds", what, at)
	}
	s := tab[off:]
	if len(s) > maxGoString {
		s = s[:maxGoString]
	}
	for i, c := range s {
		if c == 0 {
			return string(s[:i]), nil
		}
	}
	return "", fmt.Errorf("%s at offset %#x: no terminating NUL within %d bytes", what, at, len(s))
}

func (t *pclntab) funcName(f goFunc) (string, error) {
	return t.cstring(t.funcnames, uint64(f.nameOff), "function name")
}

// fileName resolves a pcfile value of function f.
func (t *pclntab) fileName(f goFunc, fileNo int32) (string, error) {
	if t.version == pcln12 {
		// The 1.2 file table is a uint32 count followed by name offsets;
		// file numbers index it directly, so 0 (the count) is invalid.
		if fileNo <= 0 || int(fileNo) >= t.nfiles {
			return "", fmt.Errorf("file number %d of function at %#x out of range [1,%d)", fileNo, f.entry, t.nfiles)
		}
		return t.cstring(t.data, uint64(t.order.Uint32(t.filetab[4*int(fileNo):])), "file name")
	}
	idx := uint64(f.cuOff) + uint64(uint32(fileNo))
	if fileNo < 0 || idx*4+4 > uint64(len(t.cutab)) {
		return "", fmt.Errorf("file number %d of compilation unit %d (function at %#x) out of bounds", fileNo, f.cuOff, f.entry)
	}
	off := t.order.Uint32(t.cutab[idx*4:])
	if off == ^uint32(0) {
		return "", fmt.Errorf("file number %d of compilation unit %d (function at %#x) is unused", fileNo, f.cuOff, f.entry)
	}
	return t.cstring(t.filetab, uint64(off), "file name")
}

// pcIter walks a pc-value table: a sequence of (value delta, pc delta)
// varint pairs, the value delta zig-zag encoded, the pc delta in units of
// the instruction quantum; the value starts at -1 and a zero value delta
// after the first pair ends the table (runtime/symtab.go, step).
type pcIter struct {
	t      *pclntab
	p      []byte
	off    int // table offset of p, for errors
	pc     uint64
	nextPC uint64
	val    int32
	first  bool
}

func (t *pclntab) pcIter(tabOff uint32, entry uint64) (pcIter, error) {
	at := len(t.data) - len(t.pctab) + int(min(uint64(tabOff), uint64(len(t.pctab))))
	if uint64(tabOff) >= uint64(len(t.pctab)) {
		return pcIter{}, fmt.Errorf("pc-value table offset %#x (table offset %#x) out of bounds", tabOff, at)
	}
	return pcIter{t: t, p: t.pctab[tabOff:], off: at, nextPC: entry, val: -1, first: true}, nil
}

// next advances to the next range [it.pc, it.nextPC) with value it.val;
// it returns false at the end of the table.
func (it *pcIter) next() (bool, error) {
	if len(it.p) == 0 {
		return false, fmt.Errorf("pc-value table at offset %#x: runs past the end without a terminator", it.off)
	}
	if it.p[0] == 0 && !it.first {
		return false, nil
	}
	uv, err := it.varint()
	if err != nil {
		return false, err
	}
	pcd, err := it.varint()
	if err != nil {
		return false, err
	}
	it.first = false
	it.val += int32(uv>>1) ^ -int32(uv&1)
	it.pc = it.nextPC
	it.nextPC += uint64(pcd) * uint64(it.t.quantum)
	return true, nil
}

func (it *pcIter) varint() (uint32, error) {
	var v uint32
	for i := 0; i < maxVarintLen && i < len(it.p); i++ {
		b := it.p[i]
		v |= uint32(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			it.p = it.p[i+1:]
			it.off += i + 1
			return v, nil
		}
	}
	return 0, fmt.Errorf("pc-value table at offset %#x: bad varint", it.off)
}

// pcValue returns the value of table tabOff of function f at pc, or
// false if the table ends before pc (as it does in the padding after a
// function's code).
func (t *pclntab) pcValue(f goFunc, tabOff uint32, pc uint64) (int32, bool, error) {
	it, err := t.pcIter(tabOff, f.entry)
	if err != nil {
		return 0, false, err
	}
	for {
		ok, err := it.next()
		if err != nil || !ok || it.pc >= f.end {
			return 0, false, err
		}
		if pc < it.nextPC {
			return it.val, true, nil
		}
	}
}

// ErrNoGoPclntab is wrapped by errors about files that are not Go
// executables (or have lost their function table).
var ErrNoGoPclntab = errors.New("no Go pclntab")

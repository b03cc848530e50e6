package nativeunwind

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// The Go toolchains that wrote the 1.2, 1.16 and 1.18 layouts cannot be
// fetched here, and cross-endian or 32-bit layouts are not built by these
// tests, so synthPclntab writes small tables of every layout from the
// documented format (runtime/symtab.go, runtime/runtime2.go and
// debug/gosym/pclntab.go of the respective releases) to check the parser.

// synthFunc is a function of a synthetic table. Ranges are (end offset
// from entry, value) pairs.
type synthFunc struct {
	name   string
	entry  uint64
	size   uint64
	flag   uint8
	pcsp   [][2]int64
	pcln   [][2]int64
	pcfile [][2]int64
}

type synthTable struct {
	version   pclnVersion
	order     binary.ByteOrder
	ptrSize   int
	quantum   uint32
	textStart uint64 // written in 1.18+ headers
	files     []string
	funcs     []synthFunc
}

// synthBuf is a growing little table writer.
type synthBuf struct {
	b     []byte
	order binary.ByteOrder
	ps    int
}

func (w *synthBuf) u8(v uint8) { w.b = append(w.b, v) }
func (w *synthBuf) u32(v uint32) {
	w.b = append(w.b, 0, 0, 0, 0)
	w.order.PutUint32(w.b[len(w.b)-4:], v)
}
func (w *synthBuf) word(v uint64) {
	w.b = append(w.b, make([]byte, w.ps)...)
	w.putWord(len(w.b)-w.ps, v)
}
func (w *synthBuf) align(n int) {
	for len(w.b)%n != 0 {
		w.b = append(w.b, 0)
	}
}
func (w *synthBuf) putWord(at int, v uint64) {
	if w.ps == 4 {
		w.order.PutUint32(w.b[at:], uint32(v))
	} else {
		w.order.PutUint64(w.b[at:], v)
	}
}

// pcTable encodes (end, value) ranges as a pc-value table.
func synthPCTable(ranges [][2]int64, quantum uint32) []byte {
	var out []byte
	val, pc := int64(-1), int64(0)
	for _, r := range ranges {
		d := r[1] - val
		out = binary.AppendUvarint(out, uint64(d<<1)^uint64(d>>63))
		out = binary.AppendUvarint(out, uint64(r[0]-pc)/uint64(quantum))
		val, pc = r[1], r[0]
	}
	return append(out, 0)
}

func (s synthTable) bytes() []byte {
	w := &synthBuf{order: s.order, ps: s.ptrSize}
	magic := map[pclnVersion]uint32{pcln12: magic12, pcln116: magic116, pcln118: magic118, pcln120: magic120}[s.version]
	w.u32(magic)
	w.u8(0)
	w.u8(0)
	w.u8(uint8(s.quantum))
	w.u8(uint8(s.ptrSize))
	if s.version == pcln12 {
		return s.bytes12(w)
	}
	return s.bytes116(w)
}

// bytes12 writes the Go 1.2 layout: everything is addressed from the
// table start; file numbers index the file table directly.
func (s synthTable) bytes12(w *synthBuf) []byte {
	n := len(s.funcs)
	w.word(uint64(n))
	functab := len(w.b)
	for range 2*n + 1 {
		w.word(0)
	}
	fileOffAt := len(w.b)
	w.u32(0)
	last := s.funcs[n-1]
	w.putWord(functab+2*n*w.ps, last.entry+last.size)
	tables := func(f synthFunc) [3]uint32 {
		var offs [3]uint32
		for i, r := range [][][2]int64{f.pcsp, f.pcfile, f.pcln} {
			if r != nil {
				offs[i] = uint32(len(w.b))
				w.b = append(w.b, synthPCTable(r, s.quantum)...)
			}
		}
		return offs
	}
	for i, f := range s.funcs {
		nameOff := uint32(len(w.b))
		w.b = append(append(w.b, f.name...), 0)
		offs := tables(f)
		w.align(w.ps)
		w.putWord(functab+2*i*w.ps, f.entry)
		w.putWord(functab+(2*i+1)*w.ps, uint64(len(w.b)))
		w.word(f.entry)
		for _, v := range []uint32{nameOff, 0, 0, offs[0], offs[1], offs[2], 0, 0} {
			w.u32(v)
		}
	}
	var nameOffs []uint32
	for _, name := range s.files {
		nameOffs = append(nameOffs, uint32(len(w.b)))
		w.b = append(append(w.b, name...), 0)
	}
	w.align(4)
	s.order.PutUint32(w.b[fileOffAt:], uint32(len(w.b)))
	w.u32(uint32(len(s.files) + 1))
	for _, off := range nameOffs {
		w.u32(off)
	}
	return w.b
}

// bytes116 writes the Go 1.16+ layouts: a header of sub-table offsets,
// then function names, one compilation unit's file table, file names,
// pc-value tables and the function table with the records after it.
func (s synthTable) bytes116(w *synthBuf) []byte {
	n := len(s.funcs)
	w.word(uint64(n))
	w.word(uint64(len(s.files)))
	if s.version >= pcln118 {
		w.word(s.textStart)
	}
	offsAt := len(w.b)
	for range 5 {
		w.word(0)
	}
	sub := func(i int) { w.putWord(offsAt+i*w.ps, uint64(len(w.b))) }

	sub(0) // function names
	names := map[string]uint32{}
	nameBase := len(w.b)
	for _, f := range s.funcs {
		names[f.name] = uint32(len(w.b) - nameBase)
		w.b = append(append(w.b, f.name...), 0)
	}
	w.align(4)
	sub(1) // cutab: file number → filetab offset, one unit
	var fileOff uint32
	for _, name := range s.files {
		w.u32(fileOff)
		fileOff += uint32(len(name) + 1)
	}
	sub(2) // filetab
	for _, name := range s.files {
		w.b = append(append(w.b, name...), 0)
	}
	sub(3) // pctab; offset 0 is "no table"
	pctab := len(w.b)
	w.u8(0)
	tabs := make([][3]uint32, n)
	for i, f := range s.funcs {
		for j, r := range [][][2]int64{f.pcsp, f.pcfile, f.pcln} {
			if r != nil {
				tabs[i][j] = uint32(len(w.b) - pctab)
				w.b = append(w.b, synthPCTable(r, s.quantum)...)
			}
		}
	}
	w.align(w.ps)
	sub(4) // functab
	functab := len(w.b)
	entry := func(f synthFunc) uint64 { return f.entry - s.textStart }
	fieldSize := w.ps
	if s.version >= pcln118 {
		fieldSize = 4
	}
	put := func(at int, v uint64) {
		if fieldSize == 4 {
			s.order.PutUint32(w.b[at:], uint32(v))
		} else {
			w.putWord(at, v)
		}
	}
	w.b = append(w.b, make([]byte, (2*n+1)*fieldSize)...)
	last := s.funcs[n-1]
	if s.version < pcln118 {
		put(functab+2*n*fieldSize, last.entry+last.size)
	} else {
		put(functab+2*n*fieldSize, entry(last)+last.size)
	}
	for i, f := range s.funcs {
		w.align(w.ps)
		put(functab+(2*i+1)*fieldSize, uint64(len(w.b)-functab))
		if s.version < pcln118 {
			put(functab+2*i*fieldSize, f.entry)
			w.word(f.entry)
		} else {
			put(functab+2*i*fieldSize, entry(f))
			w.u32(uint32(entry(f)))
		}
		for _, v := range []uint32{names[f.name], 0, 0, tabs[i][0], tabs[i][1], tabs[i][2], 0, 0} {
			w.u32(v) // nameOff, args, deferreturn, pcsp, pcfile, pcln, npcdata, cuOffset
		}
		if s.version >= pcln120 {
			w.u32(0) // startLine
		}
		w.u8(0) // funcID
		w.u8(f.flag)
		w.u8(0)
		w.u8(0) // nfuncdata
	}
	return w.b
}

// synthFuncs is the program of every synthetic table: a goroutine's
// outermost function, a function with a frame and a stack switcher.
func synthFuncs(base uint64, q uint64, flags bool) []synthFunc {
	spw := uint8(0)
	if flags {
		spw = funcFlagSPWrite
	}
	return []synthFunc{
		{name: "runtime.goexit", entry: base, size: 4 * q,
			pcsp: [][2]int64{{int64(4 * q), 0}}, pcln: [][2]int64{{int64(4 * q), 10}}, pcfile: [][2]int64{{int64(4 * q), 1}}},
		{name: "main.work", entry: base + 16*q, size: 16 * q,
			pcsp:   [][2]int64{{int64(2 * q), 0}, {int64(3 * q), 8}, {int64(12 * q), 40}, {int64(13 * q), 8}, {int64(14 * q), 0}},
			pcln:   [][2]int64{{int64(8 * q), 20}, {int64(16 * q), 21}},
			pcfile: [][2]int64{{int64(16 * q), 2}}},
		{name: "runtime.systemstack", entry: base + 32*q, size: 8 * q, flag: spw,
			pcsp: [][2]int64{{int64(8 * q), 0}}, pcln: [][2]int64{{int64(8 * q), 30}}, pcfile: [][2]int64{{int64(8 * q), 1}}},
	}
}

func synthTables() []synthTable {
	var tabs []synthTable
	for _, v := range []pclnVersion{pcln12, pcln116, pcln118, pcln120} {
		for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
			for _, ps := range []int{4, 8} {
				for _, q := range []uint32{1, 4} {
					tabs = append(tabs, synthTable{
						version: v, order: order, ptrSize: ps, quantum: q,
						textStart: 0x401000,
						files:     []string{"unused-0", "runtime/asm.s", "main.go"},
						funcs:     synthFuncs(0x401000, uint64(q), v >= pcln116),
					})
				}
			}
		}
	}
	// The file numbering of 1.2 starts at 1; in 1.16+ the cutab maps
	// numbers from 0.
	for i := range tabs {
		if tabs[i].version == pcln12 {
			tabs[i].files = tabs[i].files[1:]
		}
	}
	return tabs
}

func (s synthTable) String() string {
	return fmt.Sprintf("%v/%v/ptr%d/q%d", s.version, s.order, s.ptrSize, s.quantum)
}

func TestGoPclntabSynthetic(t *testing.T) {
	for _, st := range synthTables() {
		t.Run(st.String(), func(t *testing.T) {
			tab, err := parsePclntab(st.bytes(), 0x500000, st.order)
			if err != nil {
				t.Fatal(err)
			}
			if tab.version != st.version || tab.quantum != st.quantum || tab.ptrSize != st.ptrSize || tab.nfunc != len(st.funcs) {
				t.Fatalf("header: %v q%d ptr%d %d functions", tab.version, tab.quantum, tab.ptrSize, tab.nfunc)
			}
			syms := &GoSymbols{t: tab}
			for i, sf := range st.funcs {
				fn, err := syms.Func(i)
				if err != nil {
					t.Fatal(err)
				}
				end := sf.entry + sf.size
				if i+1 < len(st.funcs) {
					end = st.funcs[i+1].entry
				}
				if want := (GoFunc{Name: sf.name, Entry: sf.entry, End: end}); fn != want {
					t.Errorf("function %d: %+v, want %+v", i, fn, want)
				}
			}
			q := uint64(st.quantum)
			for _, c := range []struct {
				pc   uint64
				want GoFrame
			}{
				{0x401000 + 16*q, GoFrame{File: "main.go", Line: 20}},
				{0x401000 + 24*q, GoFrame{File: "main.go", Line: 21}},
				{0x401000 + 32*q, GoFrame{File: "runtime/asm.s", Line: 30}},
				{0x401000 + 4*q, GoFrame{}}, // padding after goexit
			} {
				fr, err := syms.Lookup(c.pc)
				if err != nil {
					t.Fatalf("Lookup(%#x): %v", c.pc, err)
				}
				if fr.File != c.want.File || fr.Line != c.want.Line {
					t.Errorf("Lookup(%#x) = %s:%d, want %s:%d", c.pc, fr.File, fr.Line, c.want.File, c.want.Line)
				}
			}
			if _, err := syms.Lookup(0x401000 + 40*q); err != ErrNotGoCode {
				t.Errorf("Lookup past the end: %v", err)
			}
			checkSynthDeltas(t, tab, st)
		})
	}
}

// checkSynthDeltas checks the rules of both architectures on the
// synthetic program.
func checkSynthDeltas(t *testing.T, tab *pclntab, st synthTable) {
	t.Helper()
	q := uint64(st.quantum)
	b := uint64(0x401000)
	sp := func(off int32) Rule { return Rule{CFA: CFASP, CFAOffset: off + 8, RAOffset: -8} }
	spfp := func(off int32) Rule { r := sp(off); r.FPOffset = -16; return r }
	want := Deltas{
		{b, Rule{CFA: CFAStop}},
		{b + 16*q, sp(0)},
		{b + 18*q, spfp(8)},
		{b + 19*q, spfp(40)},
		{b + 28*q, spfp(8)},
		{b + 29*q, sp(0)},
		{b + 30*q, Rule{}}, // padding, then the stack switcher without a frame
	}
	got, err := tab.deltas(&goAMD64, nil)
	if err != nil {
		t.Fatal(err)
	}
	compareDeltas(t, "amd64", got, want)

	arm := func(d int32) Rule {
		if d == 0 {
			return Rule{CFA: CFASP}
		}
		return Rule{CFA: CFASP, CFAOffset: d, RAOffset: -d, FPOffset: -d - 8}
	}
	want = Deltas{
		{b, Rule{CFA: CFAStop}},
		{b + 16*q, arm(0)},
		{b + 18*q, arm(8)},
		{b + 19*q, arm(40)},
		{b + 28*q, arm(8)},
		{b + 29*q, arm(0)},
		{b + 30*q, Rule{}},
	}
	if got, err = tab.deltas(&goARM64, nil); err != nil {
		t.Fatal(err)
	}
	compareDeltas(t, "arm64", got, want)
}

func compareDeltas(t *testing.T, what string, got, want Deltas) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d deltas, want %d:\n got %v\nwant %v", what, len(got), len(want), got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: delta %d: %#x %v, want %#x %v", what, i, got[i].Address, got[i].Rule, want[i].Address, want[i].Rule)
		}
	}
}

// TestGoPclntabMalformed corrupts one field of a valid table at a time;
// each must give an error naming the problem, never a panic.
func TestGoPclntabMalformed(t *testing.T) {
	st := synthTable{version: pcln120, order: binary.LittleEndian, ptrSize: 8, quantum: 1,
		textStart: 0x401000, files: []string{"a.go", "b.go", "c.go"}, funcs: synthFuncs(0x401000, 1, true)}
	valid := st.bytes()
	ref, err := parsePclntab(valid, 0x500000, binary.LittleEndian)
	if err != nil {
		t.Fatal(err)
	}
	functab := len(valid) - len(ref.funcs)
	le := binary.LittleEndian
	record := func(b []byte, i int) int { return functab + int(le.Uint32(b[functab+8*i+4:])) }
	for _, c := range []struct {
		name   string
		mutate func(b []byte) []byte
		op     string // where the error shows: parse, deltas or lookup
		want   string
	}{
		{"short", func(b []byte) []byte { return b[:7] }, "parse", "too short for a header"},
		{"short header", func(b []byte) []byte { return b[:40] }, "parse", "too short for the go1.20 header"},
		{"magic", func(b []byte) []byte { le.PutUint32(b, 0xfffffff5); return b }, "parse", "unknown magic 0xfffffff5 at offset 0"},
		{"quantum", func(b []byte) []byte { b[6] = 3; return b }, "parse", "bad instruction quantum 3 at offset 6"},
		{"pointer size", func(b []byte) []byte { b[7] = 2; return b }, "parse", "bad pointer size 2 at offset 7"},
		{"too many functions", func(b []byte) []byte { le.PutUint64(b[8:], 1<<40); return b }, "parse", "more than the limit"},
		{"function table overrun", func(b []byte) []byte { le.PutUint64(b[8:], 1000); return b }, "parse", "function table of 1000 functions"},
		{"sub-table offset", func(b []byte) []byte { le.PutUint64(b[8+4*8:], 1<<32); return b }, "parse", "sub-table offset 0x100000000 at offset 0x28 out of bounds"},
		{"record offset", func(b []byte) []byte { le.PutUint32(b[functab+12:], 1<<30); return b }, "deltas", "function 1: record offset 0x40000000"},
		{"record entry", func(b []byte) []byte { le.PutUint32(b[record(b, 1):], 7); return b }, "deltas", "has entry 0x401007, function table says 0x401010"},
		{"order", func(b []byte) []byte {
			le.PutUint32(b[functab+8:], 0x100)
			le.PutUint32(b[record(b, 1):], 0x100)
			return b
		}, "deltas", "out of address order"},
		{"pcsp past end", func(b []byte) []byte {
			off := len(valid) - len(ref.pctab) + int(le.Uint32(b[record(b, 1)+16:]))
			b[off+1] = 100 // the first range is 100 bytes long
			return b
		}, "deltas", "runs past the function end"},
		{"varint", func(b []byte) []byte {
			off := len(valid) - len(ref.pctab) + int(le.Uint32(b[record(b, 1)+16:]))
			copy(b[off:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			return b
		}, "deltas", "bad varint"},
		{"pcsp offset", func(b []byte) []byte { le.PutUint32(b[record(b, 1)+16:], 1<<31); return b }, "deltas", "pc-value table offset 0x80000000"},
		{"name offset", func(b []byte) []byte { le.PutUint32(b[record(b, 1)+4:], 1<<31); return b }, "deltas", "function name at offset"},
		{"file number", func(b []byte) []byte { le.PutUint32(b[record(b, 1)+32:], 1<<20); return b }, "lookup", "file number 2 of compilation unit 1048576"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := c.mutate(append([]byte(nil), valid...))
			tab, err := parsePclntab(b, 0x500000, binary.LittleEndian)
			if err == nil && c.op != "parse" {
				switch c.op {
				case "deltas":
					_, err = tab.deltas(&goAMD64, nil)
				case "lookup":
					_, err = (&GoSymbols{t: tab}).Lookup(0x401010)
				}
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

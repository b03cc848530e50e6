package beam

import (
	"encoding/binary"
	"fmt"
	"io"
)

// image is a fake BEAM process's memory: one contiguous block at base,
// built by the tests with the structures the symbolizer reads, and the
// fuzz test's input. Reads outside it fail.
type image struct {
	base uint64
	b    []byte
}

const imageBase = 0x10000

func (m *image) ReadAt(p []byte, off int64) (int, error) {
	if off < int64(m.base) || uint64(off)-m.base >= uint64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[uint64(off)-m.base:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// alloc returns the address of n new zero bytes, 16-aligned.
func (m *image) alloc(n int) uint64 {
	for len(m.b)%16 != 0 {
		m.b = append(m.b, 0)
	}
	a := m.base + uint64(len(m.b))
	m.b = append(m.b, make([]byte, n)...)
	return a
}

func (m *image) put64(a, v uint64) { binary.LittleEndian.PutUint64(m.b[a-m.base:], v) }
func (m *image) put32(a uint64, v uint32) {
	binary.LittleEndian.PutUint32(m.b[a-m.base:], v)
}
func (m *image) put16(a uint64, v uint16) {
	binary.LittleEndian.PutUint16(m.b[a-m.base:], v)
}

// fakeFunction is a function of a fakeModule: its name, arity, code size
// and line items (code offsets from the function's start, and their
// locations: file << 24 | line).
type fakeFunction struct {
	name    string
	arity   uint64
	size    uint64
	offsets []uint64
	locs    []uint32
}

type fakeModule struct {
	name      string
	files     []string // empty: no line table
	locSize   uint32
	functions []fakeFunction
}

// fakeProcess is what an image holds: its tables, and where each
// function's code starts.
type fakeProcess struct {
	mem     *image
	tables  Tables
	otp     int
	code    map[string]uint64 // "module:function" -> its ErtsCodeInfo
	mfa     map[string]uint64 // "module:function" -> its MFA's address
	headers map[string]uint64 // module -> its code header
}

// buildImage lays out modules as OTP otp's emulator does (the layouts
// symbolize.go, atoms.go and lines.go describe), after a ranges table,
// the active code index (1) and, within the atom table scan, the atom
// table.
func buildImage(otp int, modules []fakeModule) *fakeProcess {
	m := &image{base: imageBase}
	p := &fakeProcess{mem: m, otp: otp, code: map[string]uint64{}, mfa: map[string]uint64{}, headers: map[string]uint64{}}
	p.tables.Ranges = m.alloc(numCodeIx * rangesSize)
	p.tables.ActiveCodeIndex = m.alloc(8)
	m.put32(p.tables.ActiveCodeIndex, 1)

	// Atoms: false, true, then the names used.
	atoms := map[string]uint64{}
	var names []string
	atom := func(s string) uint64 {
		if t, ok := atoms[s]; ok {
			return t
		}
		t := uint64(len(names))<<atomShift | atomTag
		atoms[s] = t
		names = append(names, s)
		return t
	}
	atom("false")
	atom("true")
	for _, mod := range modules {
		atom(mod.name)
		for _, f := range mod.functions {
			atom(f.name)
		}
	}
	table := m.alloc(indexTabSize)
	seg := m.alloc(8)
	slots := m.alloc(8 * len(names))
	m.put32(table+indexSize, 1<<indexPageBits)
	m.put32(table+indexLimit, 1<<20)
	m.put32(table+indexEntries, uint32(len(names)))
	m.put64(table+indexSegTable, seg)
	m.put64(seg, slots)
	for i, s := range names {
		a := m.alloc(atomHead)
		m.put16(a+atomLen, uint16(len(s)))
		m.put64(slots+8*uint64(i), a)
		if otp == 27 {
			str := m.alloc(len(s) + 1)
			copy(m.b[str-m.base:], s)
			m.put64(a+atomName, str)
		} else {
			bin := m.alloc(heapBinBytes + len(s))
			copy(m.b[bin+heapBinBytes-m.base:], s)
			m.put64(a+atomName, bin|2)
		}
	}

	functionsAt := uint64(headerFunctions27)
	if otp == 29 {
		functionsAt = headerFunctions29
	}
	ranges := m.alloc(16 * len(modules))
	for ix := uint64(0); ix < numCodeIx; ix++ {
		r := p.tables.Ranges + ix*rangesSize
		m.put64(r, ranges)
		m.put64(r+rangesNOffset, uint64(len(modules)))
		m.put64(r+16, uint64(len(modules)))
		m.put64(r+rangesMidOffset, ranges)
	}
	for mi, mod := range modules {
		n := uint64(len(mod.functions))
		header := m.alloc(int(functionsAt + 8*(n+1)))
		p.headers[mod.name] = header
		m.put64(header+headerNumFunctions, n)
		var starts []uint64
		for _, f := range mod.functions {
			ci := m.alloc(int(f.size))
			m.put64(ci+codeInfoMFA, atom(mod.name))
			m.put64(ci+codeInfoMFA+8, atom(f.name))
			m.put64(ci+codeInfoMFA+16, f.arity)
			p.code[mod.name+":"+f.name] = ci
			p.mfa[mod.name+":"+f.name] = ci + codeInfoMFA
			starts = append(starts, ci)
		}
		end := m.alloc(16) // the module's footer
		for i, s := range starts {
			m.put64(header+functionsAt+8*uint64(i), s)
		}
		m.put64(header+functionsAt+8*n, end)
		m.put64(ranges+16*uint64(mi), header)
		m.put64(ranges+16*uint64(mi)+8, end+16)
		if len(mod.files) > 0 {
			m.put64(header+headerLineTable, p.lineTable(mod, starts, end))
		}
	}
	// Whole pages, as a process's memory is.
	m.alloc((4096 - len(m.b)%4096) % 4096)
	return p
}

// lineTable writes mod's BeamCodeLineTab.
func (p *fakeProcess) lineTable(mod fakeModule, starts []uint64, end uint64) uint64 {
	m := p.mem
	n := len(mod.functions)
	lt := m.alloc(lineFuncTab + 8*(n+1))
	fnames := m.alloc(8 * len(mod.files))
	for i, f := range mod.files {
		// A proper list of characters, its cells together, built from
		// its end as the loader does (the first cell is the last in
		// memory), 8-aligned (as on a process heap) and across a page
		// boundary, one cell straddling it.
		chars := []rune(f)
		size := uint64(consSize * len(chars))
		boundary := (m.base + uint64(len(m.b)) + size + 4095) &^ 4095
		cells := boundary - size/2&^15 - 8
		for m.base+uint64(len(m.b)) < cells {
			m.b = append(m.b, 0)
		}
		m.b = append(m.b, make([]byte, size)...)
		next := uint64(nilTerm)
		for j := len(chars) - 1; j >= 0; j-- {
			c := cells + uint64(len(chars)-1-j)*consSize
			m.put64(c, uint64(chars[j])<<smallShift|smallTag)
			m.put64(c+8, next)
			next = c | listTag
		}
		m.put64(fnames+8*uint64(i), next)
	}
	var total int
	for _, f := range mod.functions {
		total += len(f.offsets)
	}
	items := m.alloc(8 * (total + 1))
	locs := m.alloc(int(mod.locSize) * (total + 1))
	m.put64(lt+lineFnames, fnames)
	m.put32(lt+lineLocSize, mod.locSize)
	m.put64(lt+lineLocTab, locs)
	k := uint64(0)
	for i, f := range mod.functions {
		m.put64(lt+lineFuncTab+8*uint64(i), items+8*k)
		for j, off := range f.offsets {
			m.put64(items+8*k, starts[i]+off)
			if mod.locSize == 2 {
				m.put16(locs+2*k, uint16(f.locs[j]))
			} else {
				m.put32(locs+4*k, f.locs[j])
			}
			k++
		}
	}
	m.put64(lt+lineFuncTab+8*uint64(n), items+8*k)
	m.put64(items+8*k, end)
	return lt
}

func (p *fakeProcess) addr(fn string, off uint64) uint64 {
	a, ok := p.code[fn]
	if !ok {
		panic(fmt.Sprintf("no function %s in the image", fn))
	}
	return a + off
}

// sampleModules are the modules the image tests and the fuzz seeds use:
// an Erlang module with lines in two files (4-byte locations), an Elixir
// module with 2-byte locations, and one without a line table.
var sampleModules = []fakeModule{
	{name: "lists", files: []string{"lists.erl", "inc/é.hrl"}, locSize: 4, functions: []fakeFunction{
		{name: "map", arity: 2, size: 0x100, offsets: []uint64{0x40, 0x80}, locs: []uint32{1<<24 | 7, 42}},
		{name: "-map/2-fun-0-", arity: 1, size: 0x80, offsets: []uint64{0x30}, locs: []uint32{43}},
	}},
	{name: "Elixir.Foo.Bar", files: []string{"lib/foo/bar.ex"}, locSize: 2, functions: []fakeFunction{
		{name: "baz?", arity: 0, size: 0x60, offsets: []uint64{0x30, 0x40}, locs: []uint32{10, 0}},
	}},
	{name: "nolines", functions: []fakeFunction{
		{name: "f", arity: 3, size: 0x40},
	}},
}

package python

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unicode/utf8"
)

// symMem is a fake process memory: regions at addresses, and EIO (what
// /proc/PID/mem gives for an unmapped address) elsewhere. It counts reads.
type symMem struct {
	regions []symRegion
	reads   atomic.Int64
}

type symRegion struct {
	addr uint64
	data []byte
}

func (m *symMem) ReadAt(p []byte, off int64) (int, error) {
	m.reads.Add(1)
	a := uint64(off)
	for _, r := range m.regions {
		if a >= r.addr && a-r.addr <= uint64(len(r.data)) && uint64(len(p)) <= uint64(len(r.data))-(a-r.addr) {
			return copy(p, r.data[a-r.addr:]), nil
		}
	}
	return 0, syscall.EIO
}

// symImageBase is where symImage lays objects out: a typical heap address.
const symImageBase = 0x7f3a_0000_0000

// symImage lays CPython objects out in one fake memory region as off
// describes them, for tests that need no interpreter.
type symImage struct {
	off  *Offsets
	data []byte
	// The static types every image holds.
	codeType, strType, bytesType, funcType uint64
}

func newSymImage(off *Offsets) *symImage {
	m := &symImage{off: off}
	m.codeType = m.typeObject("code", 0)
	m.strType = m.typeObject("str", 0)
	m.bytesType = m.typeObject("bytes", 0)
	m.funcType = m.typeObject("function", 0)
	return m
}

func (m *symImage) mem() *symMem {
	return &symMem{regions: []symRegion{{symImageBase, m.data}}}
}

// alloc returns the address of n new zero bytes, 16-byte aligned as
// CPython's allocator aligns objects.
func (m *symImage) alloc(n int) uint64 {
	for len(m.data)%16 != 0 {
		m.data = append(m.data, 0)
	}
	addr := symImageBase + uint64(len(m.data))
	m.data = append(m.data, make([]byte, n)...)
	return addr
}

func (m *symImage) at(addr uint64, field int) []byte {
	return m.data[addr-symImageBase+uint64(field):]
}

func (m *symImage) put64(addr uint64, field int, v uint64) {
	binary.LittleEndian.PutUint64(m.at(addr, field), v)
}

func (m *symImage) put32(addr uint64, field int, v uint32) {
	binary.LittleEndian.PutUint32(m.at(addr, field), v)
}

func (m *symImage) typeObject(name string, flags uint64) uint64 {
	tp := m.alloc(max(m.off.Type.Name, m.off.Type.Flags) + 8)
	cname := m.alloc(len(name) + 1)
	copy(m.at(cname, 0), name)
	m.put64(tp, m.off.Type.Name, cname)
	m.put64(tp, m.off.Type.Flags, flags)
	return tp
}

// str lays s out as CPython would: compact, in the narrowest kind.
func (m *symImage) str(s string) uint64 {
	cps := []rune(s)
	width := 1
	for _, r := range cps {
		switch {
		case r > 0xffff:
			width = 4
		case r > 0xff:
			width = max(width, 2)
		}
	}
	ascii := len(s) == len(cps)
	return m.strRaw(cps, width, ascii, true)
}

// strRaw lays out a string of any state: its length is len(cps) and each
// code point takes kind bytes (4 for a kind other than 1 or 2).
func (m *symImage) strRaw(cps []rune, kind int, ascii, compact bool) uint64 {
	u := &m.off.Unicode
	hdr := u.CompactSize
	if ascii {
		hdr = u.ASCIISize
	}
	width := kind
	if width != 1 && width != 2 {
		width = 4
	}
	addr := m.alloc(hdr + (len(cps)+1)*width)
	m.put64(addr, m.off.Object.Type, m.strType)
	m.put64(addr, u.Length, uint64(len(cps)))
	state := uint32(kind) << u.KindShift
	if compact {
		state |= 1 << u.CompactShift
	}
	if ascii {
		state |= 1 << u.ASCIIShift
	}
	m.put32(addr, u.State, state)
	data := m.at(addr, hdr)
	for i, r := range cps {
		switch width {
		case 1:
			data[i] = byte(r)
		case 2:
			binary.LittleEndian.PutUint16(data[2*i:], uint16(r))
		default:
			binary.LittleEndian.PutUint32(data[4*i:], uint32(r))
		}
	}
	return addr
}

func (m *symImage) bytesObject(b []byte) uint64 {
	addr := m.alloc(m.off.Bytes.Data + len(b) + 1)
	m.put64(addr, m.off.Object.Type, m.bytesType)
	m.put64(addr, m.off.Bytes.Size, uint64(len(b)))
	copy(m.at(addr, m.off.Bytes.Data), b)
	return addr
}

// symCode is a code object to lay out, and where its parts went.
type symCode struct {
	name, qualname, file string
	first                int
	table                []byte

	addr, nameAddr, qualnameAddr, fileAddr, tableAddr uint64
}

// code lays c out as a new code object.
func (m *symImage) code(c *symCode) {
	c.addr = m.alloc(max(m.off.Code.Size, 256))
	m.writeCode(c)
}

// writeCode lays c's fields out as new objects and points the code object
// at c.addr to them.
func (m *symImage) writeCode(c *symCode) {
	co := &m.off.Code
	c.nameAddr, c.qualnameAddr, c.fileAddr = m.str(c.name), m.str(c.qualname), m.str(c.file)
	c.tableAddr = m.bytesObject(c.table)
	m.put64(c.addr, m.off.Object.Type, m.codeType)
	m.pointCode(c)
	if co.Code >= 0 {
		m.put64(c.addr, co.Code, m.bytesObject(make([]byte, 64)))
	}
}

// pointCode sets the fields of the code object at c.addr from c.
func (m *symImage) pointCode(c *symCode) {
	co := &m.off.Code
	m.put32(c.addr, co.FirstLineno, uint32(int32(c.first)))
	m.put64(c.addr, co.Name, c.nameAddr)
	m.put64(c.addr, co.Filename, c.fileAddr)
	if co.Qualname >= 0 {
		m.put64(c.addr, co.Qualname, c.qualnameAddr)
	}
	table := co.Linetable
	if table < 0 {
		table = co.Lnotab
	}
	m.put64(c.addr, table, c.tableAddr)
}

// wantName is the FunctionName of c's frames under off.
func (c *symCode) wantName(off *Offsets) string {
	if off.Code.Qualname >= 0 {
		return c.qualname
	}
	return c.name
}

// symTestTable is a line table of each format for a code object starting
// at line 10: bytes 0-3 on line 11, 4-9 on 12, 10-11 without a line (on 12
// before 3.10, which has no such thing), 12-15 on 14, and past that no
// line (14 before 3.10).
var symTestTable = map[LineTableFormat][]byte{
	LineTableLnotab: {0, 1, 4, 1, 8, 2},
	LineTableRanges: {4, 1, 6, 1, 2, 0x80, 4, 2},
	LineTableLocations: ltCat(
		ltEntry(ltCodeNoColumns, 2, 0x02), // +1
		ltEntry(ltCodeOneLine0+1, 3, 0x01, 0x02),
		ltEntry(ltCodeNone, 1),
		ltEntry(ltCodeNoColumns, 2, 0x04)), // +2
}

func symTestLines(format LineTableFormat) []ltWant {
	notStarted := []ltWant{{OffsetNotStarted, 10}, {0xfffffffe, 10}, {1 << 31, 10}}
	if format == LineTableLnotab {
		return append([]ltWant{{0, 11}, {2, 11}, {4, 12}, {9, 12}, {10, 12}, {12, 14}, {15, 14}, {16, 14}, {100000, 14}}, notStarted...)
	}
	return append([]ltWant{{0, 11}, {2, 11}, {4, 12}, {9, 12}, {10, 0}, {12, 14}, {15, 14}, {16, 0}, {100000, 0}}, notStarted...)
}

// symAllOffsets is every layout in the table, amd64 and arm64: both are
// 64-bit little-endian, and the symbolizer must take either.
func symAllOffsets(t testing.TB) []*Offsets {
	var all []*Offsets
	for _, o := range generatedOffsets {
		off, err := offsetsFor(o.Arch, o.Version)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, off)
	}
	return all
}

func symName(off *Offsets) string { return fmt.Sprintf("%v-%s", off.Version.MajorMinor(), off.Arch) }

func symNewCode(m *symImage, format LineTableFormat) *symCode {
	c := &symCode{name: "method", qualname: "Klass.method", file: "/srv/app/mod.py", first: 10, table: symTestTable[format]}
	m.code(c)
	return c
}

func TestSymbolizerFrame(t *testing.T) {
	for _, off := range symAllOffsets(t) {
		t.Run(symName(off), func(t *testing.T) {
			format, err := LineTableFormatFor(off.Version)
			if err != nil {
				t.Fatal(err)
			}
			m := newSymImage(off)
			c := symNewCode(m, format)
			s, err := NewSymbolizer(m.mem(), off)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range symTestLines(format) {
				got, err := s.Frame(c.addr, w.offset)
				want := Frame{FunctionName: c.wantName(off), FileName: c.file, Line: w.line, FirstLine: 10}
				if err != nil || got != want {
					t.Errorf("offset %d: got %+v, %v; want %+v", w.offset, got, err, want)
				}
			}
		})
	}
}

func TestSymbolizerStrings(t *testing.T) {
	tests := []struct {
		name    string
		cps     []rune
		kind    int
		ascii   bool
		want    string
		wantErr error
	}{
		{"ascii", []rune("mod.py"), 1, true, "mod.py", nil},
		{"empty", nil, 1, true, "", nil},
		{"latin-1", []rune("/données/façade.py"), 1, false, "/données/façade.py", nil},
		{"bmp", []rune("/srv/数据/模块.py"), 2, false, "/srv/数据/模块.py", nil},
		{"astral", []rune("/srv/𠀀/x𠀁.py"), 4, false, "/srv/𠀀/x𠀁.py", nil},
		{"surrogate escape", []rune{'a', 0xdcff, 'b'}, 2, false, "a\ufffdb", nil},
		{"past U+10FFFF", []rune{'a', 0x110000, -1}, 4, false, "a\ufffd\ufffd", nil},
		{"ascii flag with a high byte", []rune{'a', 0xe9}, 1, true, "", ErrBadObject},
		{"ascii flag with kind 2", []rune("ab"), 2, true, "", ErrBadObject},
		{"kind 3", []rune("ab"), 3, false, "", ErrBadObject},
		{"kind 0", []rune("ab"), 0, false, "", ErrBadObject},
		{"longest", []rune(string(make([]byte, symMaxStringChars))), 1, true, string(make([]byte, symMaxStringChars)), nil},
		{"too long", []rune(string(make([]byte, symMaxStringChars+1))), 1, true, "", ErrBadObject},
	}
	for _, off := range symAllOffsets(t) {
		t.Run(symName(off), func(t *testing.T) {
			format, _ := LineTableFormatFor(off.Version)
			for _, tt := range tests {
				m := newSymImage(off)
				c := symNewCode(m, format)
				c.fileAddr = m.strRaw(tt.cps, tt.kind, tt.ascii, true)
				m.pointCode(c)
				s, err := NewSymbolizer(m.mem(), off)
				if err != nil {
					t.Fatal(err)
				}
				f, err := s.Frame(c.addr, 0)
				if !errors.Is(err, tt.wantErr) || f.FileName != tt.want || !utf8.ValidString(f.FileName) {
					t.Errorf("%s: got %q, %v; want %q, %v", tt.name, f.FileName, err, tt.want, tt.wantErr)
				}
			}
		})
	}
}

// TestSymbolizerRefuses breaks one part of a code object at a time.
func TestSymbolizerRefuses(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *symImage, c *symCode)
		addr   func(c *symCode) uint64
		want   error
	}{
		{name: "null code", addr: func(*symCode) uint64 { return 0 }, want: ErrNotCode},
		{name: "kernel address", addr: func(*symCode) uint64 { return 0xffff_ffff_8100_0000 }, want: ErrNotCode},
		{name: "unmapped code", addr: func(*symCode) uint64 { return 0x1000 }, want: ErrUnreadable},
		{name: "a function object", want: ErrNotCode, mutate: func(m *symImage, c *symCode) {
			m.put64(c.addr, m.off.Object.Type, m.funcType)
		}},
		{name: "heap type named code", want: ErrNotCode, mutate: func(m *symImage, c *symCode) {
			m.put64(c.addr, m.off.Object.Type, m.typeObject("code", pyTPFlagsHeapType))
		}},
		{name: "type named codex", want: ErrNotCode, mutate: func(m *symImage, c *symCode) {
			m.put64(c.addr, m.off.Object.Type, m.typeObject("codex", 0))
		}},
		{name: "type pointer unmapped", want: ErrNotCode, mutate: func(m *symImage, c *symCode) {
			m.put64(c.addr, m.off.Object.Type, 0x1000)
		}},
		{name: "negative first line", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.first = -1
			m.pointCode(c)
		}},
		{name: "null file name", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.fileAddr = 0
			m.pointCode(c)
		}},
		{name: "file name is bytes", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.fileAddr = m.bytesObject([]byte("mod.py"))
			m.pointCode(c)
		}},
		{name: "legacy string", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.fileAddr = m.strRaw([]rune("mod.py"), 1, false, false)
			m.pointCode(c)
		}},
		{name: "negative length", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			m.put64(c.fileAddr, m.off.Unicode.Length, ^uint64(0))
		}},
		{name: "huge length", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			m.put64(c.fileAddr, m.off.Unicode.Length, 1<<40)
		}},
		{name: "name is the table", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.nameAddr, c.qualnameAddr = c.tableAddr, c.tableAddr
			m.pointCode(c)
		}},
		{name: "table is a string", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			c.tableAddr = c.fileAddr
			m.pointCode(c)
		}},
		{name: "table of negative size", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			m.put64(c.tableAddr, m.off.Bytes.Size, 1<<63)
		}},
		{name: "table over 1 MiB", want: ErrBadObject, mutate: func(m *symImage, c *symCode) {
			m.put64(c.tableAddr, m.off.Bytes.Size, symMaxTableBytes+1)
		}},
		{name: "table past the mapping", want: ErrUnreadable, mutate: func(m *symImage, c *symCode) {
			m.put64(c.tableAddr, m.off.Bytes.Size, uint64(len(m.data)))
		}},
		{name: "string past the mapping", want: ErrUnreadable, mutate: func(m *symImage, c *symCode) {
			c.fileAddr = m.str("/a/b.py")
			m.pointCode(c)
			m.data = m.data[:c.fileAddr-symImageBase+uint64(m.off.Unicode.ASCIISize)+3]
		}},
		{name: "malformed table", want: ErrLineTableMalformed, mutate: func(m *symImage, c *symCode) {
			c.tableAddr = m.bytesObject([]byte{0x00, 0x01, 0x02})
			m.pointCode(c)
		}},
	}
	for _, off := range symAllOffsets(t) {
		t.Run(symName(off), func(t *testing.T) {
			format, _ := LineTableFormatFor(off.Version)
			for _, tt := range tests {
				m := newSymImage(off)
				c := symNewCode(m, format)
				if tt.mutate != nil {
					tt.mutate(m, c)
				}
				addr := c.addr
				if tt.addr != nil {
					addr = tt.addr(c)
				}
				s, err := NewSymbolizer(m.mem(), off)
				if err != nil {
					t.Fatal(err)
				}
				f, err := s.Frame(addr, 4)
				if !errors.Is(err, tt.want) || f != (Frame{}) {
					t.Errorf("%s: got %+v, %v; want %v", tt.name, f, err, tt.want)
				}
			}
		})
	}
}

// TestSymbolizerCacheRevalidates replaces the code object behind a cached
// address the ways a freed code object's address gets reused, and checks
// that the next lookup sees the new one.
func TestSymbolizerCacheRevalidates(t *testing.T) {
	tests := []struct {
		name    string
		replace func(m *symImage, c *symCode)
		// wantLine is the line of offset 4 afterwards.
		wantLine  int
		wantErr   error
		wantStale uint64
	}{
		{
			name:     "unchanged",
			replace:  func(*symImage, *symCode) {},
			wantLine: 12,
		},
		{
			name: "refcount and other fields change",
			replace: func(m *symImage, c *symCode) {
				m.put64(c.addr, 0, 1234)
			},
			wantLine: 12,
		},
		{
			name: "another code object",
			replace: func(m *symImage, c *symCode) {
				c.name, c.qualname, c.file, c.first = "other", "other", "/srv/app/other.py", 40
				m.writeCode(c)
			},
			wantLine:  42,
			wantStale: 1,
		},
		{
			name: "same interned strings, another first line",
			replace: func(m *symImage, c *symCode) {
				c.first = 20
				m.pointCode(c)
			},
			wantLine:  22,
			wantStale: 1,
		},
		{
			name: "same interned strings, another line table",
			replace: func(m *symImage, c *symCode) {
				c.table = []byte{0, 5}
				if m.off.Version.Minor >= 10 {
					c.table = []byte{16, 5}
				}
				if m.off.Version.Minor >= 11 {
					c.table = ltEntry(ltCodeNoColumns, 8, 0x0a)
				}
				c.tableAddr = m.bytesObject(c.table)
				m.pointCode(c)
			},
			wantLine:  15,
			wantStale: 1,
		},
		{
			name: "no longer code",
			replace: func(m *symImage, c *symCode) {
				m.put64(c.addr, m.off.Object.Type, m.funcType)
			},
			wantErr:   ErrNotCode,
			wantStale: 1,
		},
	}
	for _, off := range symAllOffsets(t) {
		t.Run(symName(off), func(t *testing.T) {
			format, _ := LineTableFormatFor(off.Version)
			for _, tt := range tests {
				m := newSymImage(off)
				c := symNewCode(m, format)
				mem := m.mem()
				s, err := NewSymbolizer(mem, off)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Frame(c.addr, 4); err != nil {
					t.Fatal(err)
				}
				tt.replace(m, c)
				mem.regions[0].data = m.data // replace may have grown it
				mem.reads.Store(0)
				got, err := s.Frame(c.addr, 4)
				want := Frame{FunctionName: c.wantName(off), FileName: c.file, Line: tt.wantLine, FirstLine: c.first}
				if tt.wantErr != nil {
					want = Frame{}
				}
				if !errors.Is(err, tt.wantErr) || got != want {
					t.Errorf("%s: got %+v, %v; want %+v, %v", tt.name, got, err, want, tt.wantErr)
				}
				st := s.Stats()
				if st.Stale != tt.wantStale || st.Hits+st.Misses != 2 {
					t.Errorf("%s: stats %+v, want %d stale of 2 lookups", tt.name, st, tt.wantStale)
				}
				// A hit costs one read; a miss, once the types are known, one
				// for the code object and two per string and table.
				wantReads := int64(1)
				if tt.wantStale != 0 && tt.wantErr == nil {
					wantReads = 7
				}
				if reads := mem.reads.Load(); tt.wantErr == nil && reads != wantReads {
					t.Errorf("%s: %d reads, want %d", tt.name, reads, wantReads)
				}
			}
		})
	}
}

func TestSymbolizerCacheBounds(t *testing.T) {
	off, err := OffsetsFor(Version{Major: 3, Minor: 12})
	if err != nil {
		t.Fatal(err)
	}
	m := newSymImage(off)
	var codes []*symCode
	for i := range 5 {
		c := &symCode{name: fmt.Sprint("f", i), qualname: fmt.Sprint("f", i), file: "m.py", first: i + 1, table: make([]byte, 1000)}
		for j := range c.table {
			c.table[j] = 0x80 | ltCodeNone<<3
		}
		m.code(c)
		codes = append(codes, c)
	}
	cost := len("f0") + len("m.py") + 1000 + symEntryOverhead
	tests := []struct {
		name            string
		entries, bytes  int
		wantEvictions   uint64
		wantCachedAfter int
	}{
		{"by entries", 3, 1 << 20, 2, 3},
		{"by bytes", 100, 2*cost + cost/2, 3, 2},
		{"entry over the budget", 100, 10, 4, 1},
	}
	for _, tt := range tests {
		s, err := newSymbolizer(m.mem(), off, tt.entries, tt.bytes)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range codes {
			if f, err := s.Frame(c.addr, 0); err != nil || f.FunctionName != c.name {
				t.Fatalf("%s: %+v, %v", tt.name, f, err)
			}
		}
		if st := s.Stats(); st.Evictions != tt.wantEvictions || s.cache.Cost() != tt.wantCachedAfter*cost {
			t.Errorf("%s: %+v, %d bytes cached; want %d evictions, %d bytes", tt.name, st, s.cache.Cost(), tt.wantEvictions, tt.wantCachedAfter*cost)
		}
		if s.cache.Len() != tt.wantCachedAfter {
			t.Errorf("%s: %d entries cached, want %d", tt.name, s.cache.Len(), tt.wantCachedAfter)
		}
		// The newest entries stay: looking them up again hits (and a hit
		// evicts nothing).
		for _, c := range codes[len(codes)-tt.wantCachedAfter:] {
			hits := s.Stats().Hits
			if _, err := s.Frame(c.addr, 0); err != nil {
				t.Fatal(err)
			}
			if s.Stats().Hits != hits+1 {
				t.Errorf("%s: %s evicted", tt.name, c.name)
			}
		}
	}
}

// TestSymbolizerConcurrent looks frames up from several goroutines at
// once, some of them for code objects the cache must evict: run it with
// -race.
func TestSymbolizerConcurrent(t *testing.T) {
	off, err := OffsetsFor(Version{Major: 3, Minor: 13})
	if err != nil {
		t.Fatal(err)
	}
	m := newSymImage(off)
	var codes []*symCode
	for i := range 8 {
		c := &symCode{name: fmt.Sprint("f", i), qualname: fmt.Sprint("K.f", i), file: "m.py", first: i + 1, table: symTestTable[LineTableLocations]}
		m.code(c)
		codes = append(codes, c)
	}
	s, err := newSymbolizer(m.mem(), off, 4, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				c := codes[(g+i)%len(codes)]
				f, err := s.Frame(c.addr, 4)
				if want := (Frame{c.qualname, c.file, c.first + 2, c.first}); err != nil || f != want {
					t.Errorf("got %+v, %v; want %+v", f, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Hits+st.Misses != 800 || st.Stale != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestNewSymbolizerRejectsOffsets(t *testing.T) {
	off, err := OffsetsFor(Version{Major: 3, Minor: 11})
	if err != nil {
		t.Fatal(err)
	}
	bad := *off
	bad.Code.Filename = NoField
	if _, err := NewSymbolizer(&symMem{}, &bad); err == nil {
		t.Error("offsets without co_filename accepted")
	}
	bad = *off
	bad.Version = Version{Major: 2, Minor: 7}
	if _, err := NewSymbolizer(&symMem{}, &bad); !errors.Is(err, ErrLineTableVersion) {
		t.Errorf("python 2.7: %v", err)
	}
}

package luajit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
)

// The BPF unwinder's frames (support/ebpf/luajit.ebpf.c):
//
//	Lua frame:   FileID = the GCproto's address, Addr = the PC LuaJIT saved
//	             for the frame (the bytecode after the current one), 0 if
//	             unknown.
//	Trace frame: FileID = traceTag | G (the VM instance's global_State),
//	             Addr = the machine-code address in the trace (in the
//	             call for a return address). It stands
//	             for the frame the trace started in.
const traceTag = 1 << 63

// Bounds on what is read from the target: larger values are garbage.
const (
	maxChunkName = 4096
	// maxBytecode bounds a prototype's bytecode (LuaJIT's own limit is
	// far below: 2^26 instructions).
	maxBytecode = 1 << 26
	// maxLineInfoCached bounds the line table kept per prototype; larger
	// ones are read per lookup.
	maxLineInfoCached = 64 << 10
	// maxTraces bounds J->sizetrace (OpenResty's maxtrace is 8000; the
	// table grows in powers of two up to 65535).
	maxTraces = 1 << 16
	// maxAreas bounds the machine-code areas one mapping is made of.
	maxAreas = 4096
)

var errBadProto = errors.New("luajit: not a prototype")

// protoHeader is what a GCproto says about its code and lines.
type protoHeader struct {
	SizeBC             uint32
	ChunkName          uint64
	FirstLine, NumLine int32
	LineInfo           uint64
}

// parseProto reads the header of a GCproto (its first l.Proto.Size bytes).
func parseProto(l *Layout, b []byte) (protoHeader, error) {
	if len(b) < int(l.Proto.Size) || l.Proto.Size < l.Proto.LineInfo+8 {
		return protoHeader{}, errBadProto
	}
	h := protoHeader{
		SizeBC:    binary.LittleEndian.Uint32(b[l.Proto.SizeBC:]),
		ChunkName: binary.LittleEndian.Uint64(b[l.Proto.ChunkName:]),
		FirstLine: int32(binary.LittleEndian.Uint32(b[l.Proto.FirstLine:])),
		NumLine:   int32(binary.LittleEndian.Uint32(b[l.Proto.NumLine:])),
		LineInfo:  binary.LittleEndian.Uint64(b[l.Proto.LineInfo:]),
	}
	if h.SizeBC == 0 || h.SizeBC > maxBytecode || h.ChunkName == 0 || h.FirstLine < 0 || h.NumLine < 0 {
		return protoHeader{}, fmt.Errorf("%w: %d bytecodes, chunk name %#x, lines %d+%d",
			errBadProto, h.SizeBC, h.ChunkName, h.FirstLine, h.NumLine)
	}
	return h, nil
}

// lineWidth is the size of one line table entry: its entries are the
// lines relative to firstline, as small as numline allows (lj_debug_line).
func (h protoHeader) lineWidth() uint64 {
	switch {
	case h.NumLine < 1<<8:
		return 1
	case h.NumLine < 1<<16:
		return 2
	}
	return 4
}

// lineEntry decodes line table entry i of width w from b.
func lineEntry(b []byte, w uint64) uint32 {
	switch w {
	case 1:
		return uint32(b[0])
	case 2:
		return uint32(binary.LittleEndian.Uint16(b))
	}
	return binary.LittleEndian.Uint32(b)
}

// chunkDisplay is a chunk name as a file: "@path" names a file, "=name" a
// special chunk, anything else is the source text itself (shown as
// LuaJIT's [string "..."] does, cut at its first line).
func chunkDisplay(name string) string {
	switch {
	case strings.HasPrefix(name, "@"), strings.HasPrefix(name, "="):
		return name[1:]
	}
	first, _, cut := strings.Cut(name, "\n")
	if len(first) > 40 {
		first, cut = first[:40], true
	}
	if cut {
		first += "..."
	}
	return `[string "` + first + `"]`
}

// proto is a prototype as read.
type proto struct {
	protoHeader
	file string
	// name is the function's name as frames show it: LuaJIT's functions
	// have none, so "file:firstline" ("file:main" for a chunk).
	name string
	// lines is the line table, nil when too large to keep.
	lines []byte
}

// lineAt is the line of bytecode pos (lj_debug_line); 0 when unknown.
func (p *proto) lineAt(mem *procmem.Reader, pos uint32) uint32 {
	switch {
	case pos == 0:
		return uint32(p.FirstLine)
	case pos > p.SizeBC:
		return 0
	case pos == p.SizeBC:
		return uint32(p.FirstLine + p.NumLine)
	case p.LineInfo == 0:
		return 0
	}
	w := p.lineWidth()
	var e [4]byte
	if p.lines != nil {
		copy(e[:], p.lines[uint64(pos-1)*w:])
	} else if mem.Read(p.LineInfo+uint64(pos-1)*w, e[:w]) != nil {
		return 0
	}
	rel := lineEntry(e[:], w)
	if rel > uint32(p.NumLine) {
		return 0
	}
	return uint32(p.FirstLine) + rel
}

// trace is a compiled trace as read: its machine code, where it started,
// its snapshots and IR.
type trace struct {
	addr             uint64
	mcode, szmcode   uint64
	startPt, startPC uint64
	snap, snapMap    uint64
	ir               uint64
	nk               uint32
	nsnap            uint16
	traceNo          uint16
}

// parseTrace reads the header of a GCtrace (l.Trace.Size bytes).
func parseTrace(l *Layout, addr uint64, b []byte) (trace, error) {
	if len(b) < int(l.Trace.Size) {
		return trace{}, errors.New("luajit: short trace")
	}
	t := trace{
		addr:    addr,
		mcode:   binary.LittleEndian.Uint64(b[l.Trace.MCode:]),
		szmcode: uint64(binary.LittleEndian.Uint32(b[l.Trace.SzMCode:])),
		startPt: binary.LittleEndian.Uint64(b[l.Trace.StartPt:]),
		startPC: binary.LittleEndian.Uint64(b[l.Trace.StartPC:]),
		snap:    binary.LittleEndian.Uint64(b[l.Trace.Snap:]),
		snapMap: binary.LittleEndian.Uint64(b[l.Trace.SnapMap:]),
		ir:      binary.LittleEndian.Uint64(b[l.Trace.IR:]),
		nk:      binary.LittleEndian.Uint32(b[l.Trace.NK:]),
		nsnap:   binary.LittleEndian.Uint16(b[l.Trace.NSnap:]),
		traceNo: binary.LittleEndian.Uint16(b[l.Trace.TraceNo:]),
	}
	if t.mcode == 0 || t.szmcode == 0 || t.szmcode > 1<<30 || t.mcode+t.szmcode < t.mcode || t.startPt == 0 {
		return trace{}, fmt.Errorf("luajit: not a trace at %#x", addr)
	}
	return t, nil
}

// traceTable is a VM instance's traces, sorted by machine code.
type traceTable struct {
	traces []trace
}

// find is the trace whose machine code holds pc.
func (tt *traceTable) find(pc uint64) (trace, bool) {
	i, _ := slices.BinarySearchFunc(tt.traces, pc, func(t trace, pc uint64) int {
		switch {
		case t.mcode+t.szmcode <= pc:
			return -1
		case t.mcode > pc:
			return 1
		}
		return 0
	})
	if i < len(tt.traces) && tt.traces[i].mcode <= pc && pc < tt.traces[i].mcode+tt.traces[i].szmcode {
		return tt.traces[i], true
	}
	return trace{}, false
}

// Symbolizer names the frames of one process's LuaJIT VM instances.
type Symbolizer struct {
	mem    *procmem.Reader
	l      *Layout
	protos *interpreter.SymbolCache[uint64, *proto]

	mu     sync.Mutex
	traces map[uint64]*traceTable
	// snaps are traces' snapshots, by trace address and machine code;
	// snapFrames the frames of one of them (its index third).
	snaps      map[[2]uint64][]snapshot
	snapFrames map[[3]uint64][]snapFrameRef
}

// NewSymbolizer reads LuaJIT's objects of layout l through mem.
func NewSymbolizer(mem *procmem.Reader, l *Layout) *Symbolizer {
	return &Symbolizer{
		mem: mem, l: l,
		protos: interpreter.NewSymbolCache[uint64, *proto](16384, 16<<20, func(p *proto) int {
			return 128 + len(p.file) + len(p.name) + len(p.lines)
		}),
		traces: map[uint64]*traceTable{}, snaps: map[[2]uint64][]snapshot{},
		snapFrames: map[[3]uint64][]snapFrameRef{},
	}
}

// Stats counts the prototype cache's answers.
func (s *Symbolizer) Stats() interpreter.CacheStats { return s.protos.Stats() }

// readHeader reads and parses the prototype at addr.
func (s *Symbolizer) readHeader(addr uint64) (protoHeader, error) {
	b := make([]byte, s.l.Proto.Size)
	if err := s.mem.Read(addr, b); err != nil {
		return protoHeader{}, err
	}
	return parseProto(s.l, b)
}

// proto returns the prototype at addr, from the cache while its header
// is the one cached.
func (s *Symbolizer) proto(addr uint64) (*proto, error) {
	var cur protoHeader
	var curErr error
	return s.protos.Get(addr, func(p *proto) bool {
		cur, curErr = s.readHeader(addr)
		return curErr == nil && cur == p.protoHeader
	}, func() (*proto, error) {
		h := cur
		if curErr != nil || h.SizeBC == 0 {
			var err error
			if h, err = s.readHeader(addr); err != nil {
				return nil, err
			}
		}
		return s.loadProto(h)
	})
}

// loadProto reads what a prototype's header points to.
func (s *Symbolizer) loadProto(h protoHeader) (*proto, error) {
	var lenb [4]byte
	if err := s.mem.Read(h.ChunkName+uint64(s.l.Str.Len), lenb[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(lenb[:])
	if n > maxChunkName {
		n = maxChunkName
	}
	name := make([]byte, n)
	if err := s.mem.Read(h.ChunkName+uint64(s.l.Str.Size), name); err != nil {
		return nil, err
	}
	p := &proto{protoHeader: h, file: chunkDisplay(string(name))}
	base := path.Base(p.file)
	if h.FirstLine == 0 {
		p.name = base + ":main"
	} else {
		p.name = base + ":" + strconv.Itoa(int(h.FirstLine))
	}
	if size := uint64(h.SizeBC) * h.lineWidth(); h.LineInfo != 0 && size <= maxLineInfoCached {
		p.lines = make([]byte, size)
		if err := s.mem.Read(h.LineInfo, p.lines); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// bytecodePos is the position of the bytecode before a saved PC (the one
// being executed), or -1 when pc is not in the prototype.
func (s *Symbolizer) bytecodePos(addr uint64, p *proto, pc uint64) int64 {
	bc := addr + uint64(s.l.Proto.Size)
	if pc < bc+4 || pc > bc+4*uint64(p.SizeBC) || (pc-bc)%4 != 0 {
		return -1
	}
	return int64((pc-bc)/4) - 1
}

// Frames appends the frames one BPF frame stands for.
func (s *Symbolizer) Frames(fileID, addr uint64, out []libpf.Frame) ([]libpf.Frame, error) {
	if fileID&traceTag != 0 {
		return s.traceFrames(fileID&^traceTag, addr, out)
	}
	p, err := s.proto(fileID)
	if err != nil {
		return out, err
	}
	f := libpf.Frame{Kind: Kind, FunctionName: p.name, SourceFile: p.file}
	if pos := s.bytecodePos(fileID, p, addr); pos >= 0 {
		f.SourceLine = p.lineAt(s.mem, uint32(pos))
	}
	return append(out, f), nil
}

// traceFrames names a trace frame: the functions the trace inlined at
// the code's snapshot, innermost first, then the function it started in;
// that one alone, at the trace's start, when the snapshot cannot be
// decoded.
func (s *Symbolizer) traceFrames(g, pc uint64, out []libpf.Frame) ([]libpf.Frame, error) {
	t, err := s.trace(g, pc)
	if err != nil {
		return out, err
	}
	tier := "trace " + strconv.Itoa(int(t.traceNo))
	refs, err := s.snapshotFrames(t, pc)
	if err == nil {
		n := len(out)
		if out, err = s.appendSnapFrames(t, refs, tier, out); err == nil {
			return out, nil
		}
		out = out[:n]
	}
	return s.appendSnapFrames(t, []snapFrameRef{{pc: t.startPC, resume: true}}, tier, out)
}

// appendSnapFrames appends the frames refs name in trace t.
func (s *Symbolizer) appendSnapFrames(t trace, refs []snapFrameRef, tier string, out []libpf.Frame) ([]libpf.Frame, error) {
	for i, r := range refs {
		addr := t.startPt
		if r.fn != 0 {
			ffid, err := s.mem.U8(r.fn + uint64(s.l.Func.FFID))
			if err != nil {
				return out, err
			}
			bc, err := s.mem.U64(r.fn + uint64(s.l.Func.PC))
			if err != nil {
				return out, err
			}
			if ffid != 0 || bc < uint64(s.l.Proto.Size) {
				return out, fmt.Errorf("luajit: inlined function %#x is not a Lua function", r.fn)
			}
			addr = bc - uint64(s.l.Proto.Size)
		}
		p, err := s.proto(addr)
		if err != nil {
			return out, err
		}
		pc := r.pc
		if r.resume {
			// The bytecode to resume at, not a saved PC.
			pc += 4
		}
		f := libpf.Frame{Kind: Kind, FunctionName: p.name, SourceFile: p.file, Tier: tier, Inlined: i < len(refs)-1}
		if pos := s.bytecodePos(addr, p, pc); pos >= 0 {
			f.SourceLine = p.lineAt(s.mem, uint32(pos))
		}
		out = append(out, f)
	}
	return out, nil
}

// maxSnapCache bounds the snapshots and decoded snapshots kept.
const maxSnapCache = 4096

// snapshotFrames decodes the snapshot of trace t that covers pc.
func (s *Symbolizer) snapshotFrames(t trace, pc uint64) ([]snapFrameRef, error) {
	if t.nsnap == 0 || t.nsnap > maxSnapshots || t.snap == 0 || t.snapMap == 0 {
		return nil, fmt.Errorf("%w: %d snapshots", errSnapshot, t.nsnap)
	}
	tk := [2]uint64{t.addr, t.mcode}
	s.mu.Lock()
	snaps, ok := s.snaps[tk]
	s.mu.Unlock()
	if !ok {
		b := make([]byte, int(t.nsnap)*snapshotSize)
		if err := s.mem.Read(t.snap, b); err != nil {
			return nil, err
		}
		snaps = parseSnapshots(b)
		s.mu.Lock()
		if len(s.snaps) >= maxSnapCache {
			clear(s.snaps)
		}
		s.snaps[tk] = snaps
		s.mu.Unlock()
	}
	i := snapshotAt(snaps, (pc-t.mcode)/uint64(s.l.MCodeUnit))
	if i < 0 {
		return nil, fmt.Errorf("%w: none before %#x", errSnapshot, pc)
	}
	fk := [3]uint64{t.addr, t.mcode, uint64(i)}
	s.mu.Lock()
	refs, ok := s.snapFrames[fk]
	s.mu.Unlock()
	if ok {
		return refs, nil
	}
	sn := snaps[i]
	// The entries, then the PC and base word.
	b := make([]byte, 4*(int(sn.nent)+2))
	if err := s.mem.Read(t.snapMap+4*uint64(sn.mapofs), b); err != nil {
		return nil, err
	}
	entries := make([]uint32, sn.nent)
	for j := range entries {
		entries[j] = binary.LittleEndian.Uint32(b[4*j:])
	}
	refs, err := decodeSnapshot(entries, binary.LittleEndian.Uint64(b[4*len(entries):]), func(ref uint32) (uint8, uint64, error) {
		if ref < t.nk || ref >= refBias {
			return 0, 0, fmt.Errorf("%w: IR %#x is not a constant", errSnapshot, ref)
		}
		var ir [16]byte
		if err := s.mem.Read(t.ir+8*uint64(ref), ir[:]); err != nil {
			return 0, 0, err
		}
		return ir[5], binary.LittleEndian.Uint64(ir[8:]), nil
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.snapFrames) >= maxSnapCache {
		clear(s.snapFrames)
	}
	s.snapFrames[fk] = refs
	s.mu.Unlock()
	return refs, nil
}

// trace finds the trace of VM instance g whose code holds pc, reading the
// instance's trace table again when it is not known or has changed.
func (s *Symbolizer) trace(g, pc uint64) (trace, error) {
	s.mu.Lock()
	tt := s.traces[g]
	s.mu.Unlock()
	if tt != nil {
		if t, ok := tt.find(pc); ok {
			b := make([]byte, s.l.Trace.Size)
			if s.mem.Read(t.addr, b) == nil {
				if cur, err := parseTrace(s.l, t.addr, b); err == nil && cur == t {
					return t, nil
				}
			}
		}
	}
	tt, err := s.readTraces(g)
	if err != nil {
		return trace{}, err
	}
	s.mu.Lock()
	if len(s.traces) >= 64 {
		clear(s.traces)
	}
	s.traces[g] = tt
	s.mu.Unlock()
	if t, ok := tt.find(pc); ok {
		return t, nil
	}
	return trace{}, fmt.Errorf("luajit: no trace at %#x", pc)
}

// readTraces reads J->trace[] of VM instance g.
func (s *Symbolizer) readTraces(g uint64) (*traceTable, error) {
	l := s.l
	j := g - uint64(l.GGState.G) + uint64(l.GGState.J)
	arr, err := s.mem.U64(j + uint64(l.JIT.Trace))
	if err != nil {
		return nil, err
	}
	n, err := s.mem.U32(j + uint64(l.JIT.SizeTrace))
	if err != nil {
		return nil, err
	}
	if n > maxTraces || arr == 0 {
		return nil, fmt.Errorf("luajit: trace table of %d at %#x", n, arr)
	}
	ptrs := make([]byte, 8*uint64(n))
	if err := s.mem.Read(arr, ptrs); err != nil {
		return nil, err
	}
	return s.parseTraceTable(ptrs), nil
}

// parseTraceTable reads the traces J->trace[] (ptrs) points to.
func (s *Symbolizer) parseTraceTable(ptrs []byte) *traceTable {
	tt := &traceTable{}
	b := make([]byte, s.l.Trace.Size)
	for i := 8; i+8 <= len(ptrs); i += 8 {
		addr := binary.LittleEndian.Uint64(ptrs[i:])
		if addr == 0 || s.mem.Read(addr, b) != nil {
			continue
		}
		if t, err := parseTrace(s.l, addr, b); err == nil {
			tt.traces = append(tt.traces, t)
		}
	}
	slices.SortFunc(tt.traces, func(a, b trace) int {
		switch {
		case a.mcode < b.mcode:
			return -1
		case a.mcode > b.mcode:
			return 1
		}
		return 0
	})
	return tt
}

// isMCodeArea says whether [start, end) is made of LuaJIT machine-code
// areas: each starts with an MCLink {next, size} whose size is the
// area's, and the areas fill the mapping (the kernel merges adjacent ones
// of the same protection into one mapping).
func (s *Symbolizer) isMCodeArea(start, end uint64) bool {
	pos := start
	for range maxAreas {
		var b [16]byte
		if s.mem.Read(pos, b[:]) != nil {
			return false
		}
		size := binary.LittleEndian.Uint64(b[8:])
		if !validArea(pos, end, size) {
			return false
		}
		if pos += size; pos == end {
			return true
		}
	}
	return false
}

// validArea says whether an area of size bytes at pos fits a mapping
// ending at end.
func validArea(pos, end, size uint64) bool {
	return size >= 4096 && size%4096 == 0 && size <= end-pos
}

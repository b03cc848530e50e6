package hotspot

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// Frame types (enum jvm_frame_type in support/ebpf/jvm.ebpf.c): the top
// two bits of a frame's addr.
const (
	frameInterpreted = 0
	frameCompiled    = 1
	frameStub        = 2
	frameTypeShift   = 62
	frameTop         = 1 << 61
)

// The JIT tiers of Java frames (libpf.Frame.Tier).
const (
	TierInterpreted = "interpreted"
	TierC1          = "C1"
	TierC2          = "C2"
	// TierNative is a native method's frame (its compiled wrapper).
	TierNative = "native"
)

// ErrStale says a frame's code is gone: an nmethod freed (its address now
// holds other code, or another nmethod with another compile id).
var ErrStale = errors.New("JVM code no longer there")

// Bounds of what is read of one method.
const (
	maxSymbolLength = 1024
	maxLineTable    = 64 << 10
	maxScopes       = 64
	maxPcDescs      = 1 << 16
	// maxMethods and maxStubs bound the per-JVM caches of named methods
	// and code blobs.
	maxMethods = 1 << 16
	maxStubs   = 1 << 12
)

// method is what a Method names, with its line number table decoded.
type method struct {
	constMethod uint64
	name        string // package.Class.method
	// signature is the method's descriptor, "(J)J"; Frame.SystemName is
	// name + signature.
	signature string
	file      string
	codeSize  uint32
	// lines are (start bci, line) pairs as the table lists them.
	lines [][2]uint32
}

type stubName struct {
	ptr  uint64
	name string
}

// symbolizer names the Java frames of one JVM.
type symbolizer struct {
	r  *procmem.Reader
	l  *Layout
	cc *CodeCache

	mu      sync.Mutex
	methods map[uint64]*method
	// stubs caches the names of other code blobs by address, with the
	// pointer the name was read from.
	stubs map[uint64]stubName
	// nmethods caches what was read of nmethods, up to maxNMethodBytes.
	nmethods     map[nmethodKey]*nmethodInfo
	nmethodBytes int
}

func newSymbolizer(r *procmem.Reader, l *Layout, cc *CodeCache) *symbolizer {
	return &symbolizer{r: r, l: l, cc: cc, methods: map[uint64]*method{}, stubs: map[uint64]stubName{}, nmethods: map[nmethodKey]*nmethodInfo{}}
}

func (s *symbolizer) symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	switch f.Addr >> frameTypeShift {
	case frameInterpreted:
		m, err := s.method(f.FileID)
		if err != nil {
			return out, err
		}
		bci := int64(-1)
		switch {
		case f.Addr == 0:
		case s.l.BCPMayBeIndex && f.Addr < uint64(m.codeSize):
			// JDK 8's collector turns each frame's bytecode pointer into
			// its index while it runs (frame::gc_prologue).
			bci = int64(f.Addr)
		default:
			bci = int64(f.Addr) - int64(m.constMethod+uint64(s.l.Method.ConstMethodSize))
		}
		if m.codeSize == 0 && (f.Addr == 0 || bci == 0) {
			// A native method called through the interpreter's native
			// entry: no bytecodes, the frame's bcp is where they would
			// start (or 0).
			return append(out, m.frame(-1, TierNative, false)), nil
		}
		if bci != -1 && (bci < 0 || bci >= int64(m.codeSize)) {
			return out, fmt.Errorf("%w: bytecode pointer %#x outside %s", ErrStale, f.Addr, m.name)
		}
		return append(out, m.frame(bci, TierInterpreted, false)), nil
	case frameCompiled:
		return s.compiled(f.FileID, uint32(f.Addr>>32)&0x1fffffff, uint32(f.Addr), f.Addr&frameTop != 0, out)
	case frameStub:
		name, err := s.stubName(f.FileID)
		if err != nil {
			return out, err
		}
		return append(out, libpf.Frame{Kind: Kind, FunctionName: "[" + name + "]"}), nil
	}
	return out, fmt.Errorf("JVM frame of unknown type %d", f.Addr>>frameTypeShift)
}

// stubName names the code blob at addr that is not an nmethod, cached
// as methods are.
func (s *symbolizer) stubName(addr uint64) (string, error) {
	ptr, err := s.r.Ptr(addr + uint64(s.l.Blob.Name))
	s.mu.Lock()
	c, ok := s.stubs[addr]
	s.mu.Unlock()
	if err != nil {
		if ok && errors.Is(err, procmem.ErrUnreadable) {
			return c.name, nil
		}
		return "", err
	}
	if ok && c.ptr == ptr {
		return c.name, nil
	}
	name, err := s.r.CString(ptr, 128)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	if len(s.stubs) >= maxStubs {
		clear(s.stubs)
	}
	s.stubs[addr] = stubName{ptr, name}
	s.mu.Unlock()
	return name, nil
}

// frame is the frame of m at bci (-1: none), run at tier, inlined into
// the next frame or not.
func (m *method) frame(bci int64, tier string, inlined bool) libpf.Frame {
	fr := libpf.Frame{Kind: Kind, FunctionName: m.name, SystemName: m.name + m.signature, SourceFile: m.file,
		Tier: tier, Inlined: inlined}
	if line := m.line(bci); line > 0 {
		fr.SourceLine = line
	}
	return fr
}

// line is the line of bci as HotSpot finds it: an entry starting at bci,
// else the one with the largest start below it (entries are unsorted).
func (m *method) line(bci int64) uint32 {
	if bci < 0 {
		bci = 0
	}
	best, bestStart := uint32(0), int64(-1)
	for _, e := range m.lines {
		start := int64(e[0])
		if start == bci {
			return e[1]
		}
		if start < bci && start > bestStart {
			best, bestStart = e[1], start
		}
	}
	return best
}

// method reads (or finds cached) the Method at addr.
func (s *symbolizer) method(addr uint64) (*method, error) {
	ml := &s.l.Method
	cm, err := s.r.Ptr(addr + uint64(ml.ConstMethod))
	s.mu.Lock()
	m, ok := s.methods[addr]
	s.mu.Unlock()
	if err != nil {
		// The JVM exited since the sample (its last samples are named
		// after it is gone), or freed the method's memory: the frame ran
		// the method cached when it was last seen.
		if ok && errors.Is(err, procmem.ErrUnreadable) {
			return m, nil
		}
		return nil, err
	}
	if ok && m.constMethod == cm {
		return m, nil
	}
	m, err = s.readMethod(cm)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.methods) >= maxMethods {
		clear(s.methods)
	}
	s.methods[addr] = m
	s.mu.Unlock()
	return m, nil
}

func (s *symbolizer) readMethod(cm uint64) (*method, error) {
	ml := &s.l.Method
	r := s.r
	cp, err := r.Ptr(cm + uint64(ml.Constants))
	if err != nil {
		return nil, err
	}
	codeSize, err := r.U16(cm + uint64(ml.CodeSize))
	if err != nil {
		return nil, err
	}
	nameIdx, err := r.U16(cm + uint64(ml.NameIndex))
	if err != nil {
		return nil, err
	}
	holder, err := r.Ptr(cp + uint64(ml.PoolHolder))
	if err != nil {
		return nil, err
	}
	klassName, err := r.Ptr(holder + uint64(ml.KlassName))
	if err != nil {
		return nil, err
	}
	class, err := s.symbol(klassName)
	if err != nil {
		return nil, fmt.Errorf("class name: %w", err)
	}
	name, err := s.cpSymbol(cp, nameIdx)
	if err != nil {
		return nil, fmt.Errorf("method name: %w", err)
	}
	m := &method{constMethod: cm, codeSize: uint32(codeSize), name: strings.ReplaceAll(class, "/", ".") + "." + name}
	// The descriptor is a nicety: a frame is named without it.
	if sigIdx, err := r.U16(cm + uint64(ml.SignatureIndex)); err == nil {
		m.signature, _ = s.cpSymbol(cp, sigIdx)
	}
	srcBase := cp
	if ml.SourceFileInKlass {
		srcBase = holder
	}
	if idx, err := r.U16(srcBase + uint64(ml.SourceFileIndex)); err == nil && idx != 0 {
		m.file, _ = s.cpSymbol(cp, idx)
	}
	var flags uint32
	if ml.FlagsWidth == 2 {
		f, err := r.U16(cm + uint64(ml.Flags))
		if err != nil {
			return nil, err
		}
		flags = uint32(f)
	} else if flags, err = r.U32(cm + uint64(ml.Flags)); err != nil {
		return nil, err
	}
	if flags&1 != 0 { // has a line number table
		m.lines, err = s.lineTable(cm + uint64(ml.ConstMethodSize) + uint64(codeSize))
		if err != nil {
			return nil, fmt.Errorf("line number table of %s: %w", m.name, err)
		}
	}
	return m, nil
}

// cpSymbol reads the Symbol in constant pool slot idx.
func (s *symbolizer) cpSymbol(cp uint64, idx uint16) (string, error) {
	sym, err := s.r.Ptr(cp + uint64(s.l.Method.ConstantPoolSize) + 8*uint64(idx))
	if err != nil {
		return "", err
	}
	return s.symbol(sym)
}

// symbol reads a Symbol's text (modified UTF-8).
func (s *symbolizer) symbol(addr uint64) (string, error) {
	n, err := s.r.U16(addr + uint64(s.l.Method.SymbolLength))
	if err != nil {
		return "", err
	}
	if n > maxSymbolLength {
		return "", fmt.Errorf("symbol of %d bytes", n)
	}
	buf := make([]byte, n)
	if err := s.r.Read(addr+uint64(s.l.Method.SymbolBody), buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

// Package v8 unwinds and names the JavaScript frames of Node.js: V8's
// interpreted, baseline and optimized frames (the functions an optimized
// frame inlined as frames of their own), builtins and the frames between
// JavaScript and C++, from the post-mortem metadata V8 builds export, with
// default flags and no restart. internals.md beside this file gathers the
// facts about V8's objects and frames it relies on, with their sources.
package v8

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID, in id_gen.go, is RUNTIME_V8 of support/ebpf/runtimes.h.
//go:generate go run ../internal/runtimeids/generate v8

// Kind is the frame kind of V8's frames.
const Kind = libpf.FrameKind(ID)

// Runtime is V8 as the process manager drives it.
var Runtime = &interpreter.Runtime{
	Name:         "v8",
	DisplayName:  "Node.js (V8)",
	ID:           ID,
	ConfigStruct: "v8_proc",
	ConfigMirror: UnwinderProc{},
	Recognise:    recognise,
	// The builtins have no unwind tables: the unwinder takes them over
	// at the PC, where the binary maps them and where V8 copied them.
	CodeRangesAtPC: true,
	RetryMin:       100 * time.Millisecond,
	RetryMax:       30 * time.Second,
	// V8 moves and frees objects; each frame is checked against what it
	// names when it is converted, but a cached trace would not look.
	TraceRecheck: 10 * time.Second,
}

func init() { interpreter.Register(Runtime) }

// isNodeName says whether a file's name is one V8 is looked for in: the
// node executable (nodejs on Debian, nsolid) and libnode.so. Other
// embedders build V8 with pointer compression, which the unwinder does not
// read.
func isNodeName(p string) bool {
	switch base := path.Base(p); base {
	case "node", "nodejs", "nsolid":
		return true
	default:
		return strings.HasPrefix(base, "libnode.so")
	}
}

// recognise finds V8 in a node binary by its metadata.
func recognise(f *interpreter.File) (interpreter.Binary, error) {
	if !isNodeName(f.Path) {
		return nil, nil
	}
	info, err := readBinarySymbols(f.ELF, f.DynamicSymbols, f.Symbols)
	if errors.Is(err, ErrNotV8) {
		return nil, nil
	}
	if err != nil {
		return &v8Binary{err: fmt.Errorf("%s: %w", f.Path, err)}, nil
	}
	b := &v8Binary{info: info, path: f.Path}
	b.layout, b.err = NewLayout(info.md, info.Version)
	if b.err == nil {
		b.err = checkFrameSlots(b.layout)
	}
	return b, nil
}

// checkFrameSlots checks the frame slots the BPF unwinder reads at fixed
// offsets (V8_SLOT_* in support/ebpf/v8.ebpf.c).
func checkFrameSlots(l *Layout) error {
	if l.FPContext != -8 || l.FPFunction != -16 || l.FPBytecodeArray != -32 || l.FPBytecodeOffset != -40 {
		return fmt.Errorf("%w: frame slots context %d, function %d, bytecode array %d, offset %d",
			ErrLayout, l.FPContext, l.FPFunction, l.FPBytecodeArray, l.FPBytecodeOffset)
	}
	return nil
}

// v8Binary is a node binary.
type v8Binary struct {
	info   *binaryInfo
	layout *Layout
	path   string
	// err says why the binary cannot be unwound.
	err error
}

func (b *v8Binary) Version() string {
	if b.info == nil {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", b.info.Version[0], b.info.Version[1], b.info.Version[2])
}

func (b *v8Binary) Unsupported() error {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		return fmt.Errorf("V8 frames are unwound on x86_64 and arm64 only, not %s", runtime.GOARCH)
	}
	if b.err != nil {
		return fmt.Errorf("%w (node --perf-basic-prof writes /tmp/perf-PID.map, which names its JavaScript frames)", b.err)
	}
	return nil
}

// CodeRanges hands the embedded builtins to the unwinder: interpreted
// code runs in them, and the native unwinder meets them as the return
// address of the C++ a builtin calls.
func (b *v8Binary) CodeRanges() [][2]uint64 {
	if b.info == nil {
		return nil
	}
	return [][2]uint64{{b.info.BlobAddr, b.info.BlobAddr + uint64(b.info.BlobSize)}}
}

func (b *v8Binary) Attach(h interpreter.Host) (interpreter.Process, error) {
	if err := b.Unsupported(); err != nil {
		return nil, err
	}
	mem, err := h.Memory()
	if err != nil {
		return nil, err
	}
	p := &process{bin: b, bias: h.Bias(), sym: newSymbolizer(procmem.New(mem), b.layout, &b.info.BytecodeSizes)}
	if _, err := p.Update(h); err != nil {
		return nil, err
	}
	return p, nil
}

// process is a node process the unwinder was told of.
type process struct {
	bin  *v8Binary
	bias uint64
	sym  *symbolizer
	// cfg is what the BPF unwinder was last told; regions what was
	// claimed.
	cfg     UnwinderProc
	regions []interpreter.Region
	// blobCopies are where V8 copied the builtins beside isolates' JIT
	// code.
	blobCopies []uint64
}

// Update claims the process's JIT code and tells the unwinder where it
// and the builtins' copies are: V8 maps code pages as its heap grows.
func (p *process) Update(h interpreter.Host) (bool, error) {
	if p.sym == nil {
		return false, interpreter.ErrDetached
	}
	info := p.bin.info
	var jit []interpreter.Region
	var copies []uint64
	for _, m := range h.Mappings() {
		switch {
		case m.Anonymous():
			jit = append(jit, interpreter.Region{Start: m.Start, End: m.End, Unwind: true})
		case m.Path == p.bin.path && m.Start+info.BlobOffset-m.Offset != info.BlobAddr+p.bias &&
			m.Offset <= info.BlobOffset && info.BlobOffset < m.Offset+(m.End-m.Start) &&
			m.End-m.Start <= uint64(info.BlobSize)+2*pageSize && len(copies) < maxBlobs-1:
			// A mapping of the blob alone, not where the binary's text
			// maps it.
			copies = append(copies, m.Start+info.BlobOffset-m.Offset)
		}
	}
	regions := claimCodeRanges(jit, copies)
	cfg := p.unwinderProc(regions, copies)
	changed := false
	if cfg != p.cfg {
		if err := h.SetConfig(cfg); err != nil {
			return false, err
		}
		p.cfg, p.blobCopies, changed = cfg, copies, true
	}
	if !slices.Equal(regions, p.regions) {
		if err := h.SetRegions(regions); err != nil {
			return changed, err
		}
		p.regions, changed = regions, true
	}
	return changed, nil
}

// maxCodeRange bounds an isolate's code range: V8 reserves it in one
// piece, its JIT pages first and the builtins' copy at its end (512 MiB
// on x64 for Node 20, read from /proc/PID/maps).
const maxCodeRange = 1 << 30

// claimCodeRanges turns the JIT mappings into the regions claimed: where
// an isolate's code range ends with a copy of the builtins, the whole
// range from its first JIT mapping up to the copy, so that pages V8 maps
// there later are the unwinder's from their first sample.
func claimCodeRanges(jit []interpreter.Region, copies []uint64) []interpreter.Region {
	var out []interpreter.Region
	for _, r := range jit {
		// The nearest copy above: the end of this mapping's code range
		// (each isolate has its own, workers too).
		end := uint64(0)
		for _, c := range copies {
			if r.Start < c && c-r.Start <= maxCodeRange && (end == 0 || c < end) {
				end = c
			}
		}
		r.End = max(r.End, end)
		if n := len(out); n > 0 && r.Start < out[n-1].End {
			// Inside the range claimed before it.
			out[n-1].End = max(out[n-1].End, r.End)
			continue
		}
		out = append(out, r)
	}
	return out
}

const pageSize = 4096

// codeRangeGap joins JIT ranges closer than this into one range of the
// unwinder's configuration.
const codeRangeGap = 128 << 20

// unwinderProc describes the process to the BPF unwinder.
func (p *process) unwinderProc(jit []interpreter.Region, copies []uint64) UnwinderProc {
	info, l := p.bin.info, p.bin.layout
	u := UnwinderProc{
		BlobSize:         info.BlobSize,
		EntryLo:          info.EntryLo,
		EntryHi:          info.EntryHi,
		HandlersLo:       info.HandlersLo,
		HandlersHi:       info.HandlersHi,
		JSFunctionShared: uint16(l.JSFunctionShared),
		MapInstanceType:  uint16(l.MapInstanceType),
		TypeSFI:          l.TypeSFI,
		BytecodeData:     uint16(l.BytecodeArrayData),
		FrameTypes:       uint8(l.FrameTypes),
		EntryFrame:       uint8(l.FrameEntry),
		ConstructEntry:   uint8(l.FrameConstructEntry),
	}
	u.BlobLow[0] = info.BlobAddr + p.bias
	copy(u.BlobLow[1:], copies)
	n := 0
	for _, r := range jit {
		switch {
		case n > 0 && r.Start-u.CodeHigh[n-1] < codeRangeGap && r.End-u.CodeLow[n-1] <= 2*maxCodeRange:
			u.CodeHigh[n-1] = r.End
		case n < codeRanges:
			u.CodeLow[n], u.CodeHigh[n] = r.Start, r.End
			n++
		}
		// Beyond codeRanges, the mapping trie finds the code.
	}
	return u
}

func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if p.sym == nil {
		return out, interpreter.ErrDetached
	}
	return p.symbolize(f, out)
}

func (p *process) Detach() { p.sym = nil }

// codeRanges and maxBlobs are V8_CODE_RANGES and V8_BLOBS in
// support/ebpf/v8.ebpf.c.
const (
	codeRanges = 4
	maxBlobs   = 4
)

// UnwinderProc mirrors struct v8_proc in support/ebpf/v8.ebpf.c; the
// tracer checks it against the object's BTF.
type UnwinderProc struct {
	CodeLow          [codeRanges]uint64
	CodeHigh         [codeRanges]uint64
	BlobLow          [maxBlobs]uint64
	BlobSize         uint32
	EntryLo          uint32
	EntryHi          uint32
	HandlersLo       uint32
	HandlersHi       uint32
	JSFunctionShared uint16
	MapInstanceType  uint16
	TypeSFI          uint16
	BytecodeData     uint16
	FrameTypes       uint8
	EntryFrame       uint8
	ConstructEntry   uint8
	_                uint8
}

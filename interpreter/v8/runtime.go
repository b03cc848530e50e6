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
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// ID is V8's runtime id: RUNTIME_V8 in support/ebpf/runtimes.h.
const ID interpreter.ID = 6

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
	RetryMin:     100 * time.Millisecond,
	RetryMax:     30 * time.Second,
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
	info, err := readBinary(f.ELF)
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
	return fmt.Sprintf("V8 %d.%d.%d", b.info.Version[0], b.info.Version[1], b.info.Version[2])
}

func (b *v8Binary) Unsupported() error {
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("V8 frames are unwound on x86_64 only, not %s", runtime.GOARCH)
	}
	if b.err != nil {
		return fmt.Errorf("%w (node --perf-basic-prof writes /tmp/perf-PID.map, which names its JavaScript frames)", b.err)
	}
	return nil
}

// CodeRanges hands the embedded builtins to the unwinder: the native
// unwinder meets them as the return address of the C++ a builtin calls
// (they have no unwind tables).
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
	// blobCopy is where V8 copied the builtins beside its JIT code, 0 if
	// it did not.
	blobCopy uint64
}

// Update claims the process's JIT code and tells the unwinder where it
// and the builtins' copy are: V8 maps code pages as its heap grows.
func (p *process) Update(h interpreter.Host) (bool, error) {
	if p.sym == nil {
		return false, interpreter.ErrDetached
	}
	info := p.bin.info
	var regions []interpreter.Region
	blobCopy := uint64(0)
	for _, m := range h.Mappings() {
		switch {
		case m.Path == "" || strings.HasPrefix(m.Path, "[anon:"):
			regions = append(regions, interpreter.Region{Start: m.Start, End: m.End, Unwind: true})
		case m.Path == p.bin.path && m.Start+info.BlobOffset-m.Offset != info.BlobAddr+p.bias &&
			m.Offset <= info.BlobOffset && info.BlobOffset < m.Offset+(m.End-m.Start) &&
			m.End-m.Start <= uint64(info.BlobSize)+2*pageSize:
			// A mapping of the blob alone, not where the binary's text
			// maps it.
			blobCopy = m.Start + info.BlobOffset - m.Offset
		}
	}
	cfg := p.unwinderProc(regions, blobCopy)
	changed := false
	if cfg != p.cfg {
		if err := h.SetConfig(cfg); err != nil {
			return false, err
		}
		p.cfg, p.blobCopy, changed = cfg, blobCopy, true
	}
	if !sameRegions(regions, p.regions) {
		if err := h.SetRegions(regions); err != nil {
			return changed, err
		}
		p.regions, changed = regions, true
	}
	return changed, nil
}

const pageSize = 4096

// codeRangeGap joins JIT mappings closer than this into one range of the
// unwinder's configuration: an isolate's code lies in one reservation of
// at most 128 MiB (kMaximalCodeRangeSize on x64).
const codeRangeGap = 128 << 20

// unwinderProc describes the process to the BPF unwinder.
func (p *process) unwinderProc(jit []interpreter.Region, blobCopy uint64) UnwinderProc {
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
	}
	u.BlobLow[0] = info.BlobAddr + p.bias
	u.BlobLow[1] = blobCopy
	n := 0
	for _, r := range jit {
		switch {
		case n > 0 && r.Start-u.CodeHigh[n-1] < codeRangeGap && r.End-u.CodeLow[n-1] <= 2*codeRangeGap:
			u.CodeHigh[n-1] = r.End
		case n < codeRanges:
			u.CodeLow[n], u.CodeHigh[n] = r.Start, r.End
			n++
		}
		// Beyond codeRanges, the mapping trie finds the code.
	}
	return u
}

func sameRegions(a, b []interpreter.Region) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (p *process) Symbolize(f support.Frame, out []libpf.Frame) ([]libpf.Frame, error) {
	if p.sym == nil {
		return out, interpreter.ErrDetached
	}
	return p.symbolize(f, out)
}

func (p *process) Detach() { p.sym = nil }

// codeRanges is V8_CODE_RANGES in support/ebpf/v8.ebpf.c.
const codeRanges = 4

// UnwinderProc mirrors struct v8_proc in support/ebpf/v8.ebpf.c; the
// tracer checks it against the object's BTF.
type UnwinderProc struct {
	CodeLow          [codeRanges]uint64
	CodeHigh         [codeRanges]uint64
	BlobLow          [2]uint64
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
	_                [7]uint8
}

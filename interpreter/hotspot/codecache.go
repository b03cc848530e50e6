package hotspot

import (
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// maxHeaps and blobHeader are JVM_HEAPS and JVM_BLOB_HEADER in
// support/ebpf/jvm.ebpf.c.
const (
	maxHeaps   = 3
	blobHeader = 128
)

// CodeHeap is one heap of the code cache: its code [Low, High) and its
// segment map, a byte per 1 << Log2Segment bytes of code.
type CodeHeap struct {
	Low, High   uint64
	Segmap      uint64
	Log2Segment uint32
}

// CodeCache is where a JVM keeps generated code.
type CodeCache struct {
	Heaps []CodeHeap
	// Interpreter is the template interpreter's code [Low, High).
	InterpLow, InterpHigh uint64
}

// readCodeCache reads where the code cache and the interpreter are. The
// heaps are reserved when the JVM starts and never move.
func readCodeCache(r *procmem.Reader, l *Layout) (*CodeCache, error) {
	heaps, err := codeHeaps(r, l)
	if err != nil {
		return nil, err
	}
	cc := &CodeCache{}
	for i, heap := range heaps {
		if heap == 0 {
			return nil, fmt.Errorf("%w: code heap %d not made yet", interpreter.ErrStarting, i)
		}
		var h CodeHeap
		if h.Low, err = r.Ptr(heap + uint64(l.HeapMemory+l.VSLow)); err != nil {
			return nil, err
		}
		if h.High, err = r.Ptr(heap + uint64(l.HeapMemory+l.VSHigh)); err != nil {
			return nil, err
		}
		if h.Segmap, err = r.Ptr(heap + uint64(l.HeapSegmap+l.VSLow)); err != nil {
			return nil, err
		}
		if h.Log2Segment, err = r.U32(heap + uint64(l.HeapLog2Segment)); err != nil {
			return nil, err
		}
		if h.Low == 0 || h.High == 0 || h.Segmap == 0 {
			// Listed before its memory is reserved.
			return nil, fmt.Errorf("%w: code heap %d not set up yet", interpreter.ErrStarting, i)
		}
		if h.High <= h.Low || h.Log2Segment < 4 || h.Log2Segment > 16 {
			return nil, fmt.Errorf("code heap %d: [%#x, %#x), segment map %#x, segments of 2^%d bytes",
				i, h.Low, h.High, h.Segmap, h.Log2Segment)
		}
		cc.Heaps = append(cc.Heaps, h)
	}
	queue, err := r.Ptr(l.Interpreter)
	if err != nil {
		return nil, fmt.Errorf("reading AbstractInterpreter::_code: %w", err)
	}
	if queue == 0 {
		return nil, fmt.Errorf("%w: no interpreter yet", interpreter.ErrStarting)
	}
	if cc.InterpLow, err = r.Ptr(queue + uint64(l.StubBuffer)); err != nil {
		return nil, err
	}
	limit, err := r.U32(queue + uint64(l.BufferLimit))
	if err != nil {
		return nil, err
	}
	cc.InterpHigh = cc.InterpLow + uint64(limit)
	return cc, nil
}

// contStatics are the addresses of the statics that say where a virtual
// thread's frames return to when their callers are still frozen (JDK 19+).
type contStatics struct {
	barrier, returnPC uint64
}

// codeHeaps returns the addresses of the code cache's CodeHeaps.
func codeHeaps(r *procmem.Reader, l *Layout) ([]uint64, error) {
	if l.CodeCacheHeaps == 0 {
		heap, err := r.Ptr(l.CodeCacheHeap)
		if err != nil {
			return nil, fmt.Errorf("reading CodeCache::_heap: %w", err)
		}
		return []uint64{heap}, nil
	}
	arr, err := r.Ptr(l.CodeCacheHeaps)
	if err != nil {
		return nil, fmt.Errorf("reading CodeCache::_heaps: %w", err)
	}
	if arr == 0 {
		return nil, fmt.Errorf("%w: no code cache yet", interpreter.ErrStarting)
	}
	n, err := r.U32(arr + uint64(l.ArrayLen))
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no code heap yet", interpreter.ErrStarting)
	}
	if n > maxHeaps {
		return nil, fmt.Errorf("the code cache has %d heaps, want 1 to %d", n, maxHeaps)
	}
	data, err := r.Ptr(arr + uint64(l.ArrayData))
	if err != nil {
		return nil, err
	}
	heaps := make([]uint64, n)
	for i := range heaps {
		if heaps[i], err = r.Ptr(data + 8*uint64(i)); err != nil {
			return nil, err
		}
	}
	return heaps, nil
}

// UnwinderProc mirrors struct jvm_proc in support/ebpf/jvm.ebpf.c; the
// tracer checks it against the object's BTF.
type UnwinderProc struct {
	HeapLow            [maxHeaps]uint64
	HeapHigh           [maxHeaps]uint64
	HeapSegmap         [maxHeaps]uint64
	InterpLow          uint64
	InterpHigh         uint64
	BlobName           uint16
	BlobFrameSize      uint16
	BlobFrameComplete  uint16
	BlobCode           uint16
	BlobKind           uint16
	NMethodCompileID   uint16
	NMethodStubOffset  uint16
	MethodConstMethod  uint16
	ConstMethodCode    uint16
	ConstMethodSize    uint16
	Heaps              uint8
	SegmentShift       uint8
	HeapBlockSize      uint8
	FrameCompleteWidth uint8
	CodeRelative       uint8
	HasKind            uint8
	KindNmethod        uint8
	BCPSlot            uint8
	ContReturnPC       int32
	ContBarrier        uint64
}

// unwinderProc describes a JVM to the BPF unwinder; cont are the addresses
// in the process of StubRoutines::_cont_returnBarrier and
// ContinuationEntry::_return_pc, zero where unknown.
func unwinderProc(l *Layout, cc *CodeCache, cont contStatics) (UnwinderProc, error) {
	u := UnwinderProc{
		InterpLow:          cc.InterpLow,
		InterpHigh:         cc.InterpHigh,
		Heaps:              uint8(len(cc.Heaps)),
		SegmentShift:       uint8(cc.Heaps[0].Log2Segment),
		HeapBlockSize:      uint8(l.HeapBlockSize),
		FrameCompleteWidth: uint8(l.Blob.FrameCompleteWidth),
		CodeRelative:       b2u8(l.Blob.CodeRelative),
		HasKind:            b2u8(l.Blob.HasKind),
		KindNmethod:        l.Blob.KindNmethod,
		BCPSlot:            l.BCPSlot,
	}
	if d := int64(cont.returnPC - cont.barrier); cont.barrier != 0 && cont.returnPC != 0 && d == int64(int32(d)) {
		u.ContBarrier, u.ContReturnPC = cont.barrier, int32(d)
	}
	for i, h := range cc.Heaps {
		if h.Log2Segment != cc.Heaps[0].Log2Segment {
			return u, fmt.Errorf("code heaps with segments of 2^%d and 2^%d bytes", h.Log2Segment, cc.Heaps[0].Log2Segment)
		}
		u.HeapLow[i], u.HeapHigh[i], u.HeapSegmap[i] = h.Low, h.High, h.Segmap
	}
	offsets := []struct {
		dst *uint16
		v   uint32
	}{
		{&u.BlobName, l.Blob.Name}, {&u.BlobFrameSize, l.Blob.FrameSize},
		{&u.BlobFrameComplete, l.Blob.FrameComplete}, {&u.BlobCode, l.Blob.Code}, {&u.BlobKind, l.Blob.Kind},
		{&u.NMethodCompileID, l.NM.CompileID}, {&u.NMethodStubOffset, l.NM.StubOffset},
		{&u.MethodConstMethod, l.Method.ConstMethod},
		{&u.ConstMethodCode, l.Method.CodeSize}, {&u.ConstMethodSize, l.Method.ConstMethodSize},
	}
	for _, o := range offsets {
		if o.v > 0xffff {
			return u, fmt.Errorf("a field at offset %d", o.v)
		}
		*o.dst = uint16(o.v)
	}
	if l.HeapBlockSize > 0xff || (u.FrameCompleteWidth != 2 && u.FrameCompleteWidth != 4) {
		return u, fmt.Errorf("sizeof(HeapBlock) %d, _frame_complete_offset of %d bytes", l.HeapBlockSize, u.FrameCompleteWidth)
	}
	// BPF reads the blob's header in one piece of blobHeader bytes and
	// finds each field there at its offset rounded down to its width.
	codeWidth := uint32(8)
	if l.Blob.CodeRelative {
		codeWidth = 4
	}
	fields := []struct {
		name       string
		off, width uint32
		unless     bool
	}{
		{"_name", l.Blob.Name, 8, l.Blob.HasKind}, {"_frame_size", l.Blob.FrameSize, 4, false},
		{"_frame_complete_offset", l.Blob.FrameComplete, uint32(u.FrameCompleteWidth), false},
		{"code", l.Blob.Code, codeWidth, false}, {"_kind", l.Blob.Kind, 1, !l.Blob.HasKind},
	}
	for _, f := range fields {
		if !f.unless && (f.off+f.width > blobHeader || f.off%f.width != 0) {
			return u, fmt.Errorf("CodeBlob::%s at offset %d (%d bytes) is not within the first %d bytes, aligned",
				f.name, f.off, f.width, blobHeader)
		}
	}
	return u, nil
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

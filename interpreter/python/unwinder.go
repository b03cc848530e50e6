package python

// UnwinderProc mirrors struct python_proc (support/ebpf/cpython.ebpf.c):
// what the BPF CPython unwinder needs of one process, its entry in the
// runtimes' configuration map.
type UnwinderProc struct {
	TStateTLSIndex     uint64
	TStateTLSOffset    uint64
	KeyAddr            uint64
	KeyReadyAddr       uint64
	TSDSelfOffset      int64
	TSDBlockOffset     int64
	TSDDataOffset      int64
	TSDEntrySize       uint32
	TSDMaxKey          uint32
	TSDSelfDeref       uint8
	TSDBlockDeref      uint8
	FrameLayout        FrameLayout
	LastiUnit          uint8
	EntryFrameOwner    uint8
	_                  [3]uint8
	TStateFrame        uint16
	CFrameCurrentFrame uint16
	CFramePrevious     uint16
	FramePrevious      uint16
	FrameCode          uint16
	FrameInstr         uint16
	FrameOwner         uint16
	FrameIsEntry       uint16
	CodeAdaptive       uint16
	_                  [3]uint16
}

// FrameLayout mirrors enum python_frame_layout: how a CPython version
// links the frames the unwinder walks. A test checks the values against
// the BPF object.
type FrameLayout uint8

const (
	FramesObjects FrameLayout = iota + 1 // 3.6-3.10
	Frames311                            // 3.11
	Frames312                            // 3.12
	Frames313                            // 3.13+
)

package support

import (
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// PythonProc mirrors struct python_proc: what the BPF Python unwinder
// needs of one CPython process (see support/ebpf/types.h).
type PythonProc struct {
	KeyAddr            uint64
	KeyReadyAddr       uint64
	TSDSelfOffset      int64
	TSDBlockOffset     int64
	TSDDataOffset      int64
	TSDEntrySize       uint32
	TSDMaxKey          uint32
	TSDSelfDeref       uint8
	TSDBlockDeref      uint8
	FrameLayout        PythonFrameLayout
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

// PythonFrameLayout mirrors enum python_frame_layout: how a CPython
// version links the frames the unwinder walks.
type PythonFrameLayout uint8

const (
	PythonFramesObjects PythonFrameLayout = iota + 1 // 3.6-3.10
	PythonFrames311                                  // 3.11
	PythonFrames312                                  // 3.12
	PythonFrames313                                  // 3.13+
)

// checkPythonFrameLayouts makes sure the Go values are BPF's.
func checkPythonFrameLayouts(types *btf.Spec) error {
	values, err := enumValues(types, "python_frame_layout")
	if err != nil {
		return err
	}
	want := map[string]PythonFrameLayout{
		"PYTHON_FRAMES_OBJECTS": PythonFramesObjects,
		"PYTHON_FRAMES_311":     PythonFrames311,
		"PYTHON_FRAMES_312":     PythonFrames312,
		"PYTHON_FRAMES_313":     PythonFrames313,
	}
	if len(values) != len(want) {
		return fmt.Errorf("BPF enum python_frame_layout has %d values, Go %d", len(values), len(want))
	}
	for name, v := range values {
		if w, ok := want[name]; !ok || uint64(w) != v {
			return fmt.Errorf("BPF python frame layout %s=%d differs from Go", name, v)
		}
	}
	return nil
}

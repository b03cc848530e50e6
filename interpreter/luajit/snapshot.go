package luajit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A trace's snapshots say, for each guard, which frames the interpreter
// would restore if it failed: the frames of the functions the trace
// inlined at that point (internals.md §4.3; lj_jit.h SnapShot and
// SnapEntry, lj_snap.c snapshot_slots and snapshot_framelinks).

const (
	// snapshotSize is sizeof(SnapShot): mapofs u32, ref u16, mcofs u16,
	// nslots, topslot, nent, count u8.
	snapshotSize = 12
	// maxSnapshots bounds a trace's snapshots (LuaJIT's maxsnap is 500).
	maxSnapshots = 1 << 12
	// snapFrame marks a snapshot entry of a frame's link slot; snapCont a
	// continuation's.
	snapFrame = 0x10000
	snapCont  = 0x20000
	// IR opcodes of constants (the order of IRDEF, lj_ir.h).
	irKGC  = 24
	irKNUM = 28
	// refBias: IR references below it are constants.
	refBias = 0x8000
)

var errSnapshot = errors.New("luajit: snapshot not decoded")

// snapshot is a SnapShot as read.
type snapshot struct {
	mapofs uint32
	mcofs  uint16
	nent   uint8
}

// parseSnapshots reads a trace's snapshot array.
func parseSnapshots(b []byte) []snapshot {
	out := make([]snapshot, 0, len(b)/snapshotSize)
	for i := 0; i+snapshotSize <= len(b); i += snapshotSize {
		out = append(out, snapshot{
			mapofs: binary.LittleEndian.Uint32(b[i:]),
			mcofs:  binary.LittleEndian.Uint16(b[i+6:]),
			nent:   b[i+10],
		})
	}
	return out
}

// snapshotAt is the index of the snapshot whose code holds machine-code
// offset off (in MCode units): the last one starting at or before it
// (lj_trace_unwind's search), -1 if none.
func snapshotAt(snaps []snapshot, off uint64) int {
	at := -1
	for i, s := range snaps {
		if uint64(s.mcofs) <= off && (at < 0 || s.mcofs >= snaps[at].mcofs) {
			at = i
		}
	}
	return at
}

// snapFrameRef is a frame a snapshot restores, innermost first: its
// function (a GCfunc; 0 for the trace's start function) and its PC, at
// which the interpreter resumes (resume) or after the call the frame
// above it made.
type snapFrameRef struct {
	fn, pc uint64
	resume bool
}

// decodeSnapshot reads a snapshot's entries and its last word (in FR2
// mode the PC the interpreter resumes at, shifted left by 8, with the
// innermost frame's base slot less 2), constant gives the opcode and
// 64-bit value of an IR constant. Slots count from the start frame's
// function (its base is slot 2).
func decodeSnapshot(entries []uint32, pcbase uint64, constant func(ref uint32) (uint8, uint64, error)) ([]snapFrameRef, error) {
	base := uint32(pcbase&0xff) + 2
	links := map[uint32]uint32{}
	funcs := map[uint32]uint32{}
	for _, e := range entries {
		slot, ref := e>>24, e&0xffff
		switch {
		case e&snapCont != 0:
			return nil, fmt.Errorf("%w: a continuation frame", errSnapshot)
		case e&snapFrame != 0 && slot > 1:
			links[slot] = ref
		default:
			funcs[slot] = ref
		}
	}
	var slots []uint32
	for s := range links {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	slices.Reverse(slots)
	if base > 2 && (len(slots) == 0 || slots[0] != base-1) {
		return nil, fmt.Errorf("%w: no link for the frame at slot %d", errSnapshot, base)
	}
	if base == 2 && len(slots) > 0 {
		return nil, fmt.Errorf("%w: links above the innermost frame", errSnapshot)
	}
	fnAt := func(slot uint32) (uint64, error) {
		ref, ok := funcs[slot]
		if !ok {
			return 0, fmt.Errorf("%w: no function at slot %d", errSnapshot, slot)
		}
		op, v, err := constant(ref)
		if err != nil {
			return 0, err
		}
		if op != irKGC || v == 0 {
			return 0, fmt.Errorf("%w: the function at slot %d is not a constant", errSnapshot, slot)
		}
		return v, nil
	}
	frames := make([]snapFrameRef, 0, len(slots)+1)
	cur := snapFrameRef{pc: pcbase >> 8, resume: true}
	for i, s := range slots {
		fn, err := fnAt(s - 1)
		if err != nil {
			return nil, err
		}
		cur.fn = fn
		frames = append(frames, cur)
		op, link, err := constant(links[s])
		if err != nil {
			return nil, err
		}
		if op != irKNUM || link&3 != 0 || link == 0 {
			return nil, fmt.Errorf("%w: the link at slot %d is not a Lua frame's", errSnapshot, s)
		}
		if i+1 < len(slots) && slots[i+1] >= s-1 {
			return nil, fmt.Errorf("%w: overlapping frames", errSnapshot)
		}
		cur = snapFrameRef{pc: link}
	}
	// The start frame.
	return append(frames, cur), nil
}

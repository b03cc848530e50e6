package luajit

import "debug/elf"

// Layout is where a LuaJIT build keeps what the unwinder reads: byte
// offsets of struct fields and sizes (internals.md §9). GC64 with two-slot
// frames (LJ_FR2) is assumed: both Debian architectures build it.
type Layout struct {
	// GGState: the VM instance, one allocation holding the main
	// lua_State, global_State, jit_State and the dispatch table (the x64
	// VM's DISPATCH register points at it).
	GGState struct{ G, J, Dispatch uint32 }
	Global  struct{ VMState, CurL, JITBase uint32 }
	State   struct{ GlRef, Base, MaxStack, Stack, CFrame uint32 }
	JIT     struct{ Trace, SizeTrace, MCArea uint32 }
	Trace   struct{ NSnap, IR, NK, Snap, SnapMap, StartPt, StartPC, SzMCode, MCode, SpAdjust, TraceNo, Size uint32 }
	// MCodeUnit is the size of an MCode unit, in which snapshots give
	// their machine-code offsets: a byte on x86_64, an instruction on
	// arm64 (lj_target.h).
	MCodeUnit uint32
	// Proto: GCproto, which the bytecode follows (Size bytes after it).
	Proto struct{ SizeBC, K, ChunkName, FirstLine, NumLine, LineInfo, Size uint32 }
	Func  struct{ FFID, PC uint32 }
	// Str: GCstr, whose characters follow its header (Size bytes).
	Str struct{ Len, Size uint32 }
	// CFrame: the VM's C frame (its stack pointer is lua_State.cframe).
	CFrame struct{ L, PC, Prev, Size, SizeJIT uint32 }
}

// openresty21 is OpenResty's LuaJIT 2.1 as Debian's trixie
// (2.1.0+openresty20250117) and sid (2.1.0+openresty20251030) build it,
// for x86_64 and arm64: the offsets of their headers, identical in both
// releases, which the VM's code confirms (Layout.accesses).
func openresty21(m elf.Machine) *Layout {
	l := &Layout{}
	l.GGState.G, l.GGState.J = 0x70, 0x358
	l.Global.VMState, l.Global.CurL, l.Global.JITBase = 0xb8, 0x170, 0x178
	l.State.GlRef, l.State.Base, l.State.MaxStack, l.State.Stack, l.State.CFrame = 0x10, 0x20, 0x30, 0x38, 0x50
	l.Trace.NSnap, l.Trace.IR, l.Trace.NK, l.Trace.Snap, l.Trace.SnapMap = 0xa, 0x20, 0x28, 0x30, 0x38
	l.Trace.StartPt, l.Trace.StartPC, l.Trace.SzMCode, l.Trace.MCode = 0x40, 0x48, 0x54, 0x58
	l.Trace.SpAdjust, l.Trace.TraceNo, l.Trace.Size = 0x66, 0x68, 0x78
	l.Proto.SizeBC, l.Proto.K, l.Proto.ChunkName = 0xc, 0x20, 0x40
	l.Proto.FirstLine, l.Proto.NumLine, l.Proto.LineInfo, l.Proto.Size = 0x48, 0x4c, 0x50, 0x68
	l.Func.FFID, l.Func.PC = 0xa, 0x20
	l.Str.Len, l.Str.Size = 0x14, 0x18
	switch m {
	case elf.EM_X86_64:
		l.GGState.Dispatch = 0x1020
		l.MCodeUnit = 1
		l.JIT.Trace, l.JIT.SizeTrace, l.JIT.MCArea = 0x180, 0x18c, 0xbe8
		l.CFrame.L, l.CFrame.PC, l.CFrame.Prev, l.CFrame.Size, l.CFrame.SizeJIT = 0x10, 0x18, 0x20, 0x50, 0x60
	case elf.EM_AARCH64:
		l.GGState.Dispatch = 0x1008
		l.MCodeUnit = 4
		l.JIT.Trace, l.JIT.SizeTrace, l.JIT.MCArea = 0x168, 0x174, 0xbd0
		l.CFrame.L, l.CFrame.PC, l.CFrame.Prev, l.CFrame.Size, l.CFrame.SizeJIT = 0x10, 0x08, 0x00, 0xd0, 0xd0
	default:
		return nil
	}
	return l
}

// knownReleases are the rolling releases (.relver) whose layout is known:
// OpenResty's v2.1-20250117 and v2.1-20251030.
var knownReleases = []uint64{1737090214, 1761786044}

// knownLayouts are the layouts a build of release for machine may have:
// none for a release, fork or architecture we have not checked.
func knownLayouts(m elf.Machine, release uint64, openResty bool) []*Layout {
	if !openResty {
		// Upstream LuaJIT's lua_State lacks OpenResty's exdata fields:
		// its GG_State offsets differ (internals.md §7).
		return nil
	}
	for _, r := range knownReleases {
		if r == release {
			if l := openresty21(m); l != nil {
				return []*Layout{l}
			}
		}
	}
	return nil
}

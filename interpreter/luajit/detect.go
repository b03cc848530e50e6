// Package luajit will unwind LuaJIT 2.1 stacks (OpenResty's fork, as
// Debian builds it). This part reads what a luajit executable or a
// libluajit-5.1.so says of itself: its version, where its VM (the
// interpreter, the VM's subroutines and lj_vm_ffi_call) is, and whether
// the VM's code addresses the global, JIT and frame state at the offsets of
// a layout we know. Debian's builds are stripped and export no VM symbol,
// so the VM is found by its unwind entry and its code; internals.md says
// what each step rests on.
package luajit

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"golang.org/x/arch/x86/x86asm"
)

// ErrNotLuaJIT says a file holds no LuaJIT VM.
var ErrNotLuaJIT = errors.New("not a LuaJIT VM")

// Binary is what a luajit executable or libluajit says of itself;
// addresses are the file's virtual addresses.
type Binary struct {
	// Release is LuaJIT's rolling release number, the Unix time of the
	// commit (.relver): "LuaJIT 2.1.<Release>".
	Release uint64
	// OpenResty is set when the file is OpenResty's fork (it exports
	// recff_thread_exdata), whose lua_State is larger than upstream's.
	OpenResty bool
	// VM is the code buildvm generates, [start, end): the bytecode
	// handlers and the VM's subroutines, up to lj_vm_ffi_call.
	VM [2]uint64
	// FFICall is lj_vm_ffi_call, which calls C functions for the FFI
	// outside compiled code, [start, end).
	FFICall [2]uint64
	// Machine is the file's architecture.
	Machine elf.Machine
	// Layout is the struct layout of this build, nil if none is known.
	Layout *Layout
	// Matches counts, for each access of Layout's fields the detection
	// looks for, how often the VM's code makes it: all are > 0 when
	// Layout is set.
	Matches map[string]int
}

// Version is "2.1.<Release>", as jit.version states it.
func (b *Binary) Version() string { return fmt.Sprintf("2.1.%d", b.Release) }

// Unsupported says why processes of this binary cannot be unwound: no
// layout is known for its release, fork and architecture, or its code
// does not use the known one.
func (b *Binary) Unsupported() error {
	if b.Layout != nil {
		return nil
	}
	fork := "LuaJIT"
	if b.OpenResty {
		fork = "OpenResty LuaJIT"
	}
	return fmt.Errorf("%s %s: no struct layout known for this release (%v)", fork, b.Version(), b.Matches)
}

// versionPrefix starts the version string in .rodata (LUAJIT_VERSION).
var versionPrefix = []byte("LuaJIT 2.1.")

// Detect reads f. ErrNotLuaJIT when f has no LuaJIT VM; a Binary whose
// Unsupported is non-nil when it has one we cannot unwind.
func Detect(f *interpreter.File) (*Binary, error) {
	if !hasSymbol(f.DynamicSymbols, "luaJIT_setmode") {
		return nil, ErrNotLuaJIT
	}
	b := &Binary{OpenResty: hasSymbol(f.DynamicSymbols, "recff_thread_exdata"), Machine: f.ELF.Machine}
	var err error
	if b.Release, err = release(f.ELF); err != nil {
		return nil, err
	}
	if f.FunctionRanges == nil {
		return nil, errors.New("luajit: no unwind entries to find the VM by")
	}
	fdes, err := f.FunctionRanges()
	if err != nil {
		return nil, fmt.Errorf("luajit: reading unwind entries: %w", err)
	}
	cands := vmCandidates(fdes)
	if len(cands) == 0 {
		return nil, fmt.Errorf("luajit %s: no unwind entry of the VM found", b.Version())
	}
	// Without a known layout the VM cannot be told apart by its code:
	// Unsupported says so.
	layouts := knownLayouts(f.ELF.Machine, b.Release, b.OpenResty)
	var best map[string]int
	for _, cand := range cands {
		if err := b.check(f.ELF, cand, layouts, &best); err != nil {
			return nil, err
		}
		if b.Layout != nil {
			return b, nil
		}
	}
	b.Matches = best
	return b, nil
}

// check takes VM candidate c[0] (with lj_vm_ffi_call c[1] after it) and
// its layout if its code makes every access of one of layouts; last keeps
// the counts of the candidate and layout that came closest.
func (b *Binary) check(f *elf.File, c [2][2]uint64, layouts []*Layout, last *map[string]int) error {
	code, err := interpreter.ReadELF(f, c[0][0], c[0][1]-c[0][0])
	if err != nil {
		return fmt.Errorf("luajit: reading code at %#x: %w", c[0][0], err)
	}
	if uint64(len(code)) != c[0][1]-c[0][0] {
		return nil
	}
	for _, l := range layouts {
		m := l.accesses(f.Machine, code)
		if *last == nil || total(m) > total(*last) {
			*last = m
		}
		if allFound(m) {
			b.Layout, b.Matches, b.VM, b.FFICall = l, m, c[0], c[1]
			return nil
		}
	}
	return nil
}

// vmCandidates are the FDE ranges the VM's may be: large enough (the VM
// is over 14 KB in every build), with an FDE directly after it (buildvm
// emits the VM's and lj_vm_ffi_call's back to back), largest first.
func vmCandidates(fdes [][2]uint64) [][2][2]uint64 {
	const minVM = 8 << 10
	var c [][2][2]uint64
	for i := 0; i+1 < len(fdes); i++ {
		if fdes[i][1]-fdes[i][0] >= minVM && fdes[i+1][0] == fdes[i][1] {
			c = append(c, [2][2]uint64{fdes[i], fdes[i+1]})
		}
	}
	slices.SortFunc(c, func(a, b [2][2]uint64) int {
		return int(int64(b[0][1]-b[0][0]) - int64(a[0][1]-a[0][0]))
	})
	return c
}

// release reads the rolling release number from the version string in
// .rodata.
func release(f *elf.File) (uint64, error) {
	sec := f.Section(".rodata")
	if sec == nil {
		return 0, errors.New("luajit: no .rodata")
	}
	data, err := sec.Data()
	if err != nil {
		return 0, fmt.Errorf("luajit: reading .rodata: %w", err)
	}
	for rest := data; ; {
		i := bytes.Index(rest, versionPrefix)
		if i < 0 {
			return 0, errors.New("luajit: no \"LuaJIT 2.1.N\" version string")
		}
		rest = rest[i+len(versionPrefix):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n > 0 && n < len(rest) && rest[n] == 0 {
			return strconv.ParseUint(string(rest[:n]), 10, 64)
		}
	}
}

func hasSymbol(syms []elf.Symbol, name string) bool {
	return slices.ContainsFunc(syms, func(s elf.Symbol) bool {
		return s.Name == name && s.Section != elf.SHN_UNDEF
	})
}

func total(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

func allFound(m map[string]int) bool {
	for _, v := range m {
		if v == 0 {
			return false
		}
	}
	return len(m) > 0
}

// accesses counts, in the VM's code, the instructions that reach this
// layout's fields the way vm_x64.dasc and vm_arm64.dasc do (internals.md
// §2.1, §3.3, §4.1): through DISPATCH (r14) or GL (x22), the C frame at
// the stack pointer, and the prototype before the bytecode.
func (l *Layout) accesses(m elf.Machine, code []byte) map[string]int {
	switch m {
	case elf.EM_X86_64:
		return l.accessesAMD64(code)
	case elf.EM_AARCH64:
		return l.accessesARM64(code)
	}
	return nil
}

func (l *Layout) accessesAMD64(code []byte) map[string]int {
	g := int64(l.GGState.G) - int64(l.GGState.Dispatch)
	j := int64(l.GGState.J) - int64(l.GGState.Dispatch)
	want := map[string]func(x86asm.Inst) bool{
		// set_vmstate INTERP: mov dword [DISPATCH+vmstate], -1.
		"vmstate=INTERP": func(i x86asm.Inst) bool {
			imm, ok := i.Args[1].(x86asm.Imm)
			return isMem(i.Args[0], x86asm.R14, g+int64(l.Global.VMState)) && ok && int32(imm) == -1
		},
		"load cur_L": func(i x86asm.Inst) bool {
			return isMem(i.Args[1], x86asm.R14, g+int64(l.Global.CurL))
		},
		// BC_JLOOP: mov [DISPATCH+jit_base], BASE (rdx).
		"jit_base=BASE": func(i x86asm.Inst) bool {
			return isMem(i.Args[0], x86asm.R14, g+int64(l.Global.JITBase)) && i.Args[1] == x86asm.RDX
		},
		"load J->trace": func(i x86asm.Inst) bool {
			return isMem(i.Args[1], x86asm.R14, j+int64(l.JIT.Trace))
		},
		// savePC: mov SAVE_PC, PC (rbx).
		"SAVE_PC=PC": func(i x86asm.Inst) bool {
			return isMem(i.Args[0], x86asm.RSP, int64(l.CFrame.PC)) && i.Args[1] == x86asm.RBX
		},
		// mov KBASE (r15), [reg+PC2PROTO(k)]: k's offset from the bytecode.
		"load proto k": func(i x86asm.Inst) bool {
			return i.Args[0] == x86asm.R15 && isMemDisp(i.Args[1], int64(l.Proto.K)-int64(l.Proto.Size))
		},
	}
	counts := make(map[string]int, len(want))
	for k := range want {
		counts[k] = 0
	}
	for off := 0; off < len(code); {
		inst, err := interpreter.DecodeAMD64(code[off:])
		if err != nil || inst.Len == 0 {
			off++
			continue
		}
		off += inst.Len
		if inst.Op != x86asm.MOV {
			continue
		}
		for k, match := range want {
			if match(inst) {
				counts[k]++
			}
		}
	}
	return counts
}

func isMem(a x86asm.Arg, base x86asm.Reg, disp int64) bool {
	m, ok := a.(x86asm.Mem)
	return ok && m.Base == base && m.Index == 0 && m.Disp == disp
}

func isMemDisp(a x86asm.Arg, disp int64) bool {
	m, ok := a.(x86asm.Mem)
	return ok && m.Index == 0 && m.Disp == disp
}

// A64 register numbers of the VM's fixed registers (vm_arm64.dasc).
const (
	a64Base  = 19
	a64KBase = 20
	a64PC    = 21
	a64GL    = 22
	a64SP    = 31
)

func (l *Layout) accessesARM64(code []byte) map[string]int {
	g := func(off uint32) uint32 { return off }
	j := func(off uint32) uint32 { return l.GGState.J - l.GGState.G + off }
	want := map[string]func(uint32) bool{
		// st_vmstate: str wN, GL->vmstate.
		"store vmstate": func(w uint32) bool { return isLdSt(w, 0xb9000000, 4, a64GL, -1, g(l.Global.VMState)) },
		"load cur_L":    func(w uint32) bool { return isLdSt(w, 0xf9400000, 8, a64GL, -1, g(l.Global.CurL)) },
		// BC_JLOOP: str BASE, GL->jit_base.
		"jit_base=BASE": func(w uint32) bool { return isLdSt(w, 0xf9000000, 8, a64GL, a64Base, g(l.Global.JITBase)) },
		"load J->trace": func(w uint32) bool { return isLdSt(w, 0xf9400000, 8, a64GL, -1, j(l.JIT.Trace)) },
		// str PC, SAVE_PC.
		"SAVE_PC=PC": func(w uint32) bool { return isLdSt(w, 0xf9000000, 8, a64SP, a64PC, l.CFrame.PC) },
		// ldur KBASE, [reg, #PC2PROTO(k)].
		"load proto k": func(w uint32) bool {
			return w&0xffe00c00 == 0xf8400000 && int(w&31) == a64KBase &&
				int64(int32(w<<11)>>23) == int64(l.Proto.K)-int64(l.Proto.Size)
		},
	}
	counts := make(map[string]int, len(want))
	for k := range want {
		counts[k] = 0
	}
	for off := 0; off+4 <= len(code); off += 4 {
		w := binary.LittleEndian.Uint32(code[off:])
		for k, match := range want {
			if match(w) {
				counts[k]++
			}
		}
	}
	return counts
}

// isLdSt says whether w is the A64 load or store op (LDR/STR, unsigned
// scaled immediate; op carries the size and opc bits) of register rt (-1:
// any) at [rn, #off].
func isLdSt(w, op uint32, scale uint32, rn, rt int, off uint32) bool {
	if w&0xffc00000 != op || int(w>>5&31) != rn || (rt >= 0 && int(w&31) != rt) {
		return false
	}
	return (w>>10&0xfff)*scale == off
}

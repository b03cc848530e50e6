// Package beam holds what the BEAM (Erlang/OTP JIT) unwinder knows of a
// beam.smp executable. So far: finding the emulator's module ranges table
// and active code index in a stripped build (internals.md §4).
package beam

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"

	"golang.org/x/arch/arm64/arm64asm"
	"golang.org/x/arch/x86/x86asm"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Tables are the addresses (file virtual addresses) of the two variables
// that map a JIT code address to its module: the ranges table `r`
// (ERTS_NUM_CODE_IX = 3 records of struct ranges, beam_ranges.c) and the
// u32 `the_active_code_index` (code_ix.c) that selects one.
type Tables struct {
	Ranges          uint64
	ActiveCodeIndex uint64
}

// Layout of struct ranges and Range (beam_ranges.c), the same in OTP 27
// and 29 (internals.md §4).
const (
	rangesSize      = 32 // {Range *modules; Sint n; Sint allocated; atomic mid}
	rangesNOffset   = 8
	rangesMidOffset = 0x18
	rangeSizeShift  = 4 // sizeof(Range) = 16
	rangesSizeShift = 5 // sizeof(struct ranges) = 32
	numCodeIx       = 3
)

// ErrNoTables says the signature of the inlined find_range was not found
// exactly once.
var ErrNoTables = errors.New("beam: ranges table not found")

// FindTables finds the ranges table and the active code index in f's code:
// the function find_range (beam_ranges.c, inlined into its callers on
// x86_64) is the only code that scales the active code index by
// sizeof(struct ranges) (shift 5), adds the table's address, then loads n
// (+8) and mid (+0x18) and scales n by sizeof(Range) (shift 4). Both
// addresses must lie in .bss and every match must agree.
func FindTables(f *elf.File) (Tables, error) {
	text := f.Section(".text")
	bss := f.Section(".bss")
	if text == nil || bss == nil {
		return Tables{}, fmt.Errorf("beam: no .text or .bss section")
	}
	code, err := text.Data()
	if err != nil {
		return Tables{}, fmt.Errorf("beam: reading .text: %w", err)
	}
	inBSS := func(a uint64) bool { return a >= bss.Addr && a < bss.Addr+bss.Size }
	var found []Tables
	switch f.Machine {
	case elf.EM_X86_64:
		found = findX86(code, text.Addr)
	case elf.EM_AARCH64:
		found, err = findARM64(f, code, text.Addr)
		if err != nil {
			return Tables{}, err
		}
	default:
		return Tables{}, fmt.Errorf("beam: unsupported machine %v", f.Machine)
	}
	var t Tables
	for _, c := range found {
		if !inBSS(c.Ranges) || !inBSS(c.ActiveCodeIndex) {
			continue
		}
		if t != (Tables{}) && t != c {
			return Tables{}, fmt.Errorf("%w: two candidates, %#x/%#x and %#x/%#x", ErrNoTables,
				t.Ranges, t.ActiveCodeIndex, c.Ranges, c.ActiveCodeIndex)
		}
		t = c
	}
	if t == (Tables{}) {
		return Tables{}, ErrNoTables
	}
	if t.ActiveCodeIndex >= t.Ranges && t.ActiveCodeIndex < t.Ranges+numCodeIx*rangesSize {
		return Tables{}, fmt.Errorf("%w: active code index %#x inside the table at %#x", ErrNoTables, t.ActiveCodeIndex, t.Ranges)
	}
	return t, nil
}

// x86 window: how many instructions before the shift by 5 the two
// RIP-relative operands may be, and after it the loads and the shift by 4.
const (
	x86Before = 6
	x86After  = 8
)

type x86Inst struct {
	pc   uint64
	inst x86asm.Inst
}

// ripTarget is the address a RIP-relative memory operand of in (at pc)
// names, if arg is one.
func ripTarget(pc uint64, in x86asm.Inst, arg x86asm.Arg) (uint64, bool) {
	m, ok := arg.(x86asm.Mem)
	if !ok || m.Base != x86asm.RIP || m.Index != 0 {
		return 0, false
	}
	return pc + uint64(in.Len) + uint64(m.Disp), true
}

func isShiftBy(in x86asm.Inst, n uint64) bool {
	if in.Op != x86asm.SHL {
		return false
	}
	r, ok := in.Args[0].(x86asm.Reg)
	imm, ok2 := in.Args[1].(x86asm.Imm)
	return ok && ok2 && r >= x86asm.RAX && r <= x86asm.R15 && uint64(imm) == n
}

func loadsDisp(in x86asm.Inst, disp int64) bool {
	if in.Op != x86asm.MOV {
		return false
	}
	m, ok := in.Args[1].(x86asm.Mem)
	return ok && m.Base != x86asm.RIP && m.Disp == disp
}

// findX86 decodes code linearly (undecodable bytes are skipped one at a
// time) and returns every match of the signature.
func findX86(code []byte, base uint64) []Tables {
	var out []Tables
	var win []x86Inst
	for off := 0; off < len(code); {
		in, err := interpreter.DecodeAMD64(code[off:])
		if err != nil || in.Len == 0 {
			off++
			continue
		}
		win = append(win, x86Inst{base + uint64(off), in})
		off += in.Len
		// Look at the instruction x86After places back: its successors
		// are decoded by now.
		i := len(win) - 1 - x86After
		if i >= 0 && isShiftBy(win[i].inst, rangesSizeShift) {
			if t, ok := matchX86(win, i); ok {
				out = append(out, t)
			}
		}
		if len(win) > 4*(x86Before+x86After) {
			win = append(win[:0], win[len(win)-(x86Before+x86After+1):]...)
		}
	}
	return out
}

func matchX86(win []x86Inst, i int) (Tables, bool) {
	var t Tables
	for _, w := range win[max(0, i-x86Before):i] {
		switch w.inst.Op {
		case x86asm.MOV:
			// mov r32, [rip+A]: the active code index (a u32).
			if r, ok := w.inst.Args[0].(x86asm.Reg); ok && r >= x86asm.EAX && r <= x86asm.R15L {
				if a, ok := ripTarget(w.pc, w.inst, w.inst.Args[1]); ok {
					t.ActiveCodeIndex = a
				}
			}
		case x86asm.LEA:
			if a, ok := ripTarget(w.pc, w.inst, w.inst.Args[1]); ok {
				t.Ranges = a
			}
		}
	}
	var n, mid, shift4 bool
	for _, w := range win[i+1 : i+1+x86After] {
		n = n || loadsDisp(w.inst, rangesNOffset)
		mid = mid || loadsDisp(w.inst, rangesMidOffset)
		shift4 = shift4 || isShiftBy(w.inst, rangeSizeShift)
	}
	return t, t.Ranges != 0 && t.ActiveCodeIndex != 0 && n && mid && shift4
}

// arm64 window, in instructions.
const (
	armBefore = 6
	armAfter  = 10
)

// findARM64 matches `ubfiz Xd, Xn, #5, #32` (index * 32) with, before it,
// the table's adrp+add and the index's adrp+ldr (of the u32 itself, or of
// its GOT slot, then ldr w), and after it a load at #8 and an add with
// lsl #4.
func findARM64(f *elf.File, code []byte, base uint64) ([]Tables, error) {
	insts := make([]arm64asm.Inst, len(code)/4)
	ok := make([]bool, len(insts))
	for i := range insts {
		in, err := arm64asm.Decode(code[4*i : 4*i+4])
		if err == nil {
			insts[i], ok[i] = in, true
		}
	}
	got, err := gotSlots(f)
	if err != nil {
		return nil, err
	}
	var out []Tables
	for i, in := range insts {
		if !ok[i] || in.Op != arm64asm.UBFIZ || in.Args[2] == nil || in.Args[2].String() != "#5" || in.Args[3].String() != "#32" {
			continue
		}
		pc := func(j int) uint64 { return base + 4*uint64(j) }
		pages := map[arm64asm.Reg]uint64{}
		ptrs := map[arm64asm.Reg]uint64{} // registers holding a GOT slot's value
		var t Tables
		for j := max(0, i-armBefore); j < min(len(insts), i+armAfter); j++ {
			if !ok[j] {
				continue
			}
			w := insts[j]
			switch w.Op {
			case arm64asm.ADRP:
				if r, isReg := w.Args[0].(arm64asm.Reg); isReg {
					if rel, isRel := w.Args[1].(arm64asm.PCRel); isRel {
						pages[r] = uint64(int64(pc(j)&^0xfff) + int64(rel))
						delete(ptrs, r)
					}
				}
			case arm64asm.ADD:
				// add Xd, Xs, #imm (the low 12 bits of an adrp'd page).
				d, dOK := w.Args[0].(arm64asm.RegSP)
				s, sOK := w.Args[1].(arm64asm.RegSP)
				imm, iOK := w.Args[2].(arm64asm.ImmShift)
				if dOK && sOK && iOK {
					if p, known := pages[arm64asm.Reg(s)]; known {
						if v, ok := immValue(imm); ok {
							t.Ranges = p + v
						}
					}
					delete(pages, arm64asm.Reg(d))
				}
			case arm64asm.LDR:
				d, dOK := w.Args[0].(arm64asm.Reg)
				m, mOK := w.Args[1].(arm64asm.MemImmediate)
				if !dOK || !mOK {
					continue
				}
				baseReg := arm64asm.Reg(m.Base)
				off := memOffset(m)
				isW := d >= arm64asm.W0 && d <= arm64asm.W30
				p, paged := pages[baseReg]
				v, viaGOT := ptrs[baseReg]
				delete(pages, d)
				delete(ptrs, d)
				switch {
				case paged && isW:
					// ldr Wd, [Xpage, #lo]: the u32 itself.
					t.ActiveCodeIndex = p + uint64(off)
				case paged:
					// ldr Xd, [Xpage, #lo]: a GOT slot, its address.
					if a, isGOT := got[p+uint64(off)]; isGOT {
						ptrs[d] = a
					}
				case viaGOT && isW && off == 0:
					t.ActiveCodeIndex = v
				}
			}
		}
		if t.Ranges == 0 || t.ActiveCodeIndex == 0 {
			continue
		}
		var n, shift4 bool
		for j := i + 1; j < min(len(insts), i+armAfter); j++ {
			s := insts[j].String()
			n = n || (insts[j].Op == arm64asm.LDR && bytes.HasSuffix([]byte(s), []byte(",#8]")))
			shift4 = shift4 || (insts[j].Op == arm64asm.ADD && bytes.HasSuffix([]byte(s), []byte(", LSL #4")))
		}
		if n && shift4 {
			out = append(out, t)
		}
	}
	return out, nil
}

var immRE = regexp.MustCompile(`^#(0x[0-9a-f]+|[0-9]+)$`)

// immValue is the value of an unshifted add immediate.
func immValue(imm arm64asm.ImmShift) (uint64, bool) {
	m := immRE.FindStringSubmatch(imm.String())
	if m == nil {
		return 0, false
	}
	var v uint64
	if _, err := fmt.Sscan(m[1], &v); err != nil {
		return 0, false
	}
	return v, true
}

var memOffRE = regexp.MustCompile(`^\[X\d+(?:,#(-?\d+))?\]$`)

// memOffset is the unsigned-offset addressing mode's offset ([Xn,#imm]).
func memOffset(m arm64asm.MemImmediate) int64 {
	s := m.String()
	sm := memOffRE.FindStringSubmatch(s)
	if sm == nil || sm[1] == "" {
		return 0
	}
	var v int64
	fmt.Sscan(sm[1], &v)
	return v
}

// gotSlots maps each 8-byte slot the dynamic relocations fill to the
// address it will hold: R_AARCH64_RELATIVE's addend, or a defined dynamic
// symbol's value for GLOB_DAT/ABS64.
func gotSlots(f *elf.File) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	rela := f.Section(".rela.dyn")
	if rela == nil {
		return out, nil
	}
	data, err := rela.Data()
	if err != nil {
		return nil, fmt.Errorf("beam: reading .rela.dyn: %w", err)
	}
	syms, _ := f.DynamicSymbols()
	for off := 0; off+24 <= len(data); off += 24 {
		where := binary.LittleEndian.Uint64(data[off:])
		info := binary.LittleEndian.Uint64(data[off+8:])
		addend := binary.LittleEndian.Uint64(data[off+16:])
		switch elf.R_AARCH64(info & 0xffffffff) {
		case elf.R_AARCH64_RELATIVE:
			out[where] = addend
		case elf.R_AARCH64_GLOB_DAT, elf.R_AARCH64_ABS64:
			if s := int(info >> 32); s >= 1 && s <= len(syms) && syms[s-1].Value != 0 {
				out[where] = syms[s-1].Value + addend
			}
		}
	}
	return out, nil
}

var ertsDirRE = regexp.MustCompile(`^erts-(\d+)\.(\d+)(?:\.\d+)*$`)

// ERTSVersion returns the ERTS version a beam.smp's path names
// (".../erts-17.1.1/bin/beam.smp" -> "17.1.1"), as Debian and OTP's own
// install lay it out.
func ERTSVersion(path string) (string, error) {
	dir := filepath.Base(filepath.Dir(filepath.Dir(path)))
	if !ertsDirRE.MatchString(dir) {
		return "", fmt.Errorf("beam: %s is not under an erts-X.Y directory", path)
	}
	return dir[len("erts-"):], nil
}

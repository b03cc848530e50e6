// Package a64 decodes the few A64 (arm64) instructions that the runtimes'
// detection reads in a binary's code: branches, ADRP, ADD and LDR with an
// immediate, BLR, CMP and MRS of the thread pointer. The fields are decoded
// from the words as the Arm Architecture Reference Manual's A64 encodings
// give them: golang.org/x/arch's arm64asm keeps the immediates unexported.
package a64

import (
	"debug/elf"
	"encoding/binary"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Inst is one A64 instruction word at PC.
type Inst struct {
	Word uint32
	PC   uint64
}

// Ret is RET (to x30).
const Ret = 0xd65f03c0

// Rd is the destination register field (bits 0-4).
func (i Inst) Rd() int { return int(i.Word & 31) }

// Rn is the first source register field (bits 5-9).
func (i Inst) Rn() int { return int(i.Word >> 5 & 31) }

// Branch returns the target of B (link false) or BL (link true).
func (i Inst) Branch() (target uint64, link, ok bool) {
	switch i.Word >> 26 {
	case 0x05:
	case 0x25:
		link = true
	default:
		return 0, false, false
	}
	return i.PC + uint64(int64(int32(i.Word<<6)>>6)*4), link, true
}

// ADRP returns the page ADRP Xd, page loads.
func (i Inst) ADRP() (uint64, bool) {
	if i.Word&0x9f000000 != 0x90000000 {
		return 0, false
	}
	imm := int64(int32((i.Word>>5&0x7ffff)<<2|i.Word>>29&3) << 11 >> 11)
	return i.PC&^0xfff + uint64(imm<<12), true
}

// LDRImm returns the offset of LDR Xt|Wt, [Xn, #imm] (unsigned offset)
// and whether it loads 64 bits.
func (i Inst) LDRImm() (off uint64, wide, ok bool) {
	switch i.Word & 0xffc00000 {
	case 0xf9400000:
		return uint64(i.Word>>10&0xfff) * 8, true, true
	case 0xb9400000:
		return uint64(i.Word>>10&0xfff) * 4, false, true
	}
	return 0, false, false
}

// ADDImm returns the immediate of ADD Xd, Xn, #imm, unshifted only.
func (i Inst) ADDImm() (uint64, bool) {
	if i.Word&0xffc00000 != 0x91000000 {
		return 0, false
	}
	return uint64(i.Word >> 10 & 0xfff), true
}

// ADDImmShifted returns the immediate of ADD Xd, Xn, #imm, with its
// optional LSL #12 applied.
func (i Inst) ADDImmShifted() (uint64, bool) {
	switch i.Word & 0xffc00000 {
	case 0x91000000:
		return uint64(i.Word >> 10 & 0xfff), true
	case 0x91400000:
		return uint64(i.Word>>10&0xfff) << 12, true
	}
	return 0, false
}

// BLR says whether the word is BLR Xn.
func (i Inst) BLR() bool { return i.Word&0xfffffc1f == 0xd63f0000 }

// CmpW returns the registers CMP Wn, Wm (SUBS WZR, Wn, Wm) compares.
func (i Inst) CmpW() (n, m int, ok bool) {
	if i.Word&0xff20001f != 0x6b00001f {
		return 0, 0, false
	}
	return i.Rn(), int(i.Word >> 16 & 31), true
}

// MRSThreadPointer says whether the word is MRS Xt, TPIDR_EL0 (the
// thread pointer), and which register Xt is.
func (i Inst) MRSThreadPointer() (rt int, ok bool) {
	// MRS with o0=1, op1=3, CRn=13, CRm=0, op2=2.
	if i.Word&^31 != 0xd53bd040 {
		return 0, false
	}
	return i.Rd(), true
}

// Code reads up to n bytes of f's code at the file virtual address addr as
// instructions.
func Code(f *elf.File, addr, n uint64) ([]Inst, error) {
	b, err := interpreter.ReadELF(f, addr, n)
	if err != nil {
		return nil, err
	}
	out := make([]Inst, 0, len(b)/4)
	for i := 0; i+4 <= len(b); i += 4 {
		out = append(out, Inst{binary.LittleEndian.Uint32(b[i:]), addr + uint64(i)})
	}
	return out, nil
}

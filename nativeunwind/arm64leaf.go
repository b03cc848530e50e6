package nativeunwind

import (
	"debug/elf"

	"golang.org/x/arch/arm64/arm64asm"
)

// maxLeafScan bounds the code markFramelessLeaves decodes (the arm64
// vDSO's text is about 2.5 KiB).
const maxLeafScan = 64 << 10

// markFramelessLeaves gives the frameless leaf functions of an arm64 file
// without any CFI the rule of their code: the return address stays in
// the link register and the stack pointer where the caller left it. The
// arm64 vDSO is such a file (Debian's 6.12 has no .eh_frame): walked by
// its frame pointer instead, clock_gettime's frame would take the record
// of libc's caller, dropping that caller and setting the stack pointer
// 16 bytes above its frame record, short of a larger frame's top, so
// the next return address read was a saved frame pointer.
func markFramelessLeaves(f *elf.File, d Deltas) Deltas {
	if f.Machine != elf.EM_AARCH64 || f.Section(".eh_frame") != nil || f.Section(".debug_frame") != nil {
		return d
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return d
	}
	scanned := 0
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Size == 0 || s.Size%4 != 0 {
			continue
		}
		if scanned += int(s.Size); scanned > maxLeafScan {
			break
		}
		if r, _ := d.Lookup(s.Value); r.CFA != CFAUnknown {
			continue // marked already (a signal trampoline)
		}
		code := make([]byte, s.Size)
		if !readCode(f, s.Value, code) || !framelessLeaf(code) {
			continue
		}
		// RASigned: the function may sign the link register first
		// (6.1's vDSO starts with paciasp); stripping an unsigned user
		// address leaves it as it was.
		d = overlay(d, s.Value, s.Value+s.Size, func(Rule) Rule { return Rule{CFA: CFASP, RASigned: true} })
	}
	return d
}

// readCode reads the code at virtual address addr from f's sections.
func readCode(f *elf.File, addr uint64, code []byte) bool {
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_PROGBITS || sec.Flags&elf.SHF_EXECINSTR == 0 ||
			addr < sec.Addr || addr+uint64(len(code)) > sec.Addr+sec.Size {
			continue
		}
		_, err := sec.ReadAt(code, int64(addr-sec.Addr))
		return err == nil
	}
	return false
}

// framelessLeaf says whether arm64 code calls nothing and leaves the
// stack pointer, the frame pointer and the link register alone: no
// branch with link, no write to sp (as a destination or a base written
// back), no use of x29 or x30 but to return. A word the decoder does not
// know counts against it.
func framelessLeaf(code []byte) bool {
	sp := arm64asm.RegSP(arm64asm.SP)
	for off := 0; off+4 <= len(code); off += 4 {
		inst, err := arm64asm.Decode(code[off : off+4])
		if err != nil {
			return false
		}
		switch inst.Op {
		case arm64asm.BL, arm64asm.BLR: // the PAC forms do not decode
			return false
		case arm64asm.CMP, arm64asm.CMN, arm64asm.TST, arm64asm.RET:
			continue // sp or x30 only read
		}
		for i, a := range inst.Args {
			switch a := a.(type) {
			case arm64asm.RegSP:
				if (i == 0 && a == sp) || a == arm64asm.RegSP(arm64asm.X29) || a == arm64asm.RegSP(arm64asm.X30) {
					return false
				}
			case arm64asm.Reg:
				if a == arm64asm.X29 || a == arm64asm.X30 {
					return false
				}
			case arm64asm.MemImmediate:
				if a.Base == sp && (a.Mode == arm64asm.AddrPreIndex || a.Mode == arm64asm.AddrPostIndex) {
					return false
				}
			}
		}
	}
	return true
}

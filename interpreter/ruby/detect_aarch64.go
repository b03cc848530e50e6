package ruby

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// The arm64 side of Detect (internals.md §12): the same facts found in
// A64 code. The fields of the few instructions read are decoded from the
// words (Arm ARM, A64 encodings): golang.org/x/arch's arm64asm keeps the
// immediates unexported.

// a64 is one A64 instruction word at pc.
type a64 struct {
	w  uint32
	pc uint64
}

func (i a64) rd() int { return int(i.w & 31) }
func (i a64) rn() int { return int(i.w >> 5 & 31) }

// branch returns the target of B (link false) or BL (link true).
func (i a64) branch() (target uint64, link, ok bool) {
	switch i.w >> 26 {
	case 0x05:
	case 0x25:
		link = true
	default:
		return 0, false, false
	}
	return i.pc + uint64(int64(int32(i.w<<6)>>6)*4), link, true
}

// adrp returns the page ADRP Xd, page loads.
func (i a64) adrp() (uint64, bool) {
	if i.w&0x9f000000 != 0x90000000 {
		return 0, false
	}
	imm := int64(int32((i.w>>5&0x7ffff)<<2|i.w>>29&3) << 11 >> 11)
	return i.pc&^0xfff + uint64(imm<<12), true
}

// ldrImm returns the offset of LDR Xt|Wt, [Xn, #imm] (unsigned offset)
// and whether it loads 64 bits.
func (i a64) ldrImm() (off uint64, wide, ok bool) {
	switch i.w & 0xffc00000 {
	case 0xf9400000:
		return uint64(i.w>>10&0xfff) * 8, true, true
	case 0xb9400000:
		return uint64(i.w>>10&0xfff) * 4, false, true
	}
	return 0, false, false
}

// addImm returns the immediate of ADD Xd, Xn, #imm (unshifted).
func (i a64) addImm() (uint64, bool) {
	if i.w&0xffc00000 != 0x91000000 {
		return 0, false
	}
	return uint64(i.w >> 10 & 0xfff), true
}

// blr says whether the word is BLR Xn.
func (i a64) blr() bool { return i.w&0xfffffc1f == 0xd63f0000 }

// cmpW returns the registers CMP Wn, Wm (SUBS WZR, Wn, Wm) compares.
func (i a64) cmpW() (n, m int, ok bool) {
	if i.w&0xff20001f != 0x6b00001f {
		return 0, 0, false
	}
	return i.rn(), int(i.w >> 16 & 31), true
}

const a64Ret = 0xd65f03c0

// a64Code reads up to n bytes of code at addr as instructions.
func a64Code(f *elf.File, addr, n uint64) ([]a64, error) {
	b, err := interpreter.ReadELF(f, addr, n)
	if err != nil {
		return nil, err
	}
	out := make([]a64, 0, len(b)/4)
	for i := 0; i+4 <= len(b); i += 4 {
		out = append(out, a64{binary.LittleEndian.Uint32(b[i:]), addr + uint64(i)})
	}
	return out, nil
}

// findCallersARM64 finds the functions with a BL to target (A64's fixed
// width leaves no instruction boundary to confirm; a tail B from the
// boot-time table stub is not a call).
func findCallersARM64(f *elf.File, target uint64, ranges [][2]uint64) ([][2]uint64, error) {
	var out [][2]uint64
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		code, err := a64Code(f, p.Vaddr&^3, p.Filesz)
		if err != nil {
			return nil, err
		}
		for _, in := range code {
			if to, link, ok := in.branch(); !ok || !link || to != target {
				continue
			}
			r := interpreter.FunctionAt(ranges, in.pc)
			if r < 0 || slices.Contains(out, ranges[r]) {
				continue
			}
			if out = append(out, ranges[r]); len(out) > maxCallers {
				return nil, fmt.Errorf("more than %d functions call %#x", maxCallers, target)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no function calls %#x", target)
	}
	return out, nil
}

// findTLSDescriptor finds the TLS descriptor through which
// rb_thread_current (3.1), or the function it calls first (rb_current_ec,
// 3.3+), reads ruby_current_ec: "adrp xA, page; ldr xB, [xA, #lo]; add x0,
// xA, #lo; blr xB" (TLSDESC, internals.md §12.4). The variable's offset in
// the module's block is the descriptor's R_AARCH64_TLSDESC relocation's.
func findTLSDescriptor(f *elf.File, fn elf.Symbol, dynsym []elf.Symbol) (desc, offset uint64, err error) {
	start, name := fn.Value, fn.Name
	for hop := 0; hop < 2 && desc == 0; hop++ {
		code, err := a64Code(f, start, min(max(fn.Size, 16), 512))
		if err != nil {
			return 0, 0, err
		}
		var callee uint64
		pages := map[int]uint64{}  // registers holding an ADRP page
		loaded := map[int]uint64{} // registers loaded from page+lo: that address
		arg := uint64(0)           // x0 as page+lo
		for _, in := range code {
			if in.w == a64Ret {
				break
			}
			if to, link, ok := in.branch(); ok {
				if link && callee == 0 {
					callee = to
				}
				continue
			}
			if page, ok := in.adrp(); ok {
				pages[in.rd()] = page
				continue
			}
			if off, wide, ok := in.ldrImm(); ok {
				if page, ok := pages[in.rn()]; ok && wide {
					loaded[in.rd()] = page + off
				}
				continue
			}
			if imm, ok := in.addImm(); ok && in.rd() == 0 {
				if page, ok := pages[in.rn()]; ok {
					arg = page + imm
				}
				continue
			}
			if in.blr() && arg != 0 && loaded[in.rn()] == arg {
				desc = arg
				break
			}
		}
		if desc == 0 {
			if callee == 0 {
				break
			}
			start, name = callee, fmt.Sprintf("%s's callee at %#x", fn.Name, callee)
		}
	}
	if desc == 0 {
		return 0, 0, fmt.Errorf("%s calls no TLS descriptor (adrp; ldr; add x0; blr)", name)
	}
	off, ok, err := relocationAt(f, desc, uint32(elf.R_AARCH64_TLSDESC), dynsym)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return 0, 0, fmt.Errorf("no R_AARCH64_TLSDESC relocation at the TLS descriptor %#x", desc)
	}
	return desc, off, nil
}

// findGlobalSymbolsARM64 finds ruby_global_symbols from rb_id2str, or the
// function it branches to first (get_id_serial_entry): the first 32-bit
// load from an ADRP page that a CMP Wn, Wm then reads is last_id, the
// table's first field (internals.md §12.5). 64-bit loads from pages are
// GOT entries.
func findGlobalSymbolsARM64(f *elf.File, fn elf.Symbol, ranges [][2]uint64) (uint64, error) {
	start := fn.Value
	for hop := 0; hop < 2; hop++ {
		size := uint64(512)
		for _, r := range ranges {
			if r[0] <= start && start < r[1] {
				size = min(r[1]-start, 4096)
			}
		}
		code, err := a64Code(f, start, size)
		if err != nil {
			return 0, err
		}
		var callee uint64
		pages := map[int]uint64{}
		for i, in := range code {
			if to, _, ok := in.branch(); ok {
				if callee == 0 {
					callee = to
				}
				continue
			}
			if page, ok := in.adrp(); ok {
				pages[in.rd()] = page
				continue
			}
			off, wide, ok := in.ldrImm()
			page, fromPage := pages[in.rn()]
			if !ok || wide || !fromPage {
				continue
			}
			// Compared within the next few instructions.
			for _, next := range code[i+1 : min(i+6, len(code))] {
				if n, m, ok := next.cmpW(); ok && (n == in.rd() || m == in.rd()) {
					return page + off, nil
				}
			}
		}
		if callee == 0 {
			break
		}
		start = callee
	}
	return 0, fmt.Errorf("no comparison with the table's last_id in %s or its callee", fn.Name)
}

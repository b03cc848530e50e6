package libc

import "encoding/binary"

// An arm64 decoder of the few instructions pthread_getspecific's fast path
// uses (Arm ARM, A64 encodings): mrs tpidr_el0, add/sub/cmp (immediate,
// shifted and extended register), mov (orr, movz, movn), ubfm (lsl, ubfiz, uxtw),
// ldr/ldur of 64 bits, b, b.cond, cbz/cbnz, ret and hints (nop, bti,
// pac*). glibc 2.36:
//
//	mov w1, w0; cmp w0, #0x1f; b.hi slow; ubfiz x0, x1, #4, #32
//	mrs x2, tpidr_el0; sub x0, x0, #0x630; add x2, x2, x0
//	ldr x0, [x2, #8]; cbz x0, ...
//
// glibc 2.41 (Debian 13) loads the block's offset as a constant first:
//
//	bti c; mov w1, w0; cmp w0, #0x1f; b.hi slow; mov x0, #-0x610
//	mrs x2, tpidr_el0; add x0, x0, w1, uxtw #4; add x2, x2, x0
//	ldr x0, [x2, #8]; cbz x0, ...

const (
	a64ZR = 31 // xzr or sp, by instruction
	a64X0 = 0
)

// decodeGetspecificARM64 decodes an arm64 pthread_getspecific whose first
// instruction is code[0].
func decodeGetspecificARM64(code []byte) (TSDLayout, error) {
	var regs [32]tsdVal
	regs[a64X0] = tsdKeyArg()
	return tsdRun(code, regs[:], func(m *tsdMachine, pc int) (int, int, bool, error) {
		if pc+4 > len(code) {
			return 0, 0, false, tsdErr(pc, "code ends")
		}
		next, done, err := a64Exec(m, &regs, binary.LittleEndian.Uint32(code[pc:]), pc)
		return next, pc + 4, done, err
	})
}

func a64Bits(w uint32, lo, n uint) uint32 { return w >> lo & (1<<n - 1) }

// a64SignExtend sign-extends the n-bit field v.
func a64SignExtend(v uint32, n uint) int64 { return int64(int32(v<<(32-n))) >> (32 - n) }

// a64Exec runs the instruction w at pc; it returns the next pc, or done
// when w tests or returns the key's value.
func a64Exec(m *tsdMachine, regs *[32]tsdVal, w uint32, pc int) (int, bool, error) {
	next, rd, sf := pc+4, int(w&31), w>>31 == 1
	switch {
	case w&0xfffff01f == 0xd503201f: // hint: nop, bti, paciasp, ...
		return next, false, nil
	case w&0xffffffe0 == 0xd53bd040: // mrs xt, tpidr_el0
		if rd != a64ZR {
			regs[rd] = tsdThreadPointer()
		}
		return next, false, nil
	case w == 0xd65f03c0: // ret
		if m.final == nil || m.final.reg != a64X0 {
			return 0, false, tsdErr(pc, "returns without reading the key's value")
		}
		return 0, true, nil
	case w&0xfc000000 == 0x14000000: // b
		if m.final != nil {
			return 0, false, tsdErr(pc, "jump before the key's value is used")
		}
		return pc + int(a64SignExtend(a64Bits(w, 0, 26), 26)*4), false, nil
	case w&0xff000010 == 0x54000000: // b.cond
		taken, err := m.branch(pc, a64Cond(w&0xf))
		if taken {
			return pc + int(a64SignExtend(a64Bits(w, 5, 19), 19)*4), false, err
		}
		return next, false, err
	case w&0x7e000000 == 0x34000000: // cbz, cbnz
		if m.final != nil && rd == m.final.reg && sf {
			return 0, true, nil
		}
		return 0, false, tsdErr(pc, "cbz/cbnz on something other than the key's value")
	}
	return next, false, a64Data(m, regs, w, pc)
}

// a64Data runs an instruction that moves or computes data.
func a64Data(m *tsdMachine, regs *[32]tsdVal, w uint32, pc int) error {
	rd, rn, rm := int(w&31), int(w>>5&31), int(w>>16&31)
	sf := w>>31 == 1
	zr := func(r int) tsdVal { // register 31 reads as zero
		if r == a64ZR {
			return tsdConst(0)
		}
		return regs[r]
	}
	sp := func(r int) tsdVal { // register 31 is sp, which the machine does not follow
		if r == a64ZR {
			return tsdVal{}
		}
		return regs[r]
	}
	set := func(r int, v tsdVal) {
		if !sf {
			v = tsdTrunc32(v)
		}
		if r != a64ZR {
			regs[r] = v
		}
	}
	switch {
	case w&0x1f800000 == 0x11000000: // add/sub (immediate), cmp
		imm := int64(a64Bits(w, 10, 12)) << (12 * a64Bits(w, 22, 1))
		sub, flags := w>>30&1 == 1, w>>29&1 == 1
		if sub && flags && rd == a64ZR {
			m.cmp(sp(rn), imm, !sf)
			return nil
		}
		if sub {
			imm = -imm
		}
		if flags {
			m.flagsKey = false
		}
		set(rd, tsdAdd(sp(rn), tsdConst(imm)))
		return nil
	case w&0x1f200000 == 0x0b000000: // add/sub (shifted register)
		if a64Bits(w, 22, 2) != 0 {
			return tsdErr(pc, "add/sub with a shift other than lsl")
		}
		return a64AddSub(m, w, zr(rn), tsdShl(zr(rm), int(a64Bits(w, 10, 6))), set)
	case w&0x1fe00000 == 0x0b200000: // add/sub (extended register)
		ext, shift := a64Bits(w, 13, 3), int(a64Bits(w, 10, 3))
		v := zr(rm)
		switch ext {
		case 2: // uxtw
			v = tsdTrunc32(v)
		case 3: // uxtx, lsl
		default:
			return tsdErr(pc, "add/sub with extend %d", ext)
		}
		return a64AddSub(m, w, sp(rn), tsdShl(v, shift), set)
	case w&0x1f800000 == 0x12800000: // move wide: movn, movz
		imm := int64(a64Bits(w, 5, 16)) << (16 * a64Bits(w, 21, 2))
		switch w >> 29 & 3 {
		case 0: // movn
			set(rd, tsdConst(^imm))
		case 2: // movz
			set(rd, tsdConst(imm))
		default:
			return tsdErr(pc, "movk")
		}
		return nil
	case w&0x7f200000 == 0x2a000000: // orr (shifted register)
		if rn != a64ZR || a64Bits(w, 10, 6) != 0 || a64Bits(w, 22, 2) != 0 {
			return tsdErr(pc, "orr other than mov")
		}
		set(rd, zr(rm))
		return nil
	case w&0x7f800000 == 0x53000000: // ubfm: lsl, lsr, ubfiz, ubfx, uxtw
		if sf != (w>>22&1 == 1) {
			return tsdErr(pc, "ubfm with N != sf")
		}
		set(rd, a64UBFM(zr(rn), sf, int(a64Bits(w, 16, 6)), int(a64Bits(w, 10, 6))))
		return nil
	case w&0xffc00000 == 0xf9400000: // ldr xt, [xn, #imm]
		return a64Load(m, regs, pc, rd, tsdAdd(sp(rn), tsdConst(int64(a64Bits(w, 10, 12))*8)))
	case w&0xffe00c00 == 0xf8400000: // ldur xt, [xn, #simm]
		return a64Load(m, regs, pc, rd, tsdAdd(sp(rn), tsdConst(a64SignExtend(a64Bits(w, 12, 9), 9))))
	case w&0xffe00c00 == 0xf8600800: // ldr xt, [xn, xm/wm{, ext #3}]
		v := zr(rm)
		switch ext := a64Bits(w, 13, 3); ext {
		case 2: // uxtw
			v = tsdTrunc32(v)
		case 3: // lsl
		default:
			return tsdErr(pc, "register offset with extend %d", ext)
		}
		return a64Load(m, regs, pc, rd, tsdAdd(sp(rn), tsdShl(v, 3*int(a64Bits(w, 12, 1)))))
	}
	return tsdErr(pc, "instruction %#08x", w)
}

func a64AddSub(m *tsdMachine, w uint32, a, b tsdVal, set func(int, tsdVal)) error {
	sub, flags := w>>30&1 == 1, w>>29&1 == 1
	if flags {
		m.flagsKey = false
	}
	if sub {
		b = tsdNeg(b)
	}
	set(int(w&31), tsdAdd(a, b))
	return nil
}

// a64UBFM is ubfm: where imms < immr it inserts bits [0, imms] at
// regsize-immr (lsl, ubfiz), else it extracts bits [immr, imms] (lsr, ubfx,
// uxtw), which the machine follows only as a zero-extension of 32 bits.
func a64UBFM(v tsdVal, sf bool, immr, imms int) tsdVal {
	size := 32
	if sf {
		size = 64
	}
	if immr >= size || imms >= size {
		return tsdVal{}
	}
	if imms >= immr {
		if immr == 0 && imms == 31 {
			return tsdTrunc32(v)
		}
		return tsdVal{}
	}
	shift, width := size-immr, imms+1
	switch {
	case width+shift == size: // lsl
		return tsdShl(v, shift)
	case width == 32: // zero-extends the 32-bit key
		return tsdShl(tsdTrunc32(v), shift)
	case width > 32 && !v.dirty:
		return tsdShl(v, shift)
	}
	return tsdVal{}
}

func a64Load(m *tsdMachine, regs *[32]tsdVal, pc, rt int, addr tsdVal) error {
	v, err := m.load(pc, addr, rt, true)
	if rt != a64ZR {
		regs[rt] = v
	}
	return err
}

// a64Cond maps the condition of b.cond to the unsigned compares a bound
// check uses; 0 for the others.
func a64Cond(c uint32) tsdBranch {
	switch c {
	case 0x8:
		return tsdAbove // hi
	case 0x2:
		return tsdAboveEq // hs
	case 0x9:
		return tsdBelowEq // ls
	case 0x3:
		return tsdBelow // lo
	}
	return 0
}

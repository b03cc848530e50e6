package libc

import "encoding/binary"

// An x86_64 decoder of the few instructions pthread_getspecific's fast
// path uses (Intel SDM vol. 2): mov, add, sub, cmp, shl, lea, test, jcc,
// jmp, ret, nops and endbr64, with ModRM/SIB operands and the %fs segment
// (whose base is the thread pointer). glibc 2.36:
//
//	cmp $0x1f,%edi; ja slow; mov %edi,%eax; add $0x31,%rax; shl $4,%rax
//	add %fs:0x10,%rax; mov 0x8(%rax),%rdx; test %rdx,%rdx
//
// musl 1.2.3: mov %fs:0,%rax; mov 0x80(%rax),%rax; mov %edi,%edi
// mov (%rax,%rdi,8),%rax; ret.

const (
	x86RAX = 0
	x86RSP = 4
	x86RDI = 7
	x86RIP = 16 // a base register meaning RIP-relative
	x86Nil = -1
)

// x86Operand is a ModRM operand: a register, or memory at base + index*scale
// + disp (+ the thread pointer with %fs).
type x86Operand struct {
	isReg       bool
	reg         int
	base, index int // x86Nil if absent
	scale       int // log2
	disp        int64
}

type x86Insn struct {
	n      int // length
	fs     bool
	rex    byte
	op     byte // the opcode byte; 0x0f-prefixed ones are op2
	op2    byte
	reg    int // ModRM.reg, with REX.R
	rm     x86Operand
	imm    int64
	target int // branch target
}

func (in *x86Insn) wide() bool { return in.rex&8 != 0 }

// decodeGetspecificAMD64 decodes an x86_64 pthread_getspecific whose first
// instruction is code[0].
func decodeGetspecificAMD64(code []byte) (TSDLayout, error) {
	var regs [16]tsdVal
	regs[x86RDI] = tsdKeyArg()
	return tsdRun(code, regs[:], func(m *tsdMachine, pc int) (int, int, bool, error) {
		in, err := x86Decode(code, pc)
		if err != nil {
			return 0, 0, false, err
		}
		next, done, err := x86Exec(m, &regs, &in, pc)
		return next, pc + in.n, done, err
	})
}

// x86Exec runs one instruction; it returns the next pc, or done when the
// instruction tests or returns the key's value.
func x86Exec(m *tsdMachine, regs *[16]tsdVal, in *x86Insn, pc int) (int, bool, error) {
	next := pc + in.n
	switch in.op {
	case 0x90, 0xf3: // nop, endbr64
		return next, false, nil
	case 0x0f:
		if in.op2 == 0x1f { // nop r/m
			return next, false, nil
		}
		if in.op2 < 0x80 || in.op2 > 0x8f {
			return 0, false, tsdErr(pc, "opcode 0x0f %#x", in.op2)
		}
		taken, err := m.branch(pc, x86Cond(in.op2&0xf))
		return x86Jump(in, next, taken), false, err
	case 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7c, 0x7d, 0x7e, 0x7f:
		taken, err := m.branch(pc, x86Cond(in.op&0xf))
		return x86Jump(in, next, taken), false, err
	case 0xeb, 0xe9:
		if m.final != nil {
			return 0, false, tsdErr(pc, "jump before the key's value is used")
		}
		return in.target, false, nil
	case 0xc3:
		if m.final == nil || m.final.reg != x86RAX {
			return 0, false, tsdErr(pc, "returns without reading the key's value")
		}
		return 0, true, nil
	case 0x85: // test r/m, reg
		if m.final != nil && in.rm.isReg && in.rm.reg == m.final.reg && in.reg == m.final.reg && in.wide() {
			return 0, true, nil
		}
		m.flagsKey = false
		return next, false, nil
	}
	return next, false, x86Data(m, regs, in, pc)
}

// x86Data runs an instruction that moves or computes data.
func x86Data(m *tsdMachine, regs *[16]tsdVal, in *x86Insn, pc int) error {
	set := func(r int, v tsdVal) {
		if !in.wide() {
			v = tsdTrunc32(v)
		}
		regs[r] = v
	}
	rmValue := func() (tsdVal, error) { // a register or a load
		if in.rm.isReg {
			return regs[in.rm.reg], nil
		}
		return m.load(pc, x86Address(regs, in), in.reg, in.wide())
	}
	switch in.op {
	case 0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf: // mov $imm32, reg
		set(in.reg, tsdConst(in.imm))
		return nil
	case 0x89: // mov reg, r/m
		if !in.rm.isReg {
			return tsdErr(pc, "store")
		}
		set(in.rm.reg, regs[in.reg])
		return nil
	case 0x8b: // mov r/m, reg
		v, err := rmValue()
		if err != nil {
			return err
		}
		if in.rm.isReg {
			set(in.reg, v)
		} else {
			regs[in.reg] = v // m.load knows the width
		}
		return nil
	case 0x8d: // lea
		set(in.reg, x86Address(regs, in))
		return nil
	case 0x01: // add reg, r/m
		if !in.rm.isReg {
			return tsdErr(pc, "store")
		}
		m.flagsKey = false
		set(in.rm.reg, tsdAdd(regs[in.rm.reg], regs[in.reg]))
		return nil
	case 0x03: // add r/m, reg
		v, err := rmValue()
		if err != nil {
			return err
		}
		if v.base == tsdData {
			return tsdErr(pc, "arithmetic on the key's value")
		}
		m.flagsKey = false
		set(in.reg, tsdAdd(regs[in.reg], v))
		return nil
	case 0x05: // add $imm32, %eax/%rax
		in.rm = x86Operand{isReg: true, reg: x86RAX}
		return x86Group1(m, regs, in, pc, 0)
	case 0x3d: // cmp $imm32, %eax/%rax
		in.rm = x86Operand{isReg: true, reg: x86RAX}
		return x86Group1(m, regs, in, pc, 7)
	case 0x81, 0x83:
		if !in.rm.isReg {
			return tsdErr(pc, "arithmetic on memory")
		}
		return x86Group1(m, regs, in, pc, in.reg&7)
	case 0xc1:
		if !in.rm.isReg || in.reg&7 != 4 {
			return tsdErr(pc, "shift other than shl $imm, reg")
		}
		m.flagsKey = false
		set(in.rm.reg, tsdShl(regs[in.rm.reg], int(in.imm)))
		return nil
	}
	return tsdErr(pc, "opcode %#x", in.op)
}

// x86Group1 runs add (0), sub (5) or cmp (7) of an immediate to a register.
func x86Group1(m *tsdMachine, regs *[16]tsdVal, in *x86Insn, pc, digit int) error {
	r := in.rm.reg
	switch digit {
	case 0, 5:
		imm := in.imm
		if digit == 5 {
			imm = -imm
		}
		m.flagsKey = false
		v := tsdAdd(regs[r], tsdConst(imm))
		if !in.wide() {
			v = tsdTrunc32(v)
		}
		regs[r] = v
		return nil
	case 7:
		m.cmp(regs[r], in.imm, !in.wide())
		return nil
	}
	return tsdErr(pc, "immediate operation /%d", digit)
}

func x86Jump(in *x86Insn, next int, taken bool) int {
	if taken {
		return in.target
	}
	return next
}

// x86Cond maps the condition nibble of jcc to the unsigned compares a bound
// check uses; 0 for the others.
func x86Cond(c byte) tsdBranch {
	switch c {
	case 0x7:
		return tsdAbove
	case 0x3:
		return tsdAboveEq
	case 0x6:
		return tsdBelowEq
	case 0x2:
		return tsdBelow
	}
	return 0
}

// x86Address is the address a memory operand names; unknown if RIP-relative
// (a fixed address in the library).
func x86Address(regs *[16]tsdVal, in *x86Insn) tsdVal {
	o := in.rm
	if o.base == x86RIP {
		return tsdVal{}
	}
	v := tsdConst(o.disp)
	if o.base != x86Nil {
		v = tsdAdd(v, regs[o.base])
	}
	if o.index != x86Nil {
		v = tsdAdd(v, tsdShl(regs[o.index], o.scale))
	}
	if in.fs {
		v = tsdAdd(v, tsdThreadPointer())
	}
	return v
}

// x86Decode decodes the instruction at code[pc:], or fails on anything
// outside the subset above.
func x86Decode(code []byte, pc int) (x86Insn, error) {
	in := x86Insn{rm: x86Operand{base: x86Nil, index: x86Nil}}
	p := pc
	byteAt := func(i int) (byte, error) {
		if i >= len(code) {
			return 0, tsdErr(pc, "code ends inside an instruction")
		}
		return code[i], nil
	}
	var opsize, rep, cs bool
prefixes:
	for {
		b, err := byteAt(p)
		if err != nil {
			return in, err
		}
		switch b {
		case 0x64:
			in.fs = true
		case 0x66:
			opsize = true
		case 0xf3:
			rep = true
		case 0x2e:
			cs = true
		default:
			break prefixes
		}
		p++
	}
	if b, _ := byteAt(p); b >= 0x40 && b <= 0x4f {
		in.rex = b
		p++
	}
	op, err := byteAt(p)
	if err != nil {
		return in, err
	}
	in.op = op
	p++
	if rep { // only endbr64: f3 0f 1e fa
		if in.rex != 0 || opsize || cs || in.fs || op != 0x0f || p+2 > len(code) || code[p] != 0x1e || code[p+1] != 0xfa {
			return in, tsdErr(pc, "rep prefix")
		}
		in.op, in.n = 0xf3, p+2-pc
		return in, nil
	}
	if op == 0x0f {
		if in.op2, err = byteAt(p); err != nil {
			return in, err
		}
		p++
	}
	if (opsize || cs) && !(op == 0x0f && in.op2 == 0x1f) && !(op == 0x90 && !cs) {
		return in, tsdErr(pc, "operand-size or cs prefix outside a nop")
	}
	if in.fs && !x86HasModRM(op, in.op2) {
		return in, tsdErr(pc, "%%fs prefix without a memory operand")
	}
	var immSize int
	switch {
	case op == 0x0f && in.op2 >= 0x80 && in.op2 <= 0x8f, op == 0xe9:
		immSize = 4
	case op >= 0x70 && op <= 0x7f, op == 0xeb, op == 0x83, op == 0xc1:
		immSize = 1
	case op == 0x81, op == 0x05, op == 0x3d, op >= 0xb8 && op <= 0xbf:
		immSize = 4
	}
	if op >= 0xb8 && op <= 0xbf {
		if in.rex&8 != 0 {
			return in, tsdErr(pc, "movabs")
		}
		in.reg = int(op-0xb8) | int(in.rex&1)<<3
	}
	if x86HasModRM(op, in.op2) {
		n, err := x86DecodeModRM(code, p, pc, &in)
		if err != nil {
			return in, err
		}
		p += n
	}
	if p+immSize > len(code) {
		return in, tsdErr(pc, "code ends inside an instruction")
	}
	switch immSize {
	case 1:
		in.imm = int64(int8(code[p]))
	case 4:
		in.imm = int64(int32(binary.LittleEndian.Uint32(code[p:])))
	}
	p += immSize
	in.n = p - pc
	if x86IsBranch(op, in.op2) {
		in.target = p + int(in.imm)
	}
	if op == 0x90 && in.rex&1 != 0 {
		return in, tsdErr(pc, "xchg")
	}
	return in, nil
}

func x86IsBranch(op, op2 byte) bool {
	return (op >= 0x70 && op <= 0x7f) || op == 0xeb || op == 0xe9 || (op == 0x0f && op2 >= 0x80 && op2 <= 0x8f)
}

func x86HasModRM(op, op2 byte) bool {
	switch op {
	case 0x01, 0x03, 0x81, 0x83, 0x85, 0x89, 0x8b, 0x8d, 0xc1:
		return true
	case 0x0f:
		return op2 == 0x1f
	}
	return false
}

// x86DecodeModRM decodes the ModRM byte at code[p] and what follows it
// (SIB, displacement) into in.reg and in.rm; it returns their length.
func x86DecodeModRM(code []byte, p, pc int, in *x86Insn) (int, error) {
	if p >= len(code) {
		return 0, tsdErr(pc, "code ends inside an instruction")
	}
	b := code[p]
	mod, rm := b>>6, int(b&7)
	in.reg = int(b>>3&7) | int(in.rex>>2&1)<<3
	rexB, rexX := int(in.rex&1)<<3, int(in.rex>>1&1)<<3
	n := 1
	if mod == 3 {
		in.rm = x86Operand{isReg: true, reg: rm | rexB}
		if in.fs {
			return 0, tsdErr(pc, "%%fs prefix on a register operand")
		}
		return n, nil
	}
	o := x86Operand{base: x86Nil, index: x86Nil}
	dispSize := 0
	switch mod {
	case 1:
		dispSize = 1
	case 2:
		dispSize = 4
	}
	switch {
	case rm == 4:
		if p+n >= len(code) {
			return 0, tsdErr(pc, "code ends inside an instruction")
		}
		sib := code[p+n]
		n++
		o.scale = int(sib >> 6)
		if idx := int(sib>>3&7) | rexX; idx != x86RSP {
			o.index = idx
		}
		if base := int(sib & 7); base == 5 && mod == 0 {
			dispSize = 4
		} else {
			o.base = base | rexB
		}
	case rm == 5 && mod == 0:
		o.base, dispSize = x86RIP, 4
	default:
		o.base = rm | rexB
	}
	if p+n+dispSize > len(code) {
		return 0, tsdErr(pc, "code ends inside an instruction")
	}
	switch dispSize {
	case 1:
		o.disp = int64(int8(code[p+n]))
	case 4:
		o.disp = int64(int32(binary.LittleEndian.Uint32(code[p+n:])))
	}
	in.rm = o
	return n + dispSize, nil
}

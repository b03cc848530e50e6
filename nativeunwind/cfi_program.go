package nativeunwind

import (
	"math"
	"math/bits"
)

// ruleKind is the DWARF register rule kind (DWARF 5 §6.4.1).
type ruleKind uint8

const (
	ruleUnset     ruleKind = iota // no instruction mentioned the register
	ruleUndefined                 // DW_CFA_undefined: not recoverable
	ruleSame                      // DW_CFA_same_value
	ruleOffset                    // saved at CFA+offset
	ruleValOffset                 // value is CFA+offset
	ruleRegister                  // saved in another register
	ruleExpr                      // saved at the address an expression computes
	ruleValExpr                   // value is what an expression computes
)

type regRule struct {
	kind   ruleKind
	offset int64  // ruleOffset, ruleValOffset
	reg    uint64 // ruleRegister
	expr   []byte // ruleExpr, ruleValExpr (points into the section)
}

// frameState is one row of the CFA table, reduced to what stack deltas
// need: the CFA and the rules of the frame pointer and return address.
type frameState struct {
	cfaReg    uint64
	cfaOffset int64
	cfaExpr   []byte
	cfaIsExpr bool
	fp, ra    regRule
	raSigned  bool // arm64: toggled by DW_CFA_AARCH64_negate_ra_state
}

// maxRememberDepth bounds DW_CFA_remember_state nesting; compilers nest
// one or two levels.
const maxRememberDepth = 16

// DW_CFA_* opcodes (DWARF 5 §6.4.2, plus the GNU and AArch64 extensions).
const (
	cfaAdvanceLoc          = 0x40 // high two bits
	cfaOffset              = 0x80
	cfaRestore             = 0xc0
	cfaNop                 = 0x00
	cfaSetLoc              = 0x01
	cfaAdvanceLoc1         = 0x02
	cfaAdvanceLoc2         = 0x03
	cfaAdvanceLoc4         = 0x04
	cfaOffsetExtended      = 0x05
	cfaRestoreExtended     = 0x06
	cfaUndefined           = 0x07
	cfaSameValue           = 0x08
	cfaRegister            = 0x09
	cfaRememberState       = 0x0a
	cfaRestoreState        = 0x0b
	cfaDefCFA              = 0x0c
	cfaDefCFARegister      = 0x0d
	cfaDefCFAOffset        = 0x0e
	cfaDefCFAExpression    = 0x0f
	cfaExpression          = 0x10
	cfaOffsetExtendedSF    = 0x11
	cfaDefCFASF            = 0x12
	cfaDefCFAOffsetSF      = 0x13
	cfaValOffset           = 0x14
	cfaValOffsetSF         = 0x15
	cfaValExpression       = 0x16
	cfaMIPSAdvanceLoc8     = 0x1d
	cfaNegateRAStateWithPC = 0x2c // AArch64 (LLVM 19+)
	cfaNegateRAState       = 0x2d // AArch64; DW_CFA_GNU_window_save on SPARC
	cfaGNUArgsSize         = 0x2e
	cfaGNUNegOffsetExt     = 0x2f
)

// program runs CFA instructions. One program value is reused for all FDEs
// of a section to keep the remember stack off the heap.
type program struct {
	sec   *cfiSection
	cie   *cie
	state frameState
	stack [maxRememberDepth]frameState
	depth int

	loc, end uint64
	inCIE    bool
	// row is called with each finished row [loc, next loc) inside the
	// FDE's range.
	row func(loc uint64, st *frameState) error
}

// runCIE runs a CIE's initial instructions into c.initial.
func (s *cfiSection) runCIE(c *cie) error {
	p := program{sec: s, cie: c, inCIE: true}
	p.state.ra.kind = ruleUnset
	if err := p.run(c.insns, c.insnsAt); err != nil {
		return err
	}
	c.initial = p.state
	return nil
}

// runFDE runs an FDE's instructions from the CIE's initial row, calling
// row for each row of the FDE's range.
func (p *program) runFDE(f *fde, row func(uint64, *frameState) error) error {
	p.cie, p.state, p.depth = f.cie, f.cie.initial, 0
	p.loc, p.end, p.inCIE, p.row = f.start, f.end, false, row
	if err := p.run(f.insns, f.insnsAt); err != nil {
		return err
	}
	if p.loc < p.end {
		return p.row(p.loc, &p.state)
	}
	return nil
}

func (p *program) fail(r *reader, format string, args ...any) error {
	r.failf(format, args...)
	return r.err(p.sec.name)
}

// run interprets insns found at section offset at. It stops early once
// the location passes the end of the FDE, since later rows cannot apply.
// A malformed operand ends the loop through the reader's sticky failure.
func (p *program) run(insns []byte, at int) error {
	r := &reader{data: p.sec.data, pos: at, end: at + len(insns), order: p.sec.order}
	for !r.atEnd() {
		if stop, err := p.step(r, r.u8("CFA opcode")); stop || err != nil {
			return err
		}
	}
	return r.err(p.sec.name)
}

// step executes one instruction.
func (p *program) step(r *reader, op byte) (stop bool, err error) {
	switch op & 0xc0 {
	case cfaAdvanceLoc:
		return p.advance(r, uint64(op&0x3f))
	case cfaOffset:
		p.setOffset(uint64(op&0x3f), ruleOffset, p.factored(r, r.uleb("offset")))
		return false, nil
	case cfaRestore:
		return false, p.restore(r, uint64(op&0x3f))
	}
	switch op {
	case cfaNop:
	case cfaGNUArgsSize:
		r.uleb("args size")
	case cfaSetLoc, cfaAdvanceLoc1, cfaAdvanceLoc2, cfaAdvanceLoc4, cfaMIPSAdvanceLoc8:
		return p.location(r, op)
	case cfaRememberState:
		if p.depth == maxRememberDepth {
			return true, p.fail(r, "DW_CFA_remember_state nested deeper than %d", maxRememberDepth)
		}
		p.stack[p.depth] = p.state
		p.depth++
	case cfaRestoreState:
		if p.depth == 0 {
			return true, p.fail(r, "DW_CFA_restore_state without DW_CFA_remember_state")
		}
		p.depth--
		p.state = p.stack[p.depth]
	case cfaDefCFA, cfaDefCFASF, cfaDefCFARegister, cfaDefCFAOffset, cfaDefCFAOffsetSF, cfaDefCFAExpression:
		p.cfaRule(r, op)
	case cfaNegateRAState, cfaNegateRAStateWithPC:
		if p.sec.arch.machine != machineARM64 {
			return true, p.fail(r, "DW_CFA opcode %#x is AArch64 only", op)
		}
		p.state.raSigned = !p.state.raSigned
	default:
		return false, p.registerRule(r, op)
	}
	return false, nil
}

// location executes the instructions that move to a new row.
func (p *program) location(r *reader, op byte) (stop bool, err error) {
	switch op {
	case cfaAdvanceLoc1:
		return p.advance(r, uint64(r.u8("advance")))
	case cfaAdvanceLoc2:
		return p.advance(r, uint64(r.u16("advance")))
	case cfaAdvanceLoc4:
		return p.advance(r, uint64(r.u32("advance")))
	case cfaMIPSAdvanceLoc8:
		return p.advance(r, r.u64("advance"))
	}
	b := p.sec.bases
	loc := r.pointer(p.cie.fdeEnc, p.cie.ptrSize, &b, "DW_CFA_set_loc")
	if !r.ok() || p.inCIE {
		return false, nil
	}
	if loc < p.loc {
		return true, p.fail(r, "DW_CFA_set_loc moves back from %#x to %#x", p.loc, loc)
	}
	return p.moveTo(loc)
}

// cfaRule executes the instructions that define the CFA.
func (p *program) cfaRule(r *reader, op byte) {
	st := &p.state
	switch op {
	case cfaDefCFA:
		reg := r.uleb("register")
		p.defCFA(r, reg, p.unfactored(r, r.uleb("offset")))
	case cfaDefCFASF:
		reg := r.uleb("register")
		p.defCFA(r, reg, p.factoredS(r, r.sleb("offset")))
	case cfaDefCFARegister:
		p.defCFA(r, r.uleb("register"), st.cfaOffset)
	case cfaDefCFAOffset:
		p.defCFA(r, st.cfaReg, p.unfactored(r, r.uleb("offset")))
	case cfaDefCFAOffsetSF:
		p.defCFA(r, st.cfaReg, p.factoredS(r, r.sleb("offset")))
	case cfaDefCFAExpression:
		expr := r.take(r.uleb("expression length"), "CFA expression")
		if r.ok() {
			st.cfaIsExpr, st.cfaExpr = true, expr
		}
	}
}

// registerRule executes the instructions that set a register's rule.
func (p *program) registerRule(r *reader, op byte) error {
	switch op {
	case cfaOffsetExtended, cfaValOffset, cfaGNUNegOffsetExt:
		reg := r.uleb("register")
		off := p.factored(r, r.uleb("offset"))
		switch op {
		case cfaOffsetExtended:
			p.setOffset(reg, ruleOffset, off)
		case cfaValOffset:
			p.setOffset(reg, ruleValOffset, off)
		default:
			p.setOffset(reg, ruleOffset, -off)
		}
	case cfaOffsetExtendedSF, cfaValOffsetSF:
		reg := r.uleb("register")
		kind := ruleOffset
		if op == cfaValOffsetSF {
			kind = ruleValOffset
		}
		p.setOffset(reg, kind, p.factoredS(r, r.sleb("offset")))
	case cfaRestoreExtended:
		return p.restore(r, r.uleb("register"))
	case cfaUndefined:
		p.setRule(r.uleb("register"), regRule{kind: ruleUndefined})
	case cfaSameValue:
		p.setRule(r.uleb("register"), regRule{kind: ruleSame})
	case cfaRegister:
		reg := r.uleb("register")
		p.setRule(reg, regRule{kind: ruleRegister, reg: r.uleb("register")})
	case cfaExpression, cfaValExpression:
		reg := r.uleb("register")
		expr := r.take(r.uleb("expression length"), "register expression")
		kind := ruleExpr
		if op == cfaValExpression {
			kind = ruleValExpr
		}
		p.setRule(reg, regRule{kind: kind, expr: expr})
	default:
		return p.fail(r, "unknown DW_CFA opcode %#x", op)
	}
	return nil
}

// advance moves the location by delta code alignment units.
func (p *program) advance(r *reader, delta uint64) (stop bool, err error) {
	if !r.ok() {
		return true, r.err(p.sec.name)
	}
	if p.inCIE {
		return false, nil
	}
	hi, d := bits.Mul64(delta, p.cie.codeAlign)
	loc := p.loc + d
	if hi != 0 || loc < p.loc {
		return true, p.fail(r, "location advance overflows")
	}
	return p.moveTo(loc)
}

// moveTo finishes the current row and starts the next at loc.
func (p *program) moveTo(loc uint64) (stop bool, err error) {
	if loc == p.loc {
		return false, nil
	}
	if p.loc < p.end {
		if err := p.row(p.loc, &p.state); err != nil {
			return true, err
		}
	}
	p.loc = loc
	return loc >= p.end, nil
}

// factored multiplies an unsigned operand by the data alignment factor.
func (p *program) factored(r *reader, v uint64) int64 {
	if v > math.MaxInt64 {
		r.failf("offset %d out of range", v)
		return 0
	}
	return p.factoredS(r, int64(v))
}

func (p *program) factoredS(r *reader, v int64) int64 {
	f := p.cie.dataAlign
	prod := v * f
	if v != 0 && (prod/v != f || v == -1 && f == math.MinInt64) {
		r.failf("offset %d × %d overflows", v, f)
		return 0
	}
	return prod
}

func (p *program) unfactored(r *reader, v uint64) int64 {
	if v > math.MaxInt64 {
		r.failf("offset %d out of range", v)
		return 0
	}
	return int64(v)
}

func (p *program) defCFA(r *reader, reg uint64, offset int64) {
	if r.ok() {
		p.state.cfaReg, p.state.cfaOffset = reg, offset
		p.state.cfaIsExpr, p.state.cfaExpr = false, nil
	}
}

// rulePtr returns where the rule of reg is kept, or nil if stack deltas do
// not need it.
func (p *program) rulePtr(reg uint64) *regRule {
	switch reg {
	case p.cie.raReg:
		return &p.state.ra
	case p.sec.arch.fp:
		return &p.state.fp
	}
	return nil
}

func (p *program) setRule(reg uint64, rule regRule) {
	if rp := p.rulePtr(reg); rp != nil {
		*rp = rule
	}
}

func (p *program) setOffset(reg uint64, kind ruleKind, offset int64) {
	p.setRule(reg, regRule{kind: kind, offset: offset})
}

// restore sets reg's rule back to the CIE's.
func (p *program) restore(r *reader, reg uint64) error {
	if p.inCIE {
		return p.fail(r, "DW_CFA_restore in a CIE")
	}
	switch reg {
	case p.cie.raReg:
		p.state.ra = p.cie.initial.ra
	case p.sec.arch.fp:
		p.state.fp = p.cie.initial.fp
	}
	return nil
}

package nativeunwind

import (
	"bytes"
	"debug/elf"
	"math"
)

const (
	machineAMD64 = elf.EM_X86_64
	machineARM64 = elf.EM_AARCH64
)

// archInfo holds the DWARF register numbers of an architecture.
type archInfo struct {
	machine elf.Machine
	sp, fp  uint64
	// lr is the link register, which holds the return address on entry;
	// noRegister where calls push it.
	lr uint64
}

const noRegister = math.MaxUint64

var (
	archAMD64 = archInfo{machine: machineAMD64, sp: 7, fp: 6, lr: noRegister}
	archARM64 = archInfo{machine: machineARM64, sp: 31, fp: 29, lr: 30}
)

func archFor(m elf.Machine) *archInfo {
	switch m {
	case machineAMD64:
		return &archAMD64
	case machineARM64:
		return &archARM64
	}
	return nil
}

// unknownReason says why a CFA table row became CFAUnknown.
type unknownReason uint8

const (
	knownRule unknownReason = iota
	unknownCFARegister
	unknownCFAExpression
	unknownFPRule
	unknownRARule
	unknownOffsetRange
	numUnknownReasons
)

var unknownReasonNames = [numUnknownReasons]string{
	unknownCFARegister:   "CFA based on a register other than SP or FP",
	unknownCFAExpression: "CFA expression",
	unknownFPRule:        "frame pointer rule",
	unknownRARule:        "return address rule",
	unknownOffsetRange:   "offset beyond 32 bits",
}

// DWARF expressions linkers and libcs emit for frames that have no
// register+offset CFA.
var (
	// x86_64 PLT entries (binutils): CFA = rsp + 8 + ((rip & 15) >= 11) << 3.
	pltExpr = []byte{
		0x77, 0x08, // DW_OP_breg7 (rsp) 8
		0x80, 0x00, // DW_OP_breg16 (rip) 0
		0x3f, // DW_OP_lit15
		0x1a, // DW_OP_and
		0x3b, // DW_OP_lit11 (DW_OP_lit10 in IBT PLTs)
		0x2a, // DW_OP_ge
		0x33, // DW_OP_lit3
		0x24, // DW_OP_shl
		0x22, // DW_OP_plus
	}
	pltThresholdAt = 6
	// glibc's x86_64 __restore_rt: CFA = the rsp saved in the ucontext at
	// rsp (offsetof(ucontext_t, uc_mcontext.gregs[REG_RSP]) = 160).
	sigcontextRSPExpr = []byte{0x77, 0xa0, 0x01, 0x06} // DW_OP_breg7 160; DW_OP_deref
)

// pltThreshold returns the PC&15 value from which a PLT entry has pushed,
// or 0 if expr is not the PLT expression.
func pltThreshold(expr []byte) int32 {
	if len(expr) != len(pltExpr) ||
		!bytes.Equal(expr[:pltThresholdAt], pltExpr[:pltThresholdAt]) ||
		!bytes.Equal(expr[pltThresholdAt+1:], pltExpr[pltThresholdAt+1:]) {
		return 0
	}
	switch expr[pltThresholdAt] {
	case 0x3b:
		return 11
	case 0x3a:
		return 10
	}
	return 0
}

func fits32(v int64) bool { return v >= math.MinInt32 && v <= math.MaxInt32 }

// rule turns a row of the CFA table into a stack delta rule.
func (a *archInfo) rule(c *cie, st *frameState) (Rule, unknownReason) {
	if c.signal {
		return Rule{CFA: CFASignal}, knownRule
	}
	if st.ra.kind == ruleUndefined {
		return Rule{CFA: CFAStop}, knownRule
	}
	var r Rule
	switch {
	case st.cfaIsExpr:
		if a.machine == machineAMD64 {
			if t := pltThreshold(st.cfaExpr); t != 0 {
				return Rule{CFA: CFAPLT, CFAOffset: t, RAOffset: -8}, knownRule
			}
			if bytes.Equal(st.cfaExpr, sigcontextRSPExpr) {
				return Rule{CFA: CFASignal}, knownRule
			}
		}
		return Rule{}, unknownCFAExpression
	case st.cfaReg == a.sp:
		r.CFA = CFASP
	case st.cfaReg == a.fp:
		r.CFA = CFAFP
	default:
		return Rule{}, unknownCFARegister
	}
	if !fits32(st.cfaOffset) {
		return Rule{}, unknownOffsetRange
	}
	r.CFAOffset = int32(st.cfaOffset)

	switch st.fp.kind {
	case ruleUnset, ruleSame, ruleUndefined:
	case ruleOffset:
		if st.fp.offset == 0 {
			return Rule{}, unknownFPRule
		}
		if !fits32(st.fp.offset) {
			return Rule{}, unknownOffsetRange
		}
		r.FPOffset = int32(st.fp.offset)
	default:
		return Rule{}, unknownFPRule
	}

	switch st.ra.kind {
	case ruleOffset:
		if st.ra.offset == 0 {
			return Rule{}, unknownRARule
		}
		if !fits32(st.ra.offset) {
			return Rule{}, unknownOffsetRange
		}
		r.RAOffset = int32(st.ra.offset)
	case ruleUnset, ruleSame:
		// The return address is still in its column's register: usable
		// only if that is the link register.
		if c.raReg != a.lr {
			return Rule{}, unknownRARule
		}
	case ruleRegister:
		if st.ra.reg != a.lr {
			return Rule{}, unknownRARule
		}
	default:
		return Rule{}, unknownRARule
	}
	r.RASigned = st.raSigned
	return r, knownRule
}

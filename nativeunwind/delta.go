package nativeunwind

import (
	"fmt"
	"iter"
	"slices"
)

// CFABase says how the canonical frame address (CFA, the stack pointer
// value in the caller just before the call) is found, or that it cannot be.
type CFABase uint8

const (
	// CFAUnknown: no unwind information covers the address; the unwinder
	// may try frame pointers.
	CFAUnknown CFABase = iota
	// CFASP: CFA = SP + CFAOffset.
	CFASP
	// CFAFP: CFA = FP + CFAOffset.
	CFAFP
	// CFAStop: the outermost frame of a thread or process (_start, the
	// clone child, start_thread, runtime.goexit): the trace ends here.
	CFAStop
	// CFASignal: the signal-return trampoline: the interrupted registers
	// are in the signal frame at SP (struct rt_sigframe).
	CFASignal
	// CFAPLT: an x86_64 PLT stub, whose CFA depends on where in the
	// 16-byte entry the PC is: CFA = SP + 8, plus 8 once the stub has
	// pushed (PC & 15 >= CFAOffset). CFAOffset is 11 for classic PLTs and
	// 10 for IBT PLTs, as the linker's CFI expression says.
	CFAPLT
	// CFAGoCgo: Go's runtime.asmcgocall calling C on the system stack,
	// where neither SP nor FP leads back to its frame: CFA = the
	// goroutine's SP, found from what asmcgocall saved at SP, + CFAOffset;
	// FPOffset and RAOffset as for CFASP.
	CFAGoCgo
)

func (b CFABase) String() string {
	switch b {
	case CFAUnknown:
		return "unknown"
	case CFASP:
		return "sp"
	case CFAFP:
		return "fp"
	case CFAStop:
		return "stop"
	case CFASignal:
		return "signal"
	case CFAPLT:
		return "plt"
	case CFAGoCgo:
		return "gocgo"
	default:
		return fmt.Sprintf("CFABase(%d)", uint8(b))
	}
}

// Rule is how to unwind one frame at a given address.
type Rule struct {
	CFA CFABase
	// RASigned: arm64 pointer authentication has signed the return
	// address (DW_CFA_AARCH64_negate_ra_state); strip the PAC bits
	// before using it. (Next to CFA so that a Rule takes 16 bytes.)
	RASigned bool
	// StackSwitch: the CFA may lie below SP, because the frame switched
	// to another stack (Go's runtime.systemstack, runtime.asmcgocall);
	// unwinders otherwise take a CFA that does not grow as corruption.
	StackSwitch bool
	// Runtime, when set, is the id of the language runtime whose eval
	// loop the frame runs (package interpreter): its unwinder reports the
	// loop's own frames in its place (see Deltas.MarkRuntime). Not part of
	// the CFI.
	Runtime   uint8
	CFAOffset int32
	// FPOffset is where the caller's frame pointer is saved, relative to
	// the CFA; 0 means the frame pointer register still holds it.
	FPOffset int32
	// RAOffset is where the return address is saved, relative to the CFA;
	// 0 means it is still in the link register (arm64 leaf code). On
	// x86_64 it is always -8.
	RAOffset int32
}

func (r Rule) String() string {
	switch r.CFA {
	case CFASP, CFAFP, CFAGoCgo:
		s := fmt.Sprintf("cfa=%s%+d fp=%s ra=%s", r.CFA, r.CFAOffset, slot(r.FPOffset), slot(r.RAOffset))
		if r.RASigned {
			s += " pac"
		}
		if r.StackSwitch {
			s += " switch"
		}
		if r.Runtime != 0 {
			s += fmt.Sprintf(" runtime=%d", r.Runtime)
		}
		return s
	case CFAPLT:
		return fmt.Sprintf("plt(push at %d)", r.CFAOffset)
	default:
		return r.CFA.String()
	}
}

func slot(off int32) string {
	if off == 0 {
		return "reg"
	}
	return fmt.Sprintf("c%+d", off)
}

// Delta says that Rule applies from Address (a file virtual address) up to
// the next delta's address.
type Delta struct {
	Address uint64
	Rule    Rule
}

// Deltas are a file's stack deltas sorted by address, with no two
// neighbours carrying the same rule. A gap in the unwind information is a
// delta with CFAUnknown.
type Deltas []Delta

// Lookup returns the rule for addr and whether any delta covers it.
func (d Deltas) Lookup(addr uint64) (Rule, bool) {
	lo, hi := 0, len(d)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if d[mid].Address <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return Rule{}, false
	}
	r := d[lo-1].Rule
	return r, r.CFA != CFAUnknown
}

// MarkRuntime returns the deltas with Rule.Runtime set to runtime on every
// rule in effect in [start, end), the code of that runtime's eval loop.
// Deltas are split at start and end where needed; d is not modified.
func (d Deltas) MarkRuntime(start, end uint64, runtime uint8) Deltas {
	if start >= end {
		return d
	}
	return slices.AppendSeq(make(Deltas, 0, len(d)+2), MarkRuntimeSeq(slices.Values(d), start, end, runtime))
}

// MarkRuntimeSeq is MarkRuntime on deltas yielded in address order, as
// they are yielded: a file's deltas read from a cache need not be held in
// a slice of their own.
func MarkRuntimeSeq(deltas iter.Seq[Delta], start, end uint64, runtime uint8) iter.Seq[Delta] {
	if start >= end {
		return deltas
	}
	mark := func(r Rule) Rule {
		if r.CFA != CFAUnknown {
			r.Runtime = runtime
		}
		return r
	}
	return func(yield func(Delta) bool) {
		// The last delta is held back until the next: a split at start
		// or end may replace it (same address), and a delta that repeats
		// the rule before it is left out.
		var held, sent Delta
		haveHeld, haveSent, stopped := false, false, false
		add := func(addr uint64, r Rule) {
			if stopped {
				return
			}
			if haveHeld && held.Address == addr {
				haveHeld = false
			}
			if (haveHeld && held.Rule == r) || (!haveHeld && haveSent && sent.Rule == r) {
				return
			}
			if haveHeld {
				if !yield(held) {
					stopped = true
				}
				sent, haveSent = held, true
			}
			held, haveHeld = Delta{Address: addr, Rule: r}, true
		}
		var last Rule // in effect before the next delta
		const before, within, after = 0, 1, 2
		part := before
		for x := range deltas {
			if part == before && x.Address >= start {
				if haveHeld || haveSent {
					add(start, mark(last))
				}
				part = within
			}
			if part == within && x.Address >= end {
				if x.Address > end {
					add(end, last)
				}
				part = after
			}
			if part == within {
				add(x.Address, mark(x.Rule))
			} else {
				add(x.Address, x.Rule)
			}
			last = x.Rule
			if stopped {
				return
			}
		}
		if part == before && (haveHeld || haveSent) {
			add(start, mark(last))
		}
		if part != after {
			add(end, last)
		}
		if haveHeld && !stopped {
			yield(held)
		}
	}
}

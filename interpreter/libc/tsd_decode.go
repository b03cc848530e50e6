package libc

import "fmt"

// The decoders of pthread_getspecific run its fast path symbolically: each
// register holds base + scale*key + off or is unknown, where base is
// nothing, the thread pointer, or a pointer loaded from a known address.
// The first load whose address depends on the key reads the key's value;
// the chain of loads it rests on, its scale and its offset are the layout.
// The machine is strict: an instruction the arch decoder does not know, a
// branch that is not the key's bound check, a store, or a key-indexed load
// not relative to the thread pointer ends decoding with ErrTSDCode.

const (
	tsdNoBase = 0  // a number
	tsdTP     = 1  // the thread pointer; tsdTP+1+i: what tsdMachine.loads[i] read
	tsdData   = -1 // the value of the key: what the decoding is looking for
)

const (
	tsdMaxSteps   = 64 // instructions run before giving up
	tsdMaxPending = 4  // instructions between the data load and its use
	tsdMaxLoads   = 4  // pointer loads before the data load
	tsdMaxValue   = 1 << 32
)

// MaxKeys bounds the pthread keys any C library hands out: PTHREAD_KEYS_MAX
// of glibc (bits/local_lim.h).
const MaxKeys = 1024

// tsdVal is what the machine knows of a register.
type tsdVal struct {
	known bool
	base  int
	scale int64 // multiple of the key
	off   int64
	// dirty: the value carries the key argument's upper 32 bits, which the
	// ABI leaves undefined (the key is an unsigned int) until a 32-bit
	// operation or zero-extension clears them.
	dirty bool
}

func tsdConst(c int64) tsdVal { return tsdVal{known: true, off: c} }
func tsdKeyArg() tsdVal       { return tsdVal{known: true, scale: 1, dirty: true} }
func tsdThreadPointer() tsdVal {
	return tsdVal{known: true, base: tsdTP}
}

func (v tsdVal) isKey() bool { return v.known && v.base == tsdNoBase && v.scale == 1 && v.off == 0 }

func tsdBounded(v tsdVal) tsdVal {
	if v.scale <= -tsdMaxValue || v.scale >= tsdMaxValue || v.off <= -tsdMaxValue || v.off >= tsdMaxValue {
		return tsdVal{}
	}
	return v
}

// tsdAdd adds two values of which at most one has a base.
func tsdAdd(a, b tsdVal) tsdVal {
	if !a.known || !b.known || (a.base != tsdNoBase && b.base != tsdNoBase) {
		return tsdVal{}
	}
	return tsdBounded(tsdVal{known: true, base: a.base + b.base, scale: a.scale + b.scale,
		off: a.off + b.off, dirty: a.dirty || b.dirty})
}

func tsdNeg(v tsdVal) tsdVal {
	if !v.known || v.base != tsdNoBase {
		return tsdVal{}
	}
	return tsdVal{known: true, scale: -v.scale, off: -v.off, dirty: v.dirty}
}

// tsdShl shifts a number left; pointers are not shifted in the fast path.
func tsdShl(v tsdVal, n int) tsdVal {
	if !v.known || v.base != tsdNoBase || n < 0 || n > 31 {
		return tsdVal{}
	}
	return tsdBounded(tsdVal{known: true, scale: v.scale << n, off: v.off << n, dirty: v.dirty})
}

// tsdTrunc32 is the result of a 32-bit operation, which zero-extends. The
// machine assumes no wrap-around: keys are below MaxKeys.
func tsdTrunc32(v tsdVal) tsdVal {
	if !v.known || v.base != tsdNoBase {
		return tsdVal{}
	}
	if v.scale == 0 {
		return tsdConst(int64(uint32(v.off)))
	}
	v.dirty = false
	return v
}

// tsdLoad is a pointer load before the data load.
type tsdLoad struct {
	from int // base of the address
	off  int64
}

// tsdFinal is the key-indexed load: the address and the register it
// filled.
type tsdFinal struct {
	base       int
	scale, off int64
	reg        int
}

// tsdBranch is what a conditional branch tests, as an unsigned compare of
// the key with an immediate.
type tsdBranch int

const (
	tsdAbove tsdBranch = iota + 1 // x86 ja, arm64 b.hi
	tsdAboveEq
	tsdBelowEq
	tsdBelow
)

type tsdMachine struct {
	loads []tsdLoad
	// The flags hold the compare of the key with cmpImm.
	flagsKey bool
	cmpImm   int64
	// bound is the first key the fast path refuses, once bounded.
	bound   int64
	bounded bool
	final   *tsdFinal
	pending int // instructions since the data load
}

func tsdErr(pc int, format string, args ...any) error {
	return fmt.Errorf("%w: at +%#x: %s", ErrTSDCode, pc, fmt.Sprintf(format, args...))
}

// load is a 64-bit load from addr into register reg (wide: 64 bits).
func (m *tsdMachine) load(pc int, addr tsdVal, reg int, wide bool) (tsdVal, error) {
	switch {
	case !addr.known || addr.base < tsdTP || m.final != nil:
		if addr.known && addr.scale != 0 && addr.base == tsdNoBase && m.final == nil {
			return tsdVal{}, tsdErr(pc, "key-indexed load from a fixed address, not the thread's")
		}
		return tsdVal{}, nil
	case addr.scale == 0:
		if !wide {
			return tsdVal{}, nil
		}
		if len(m.loads) == tsdMaxLoads {
			return tsdVal{}, tsdErr(pc, "more than %d pointer loads", tsdMaxLoads)
		}
		m.loads = append(m.loads, tsdLoad{from: addr.base, off: addr.off})
		return tsdVal{known: true, base: tsdTP + len(m.loads)}, nil
	case addr.dirty:
		return tsdVal{}, tsdErr(pc, "the key-indexed load uses the key's undefined upper 32 bits")
	case !wide:
		return tsdVal{}, tsdErr(pc, "the key-indexed load is not 64 bits wide")
	}
	m.final = &tsdFinal{base: addr.base, scale: addr.scale, off: addr.off, reg: reg}
	return tsdVal{known: true, base: tsdData}, nil
}

func (m *tsdMachine) cmp(v tsdVal, imm int64, is32 bool) {
	if is32 {
		imm = int64(uint32(imm))
	}
	m.flagsKey = v.isKey() && (is32 || !v.dirty) && imm >= 0
	m.cmpImm = imm
}

// branch checks a conditional branch, which must be the key's bound check,
// and says whether the fast path is at its target.
func (m *tsdMachine) branch(pc int, cond tsdBranch) (bool, error) {
	switch {
	case m.final != nil:
		return false, tsdErr(pc, "branch before the key's value is used")
	case !m.flagsKey:
		return false, tsdErr(pc, "conditional branch on something other than the key")
	case m.bounded:
		return false, tsdErr(pc, "a second bound check of the key")
	}
	imm := m.cmpImm
	m.bounded = true
	switch cond {
	case tsdAbove: // slow path if key > imm
		m.bound = imm + 1
		return false, nil
	case tsdAboveEq:
		m.bound = imm
		return false, nil
	case tsdBelowEq: // fast path if key <= imm
		m.bound = imm + 1
		return true, nil
	case tsdBelow:
		m.bound = imm
		return true, nil
	}
	return false, tsdErr(pc, "the key's bound check is not an unsigned compare")
}

// step counts an instruction; after the data load, it checks that the
// instruction did not overwrite the key's value before using it.
func (m *tsdMachine) step(pc int, steps int, dataReg tsdVal) error {
	if steps >= tsdMaxSteps {
		return tsdErr(pc, "no key-indexed load in %d instructions", tsdMaxSteps)
	}
	if m.final == nil {
		return nil
	}
	if dataReg != (tsdVal{known: true, base: tsdData}) {
		return tsdErr(pc, "the key's value is overwritten before it is used")
	}
	m.pending++
	if m.pending > tsdMaxPending {
		return tsdErr(pc, "the key's value is not tested or returned")
	}
	return nil
}

// layout turns the data load into a TSDLayout.
func (m *tsdMachine) layout(pc int) (TSDLayout, error) {
	f := m.final
	var chain []int64 // offsets of the pointer loads from tp, outermost first
	for b := f.base; b != tsdTP; b = m.loads[b-tsdTP-1].from {
		chain = append([]int64{m.loads[b-tsdTP-1].off}, chain...)
	}
	if m.bounded && (m.bound <= 0 || m.bound > MaxKeys) {
		return TSDLayout{}, tsdErr(pc, "implausible key bound %d", m.bound)
	}
	l := TSDLayout{EntrySize: f.scale, MaxFastKey: uint32(m.bound)}
	switch {
	case f.scale == 16 && len(chain) <= 1:
		// glibc: &THREAD_SELF->specific_1stblock[key].data, where data
		// follows uintptr_t seq in struct pthread_key_data.
		if !m.bounded {
			return TSDLayout{}, tsdErr(pc, "16-byte entries without a bound check of the key")
		}
		l.Libc, l.DataOffset, l.FirstBlockOffset = LibcGlibc, 8, f.off-8
		if len(chain) == 1 {
			l.SelfDeref, l.SelfOffset = true, chain[0]
		}
	case f.scale == 8 && f.off == 0 && (len(chain) == 1 || len(chain) == 2):
		// musl: self->tsd[key].
		l.Libc, l.BlockDeref, l.FirstBlockOffset = LibcMusl, true, chain[len(chain)-1]
		if len(chain) == 2 {
			l.SelfDeref, l.SelfOffset = true, chain[0]
		}
		if !m.bounded {
			l.MaxFastKey = muslKeysMax
		}
	default:
		return TSDLayout{}, tsdErr(pc, "key-indexed load at %d*key%+d after %d pointer loads: neither glibc's nor musl's layout",
			f.scale, f.off, len(chain))
	}
	return l, nil
}

// tsdBranchInside checks that the instruction at pc, whose successor in
// memory is following, continues inside the code read: a branch not taken
// may lead anywhere (such as to a .cold section), a branch taken may not.
func tsdBranchInside(pc, next, following, size int) error {
	if next != following && (next < 0 || next >= size) {
		return tsdErr(pc, "branch to %+d, outside the function's first %d bytes", next, size)
	}
	return nil
}

// tsdRun drives an architecture's decoder over code from its first
// instruction: exec runs the instruction at pc and returns the pc to go on
// at, the pc of the instruction after it, and whether it tested or returned
// the key's value. regs are the decoder's registers, the key's value among
// them.
func tsdRun(code []byte, regs []tsdVal, exec func(m *tsdMachine, pc int) (next, following int, done bool, err error)) (TSDLayout, error) {
	var m tsdMachine
	pc := 0
	for steps := 0; ; steps++ {
		var data tsdVal
		if m.final != nil {
			data = regs[m.final.reg]
		}
		if err := m.step(pc, steps, data); err != nil {
			return TSDLayout{}, err
		}
		next, following, done, err := exec(&m, pc)
		if err != nil {
			return TSDLayout{}, err
		}
		if done {
			return m.layout(pc)
		}
		if err := tsdBranchInside(pc, next, following, len(code)); err != nil {
			return TSDLayout{}, err
		}
		pc = next
	}
}

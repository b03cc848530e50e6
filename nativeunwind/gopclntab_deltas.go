package nativeunwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"math"
)

// Go code has no .eh_frame: its unwind information is the pclntab's pcsp
// table, which gives for every pc the distance of SP below its value at
// the function's entry (runtime/symtab.go, funcspdelta). With the call
// conventions of each architecture that is a full rule.

// goDeltas returns the stack deltas of f's Go functions. The error wraps
// ErrNoGoPclntab when f is not a Go executable.
func goDeltas(img elfImage) (Deltas, error) {
	t, err := img.openPclntab()
	if err != nil {
		return nil, err
	}
	a, err := goArchOf(img.f.Machine)
	if err != nil {
		return nil, err
	}
	return t.deltas(a, img.read)
}

// goArch is what the rules depend on per architecture.
type goArch struct {
	// rule turns an SP delta into a rule; saved says whether the function
	// keeps the frame pointer (and on arm64 the link register) where
	// compiled Go code does.
	rule func(spDelta int32, saved bool) Rule
	// fpRule is the same rule based on the frame pointer, marked
	// StackSwitch, for functions that move SP to another stack while their
	// frame pointer stays.
	fpRule func(spDelta int32) Rule
	// frame inspects the code [pc-before, pc+after) of an assembly
	// function, where pc is the first with a frame. It says whether the
	// instructions before pc saved the frame like compiled code does, and
	// how many bytes after pc the frame pointer points at the new frame
	// (0 if it never does).
	before, after int
	frame         func(code []byte) (saved bool, fpFrom uint64)
	// signal are the signal return trampolines Go installs itself.
	signal []string
	// cgoCall is the instruction with which runtime.asmcgocall calls C
	// (0: it needs no rule of its own). arm64 loads the system stack's
	// frame pointer before the call, so there only CFAGoCgo leads back to
	// the goroutine's frame; amd64 leaves BP on the goroutine's stack and
	// the frame pointer rule holds.
	cgoCall uint32
}

func goArchOf(m elf.Machine) (*goArch, error) {
	switch m {
	case elf.EM_X86_64:
		return &goAMD64, nil
	case elf.EM_AARCH64:
		return &goARM64, nil
	}
	return nil, fmt.Errorf("Go stack deltas for %v are not supported", m)
}

// goAMD64: CALL pushes the return address, so CFA = SP + delta + 8 and
// the return address is at CFA-8. A function with a frame starts with
// PUSHQ BP; MOVQ SP, BP and ends by popping BP (cmd/internal/obj/x86/
// obj6.go, preprocess: "Save caller's BP"), so while the delta is
// positive the caller's BP is at CFA-16 and, past the MOVQ, CFA = BP+16.
// Before Go 1.21 the prologue was SUBQ then MOVQ BP, so for one
// instruction the slot was not yet written; the BP register is intact
// then.
var goAMD64 = goArch{
	rule: func(sp int32, saved bool) Rule {
		r := Rule{CFA: CFASP, CFAOffset: sp + 8, RAOffset: -8}
		if sp > 0 && saved {
			r.FPOffset = -16
		}
		return r
	},
	fpRule: func(int32) Rule {
		return Rule{CFA: CFAFP, StackSwitch: true, CFAOffset: 16, FPOffset: -16, RAOffset: -8}
	},
	before: 1,
	after:  3,
	frame: func(c []byte) (bool, uint64) {
		const pushBP = 0x55
		movSPBP := []byte{0x48, 0x89, 0xe5}
		if c[0] != pushBP {
			return false, 0
		}
		if bytes.Equal(c[1:4], movSPBP) {
			return true, 3
		}
		return true, 0
	},
	// Go sets sa_restorer to this (runtime/os_linux.go, setsig); it was
	// runtime.sigreturn before Go 1.20.
	signal: []string{"runtime.sigreturn__sigaction", "runtime.sigreturn"},
}

// goARM64: BL leaves the return address in LR and SP where it was, so
// CFA = SP + delta. A function with a frame stores LR at 0(RSP) in the
// same instruction that moves SP down (MOVD.W R30, -size(RSP)), or before
// it for large frames (STP (R29, R30), -8(R20); MOVD R20, RSP), then the
// caller's FP at -8(RSP) and sets FP = RSP-8 (cmd/internal/obj/arm64/
// obj7.go, preprocess). So with delta d > 0, LR is at CFA-d, FP at
// CFA-d-8 and CFA = FP+d+8; with d = 0 (leaf code, or before the
// prologue) LR still holds the return address.
var goARM64 = goArch{
	rule: func(sp int32, saved bool) Rule {
		r := Rule{CFA: CFASP, CFAOffset: sp}
		if sp > 0 && saved {
			r.RAOffset = -sp
			r.FPOffset = -sp - 8
		}
		return r
	},
	fpRule: func(sp int32) Rule {
		return Rule{CFA: CFAFP, StackSwitch: true, CFAOffset: sp + 8, FPOffset: -sp - 8, RAOffset: -sp}
	},
	before: 4,
	after:  8,
	frame: func(c []byte) (bool, uint64) {
		const (
			strLRPreIndex = 0xf8000ffe // str x30, [sp, #imm9]!
			strMask       = 0xffe00fff
			movSPx20      = 0x9100029f // mov sp, x20
			sturFP        = 0xf81f83fd // stur x29, [sp, #-8]
			subFPSP8      = 0xd10023fd // sub x29, sp, #8
		)
		insn := func(i int) uint32 { return binary.LittleEndian.Uint32(c[4*i:]) } // instructions are little-endian
		switch {
		case insn(0)&strMask == strLRPreIndex:
			if insn(1) == sturFP && insn(2) == subFPSP8 {
				return true, 8
			}
			return true, 0
		case insn(0) == movSPx20:
			if insn(1) == subFPSP8 {
				return true, 4
			}
			return true, 0
		}
		return false, 0
	},
	cgoCall: 0xd63f0020, // blr x1
}

// Functions whose frames end a stack: a goroutine's stack starts in
// runtime.goexit (newproc makes the goroutine's function return there),
// a thread's system stack in runtime.mstart, the main thread's in
// runtime.rt0_go. Go 1.17+ marks them TOPFRAME in the table; the names
// cover older tables.
//
// runtime.morestack and runtime.mcall end the system stack part of a
// trace too: they switch to the system stack and clear the frame pointer
// before they call newstack or the mcall function, which never return
// (they resume a goroutine with gogo). Go's own traceback jumps from them
// to the goroutine's saved context, which a native unwinder cannot find.
var goStopFuncs = map[string]bool{
	"runtime.goexit":    true,
	"runtime.mstart":    true,
	"runtime.rt0_go":    true,
	"runtime.morestack": true,
	"runtime.mcall":     true,
}

// runtime.sigtramp is TOPFRAME for Go's own traceback, but a native
// unwinder can go on through the signal frame into the interrupted code.
var goSignalHandlers = map[string]bool{
	"runtime.sigtramp":    true,
	"runtime.cgoSigtramp": true,
}

// Functions that write SP other than by constant adjustments, mostly to
// switch to the system stack and back (SPWRITE in Go 1.17+ tables: also
// time.now, nanotime1, asmcgocall, ...): past the switch their pcsp
// value no longer describes SP, but their frame pointer still points at
// their frame on the goroutine stack ("The original frame pointer is
// stored in BP, which is useful for stack unwinding", runtime/asm_amd64.s,
// systemstack). So once the frame pointer is set they get frame pointer
// rules, before it SP rules, and without a frame no rule at all.
var goStackSwitchers = map[string]bool{
	"runtime.systemstack": true,
	"runtime.gogo":        true,
	"runtime.asmcgocall":  true,
}

// funcRule returns the rule for all of a function that gets a single one,
// or false for functions that follow their pcsp table.
func (a *goArch) funcRule(name string, flag uint8) (Rule, bool) {
	switch {
	case goSignalHandlers[name]:
		return Rule{}, false
	case goStopFuncs[name] || flag&funcFlagTopFrame != 0:
		return Rule{CFA: CFAStop}, true
	}
	for _, s := range a.signal {
		if name == s {
			return Rule{CFA: CFASignal}, true
		}
	}
	return Rule{}, false
}

// codeReader reads n bytes of code at a virtual address.
type codeReader func(addr, n uint64) ([]byte, error)

// maxSPDelta bounds pcsp values so that rules do not overflow. Frames can
// be large: reflect's runtime.call1073741824 has a 1 GiB one.
const maxSPDelta = math.MaxInt32 - 64

// deltas converts every function's pcsp table into rules. code may be nil;
// then assembly functions are taken to save registers like compiled ones.
func (t *pclntab) deltas(a *goArch, code codeReader) (Deltas, error) {
	w := deltaWriter{out: make(Deltas, 0, 4*t.nfunc+1)}
	// Every step consumes table bytes, but tables may be shared by any
	// number of functions; this bounds the total work on hostile input
	// far above what real tables need.
	w.budget = 16*len(t.pctab) + 64*t.nfunc
	var end uint64
	for i := 0; i < t.nfunc; i++ {
		f, err := t.fn(i)
		if err != nil {
			return nil, fmt.Errorf("pclntab: %w", err)
		}
		if f.entry < end || f.end < f.entry {
			return nil, fmt.Errorf("pclntab: function %d [%#x,%#x) (record at %#x) is out of address order", i, f.entry, f.end, f.recOff)
		}
		end = f.end
		if f.end == f.entry {
			continue
		}
		name, err := t.funcName(f)
		if err != nil {
			return nil, fmt.Errorf("pclntab: function %d at %#x: %w", i, f.entry, err)
		}
		if r, ok := a.funcRule(name, f.flag); ok {
			w.add(f.entry, r)
			continue
		}
		switcher := goStackSwitchers[name] || f.flag&funcFlagSPWrite != 0
		var cgoCalls []uint64
		if name == "runtime.asmcgocall" {
			cgoCalls = a.cgoCalls(f, code)
		}
		if err := t.spDeltas(&w, f, a, code, switcher, cgoCalls); err != nil {
			return nil, fmt.Errorf("pclntab: %s at %#x: %w", name, f.entry, err)
		}
	}
	w.add(end, Rule{})
	return w.out, nil
}

// deltaWriter appends deltas in address order, keeping neighbours
// distinct and letting a later rule at the same address win.
type deltaWriter struct {
	out    Deltas
	budget int
}

func (w *deltaWriter) add(addr uint64, r Rule) {
	n := len(w.out)
	if n > 0 && w.out[n-1].Address == addr {
		w.out = w.out[:n-1]
		n--
	}
	if n > 0 && w.out[n-1].Rule == r {
		return
	}
	w.out = append(w.out, Delta{Address: addr, Rule: r})
}

// overlay gives [at, end) rule r within the last rule written, which
// resumes at end; it does nothing if that rule starts after at.
func (w *deltaWriter) overlay(at, end uint64, r Rule) {
	n := len(w.out)
	if n == 0 || w.out[n-1].Address > at {
		return
	}
	prev := w.out[n-1].Rule
	w.add(at, r)
	w.add(end, prev)
}

// maxCgoCallScan bounds the code of runtime.asmcgocall searched for its
// calls into C (about 240 bytes on arm64).
const maxCgoCallScan = 1024

// cgoCalls returns the addresses of f's instructions that are a.cgoCall.
func (a *goArch) cgoCalls(f goFunc, code codeReader) []uint64 {
	if a.cgoCall == 0 || code == nil {
		return nil
	}
	b, err := code(f.entry, min(f.end-f.entry, maxCgoCallScan))
	if err != nil {
		return nil
	}
	var calls []uint64
	for off := 0; off+4 <= len(b); off += 4 {
		if binary.LittleEndian.Uint32(b[off:]) == a.cgoCall {
			calls = append(calls, f.entry+uint64(off))
		}
	}
	return calls
}

// frameInfo is how a function sets up its frame.
type frameInfo struct {
	saved   bool   // FP (and arm64 LR) saved where compiled code saves them
	fpFrom  uint64 // from here on FP points at the frame; 0: never
	framePC uint64 // the first pc with a frame
}

// spDeltas appends f's rules from its pcsp table, and an unknown rule for
// the padding after its code. A stack switcher (see goStackSwitchers)
// gets frame pointer rules where its frame pointer is set, SP rules
// where it has no frame and no rule where neither holds. The calls into C
// at cgoCalls get CFAGoCgo rules.
func (t *pclntab) spDeltas(w *deltaWriter, f goFunc, a *goArch, code codeReader, switcher bool, cgoCalls []uint64) error {
	fi := frameInfo{saved: code == nil && !switcher}
	if f.flag&funcFlagAsm == 0 && !switcher {
		fi.saved = true
	} else if code != nil && f.pcsp != 0 {
		var err error
		if fi, err = t.frameInfo(f, a, code, w); err != nil {
			return err
		}
	}
	if f.pcsp == 0 || (switcher && fi.fpFrom == 0) {
		// Offset 0 is no table (runtime/symtab.go, pcvalue): markers like
		// go:textfipsstart have none.
		w.add(f.entry, Rule{})
		return nil
	}
	it, err := t.pcIter(f.pcsp, f.entry)
	if err != nil {
		return err
	}
	for {
		ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := t.checkStep(&it, f, w); err != nil {
			return err
		}
		switch {
		case it.nextPC == it.pc:
		case it.val < 0:
			// Assembly that pops its return address (syscall's
			// rawVforkSyscall keeps it in a register around vfork).
			w.add(it.pc, Rule{})
		case !switcher || it.val == 0:
			w.add(it.pc, a.rule(it.val, fi.saved))
		case it.pc <= fi.framePC && fi.framePC < it.nextPC:
			w.add(it.pc, a.rule(it.val, fi.saved))
			if fi.fpFrom < it.nextPC {
				w.add(fi.fpFrom, a.fpRule(it.val))
			}
		default:
			w.add(it.pc, a.fpRule(it.val))
		}
		for _, c := range cgoCalls {
			if it.val > 0 && it.pc <= c && c < it.nextPC {
				r := a.rule(it.val, true)
				r.CFA, r.StackSwitch = CFAGoCgo, true
				w.overlay(c, c+4, r)
			}
		}
	}
	if it.nextPC < f.end {
		w.add(it.nextPC, Rule{})
	}
	return nil
}

// checkStep checks a pcsp range against the function and the work budget.
func (t *pclntab) checkStep(it *pcIter, f goFunc, w *deltaWriter) error {
	if w.budget--; w.budget < 0 {
		return fmt.Errorf("pcsp table at %#x: the tables need more steps than the limit", it.off)
	}
	if it.nextPC > f.end || it.nextPC < it.pc {
		return fmt.Errorf("pcsp table at %#x: range [%#x,%#x) runs past the function end %#x", it.off, it.pc, it.nextPC, f.end)
	}
	if it.val > maxSPDelta || it.val < -maxSPDelta {
		return fmt.Errorf("pcsp table at %#x: bad SP delta %d at %#x", it.off, it.val, it.pc)
	}
	return nil
}

// frameInfo finds the first pc with a frame and reads the code around it.
func (t *pclntab) frameInfo(f goFunc, a *goArch, code codeReader, w *deltaWriter) (frameInfo, error) {
	it, err := t.pcIter(f.pcsp, f.entry)
	if err != nil {
		return frameInfo{}, err
	}
	for {
		ok, err := it.next()
		if err != nil || !ok {
			return frameInfo{}, err
		}
		if err := t.checkStep(&it, f, w); err != nil {
			return frameInfo{}, err
		}
		if it.val > 0 && it.nextPC > it.pc {
			break
		}
	}
	fi := frameInfo{framePC: it.pc}
	if it.pc-f.entry < uint64(a.before) {
		return fi, nil
	}
	b, err := code(it.pc-uint64(a.before), uint64(a.before+a.after))
	if err != nil || len(b) != a.before+a.after {
		return fi, nil
	}
	var off uint64
	fi.saved, off = a.frame(b)
	if off > 0 {
		fi.fpFrom = it.pc + off
	}
	return fi, nil
}

package beam

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"

	"golang.org/x/arch/arm64/arm64asm"
	"golang.org/x/arch/x86/x86asm"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Dirty schedulers (internals.md §7) run dirty NIFs and a process's major
// garbage collections from C code: no JIT code is on their threads' stacks
// to hand the unwind over at. What the unwinder needs of them, found in a
// stripped beam.smp's code:
//
//   - the thread functions of dirty CPU and dirty I/O schedulers
//     (sched_dirty_cpu_thread_func, sched_dirty_io_thread_func in
//     erts/emulator/beam/erl_process.c), at the bottom of every dirty
//     scheduler thread's stack: the native unwinder hands over after
//     stepping past their frame, as it does after an eval loop's;
//   - the pthread key under which each scheduler thread keeps its
//     ErtsSchedulerData (erts_get_scheduler_data() is
//     erts_tsd_get(erts_scheduler_data_key), erl_process.c), whose
//     current_process is the process the dirty scheduler runs.
type Dirty struct {
	// ThreadFuncs are the thread functions' addresses (file virtual
	// addresses): dirty CPU, then dirty I/O.
	ThreadFuncs []uint64
	// SchedDataKey is the address of the pthread key (a u32).
	SchedDataKey uint64
}

// ErrNoDirty says the dirty schedulers' code was not found.
var ErrNoDirty = errors.New("beam: dirty scheduler code not found")

// Offset of current_process in ErtsSchedulerData (erl_process.h: after
// registers, timer_wheel, next_tmo_ref, timer_service, tid,
// match_pseudo_process, free_process, thr_progress_data, ssi), measured on
// the dirty CPU scheduler of Debian's OTP 27 and 29 amd64 (the
// ErtsSchedulerData bound to the thread's key named the process being
// collected there, pid <0.80.0>, and nothing else in the struct did).
const esdpCurrentProcess = 0xa8

// Offset of i (ErtsCodePtr, the address the process resumes at) in
// struct process, the same in OTP 27 and 29 (internals.md §7).
const procI = 0xf8

// The names the emulator gives dirty scheduler threads (erts_dcpus_1,
// erts_dios_1; the format strings are in .rodata), passed to the thread
// creation next to the thread function (erts_start_schedulers,
// erl_process.c).
var dirtyThreadNames = []string{"erts_dcpus_%d", "erts_dios_%d"}

// FindDirty finds the dirty schedulers' thread functions and the
// scheduler data key in f (x86_64 and arm64 code).
func FindDirty(f *elf.File) (Dirty, error) {
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 {
		return Dirty{}, fmt.Errorf("%w: %v code is not searched", ErrNoDirty, f.Machine)
	}
	text := f.Section(".text")
	rodata := f.Section(".rodata")
	if text == nil || rodata == nil {
		return Dirty{}, fmt.Errorf("%w: no .text or .rodata", ErrNoDirty)
	}
	code, err := text.Data()
	if err != nil {
		return Dirty{}, fmt.Errorf("beam: reading .text: %w", err)
	}
	ro, err := rodata.Data()
	if err != nil {
		return Dirty{}, fmt.Errorf("beam: reading .rodata: %w", err)
	}
	inText := func(a uint64) bool { return a >= text.Addr && a < text.Addr+text.Size }
	var addrs []armAddr
	if f.Machine == elf.EM_AARCH64 {
		addrs = armAddresses(code, text.Addr)
	}
	var d Dirty
	for _, name := range dirtyThreadNames {
		i := bytes.Index(ro, append([]byte{0}, append([]byte(name), 0)...))
		if i < 0 {
			return Dirty{}, fmt.Errorf("%w: no string %q", ErrNoDirty, name)
		}
		str := rodata.Addr + uint64(i) + 1
		var fn uint64
		if f.Machine == elf.EM_X86_64 {
			fn, err = threadFuncX86(code, text.Addr, str, inText)
		} else {
			fn, err = threadFuncARM64(addrs, str, inText)
		}
		if err != nil {
			return Dirty{}, fmt.Errorf("%w: %s: %v", ErrNoDirty, name, err)
		}
		d.ThreadFuncs = append(d.ThreadFuncs, fn)
	}
	if f.Machine == elf.EM_X86_64 {
		d.SchedDataKey, err = schedDataKeyX86(f, text, code)
	} else {
		d.SchedDataKey, err = schedDataKeyARM64(f, text, code)
	}
	if err != nil {
		return Dirty{}, fmt.Errorf("%w: %v", ErrNoDirty, err)
	}
	return d, nil
}

// armAddr is an address arm64 code forms with adrp + add (at instruction
// index i).
type armAddr struct {
	i    int
	addr uint64
}

// armAddresses lists the addresses code forms with adrp Xn, page then
// add Xd, Xn, #lo (a few instructions apart: the compiler interleaves
// them).
func armAddresses(code []byte, base uint64) []armAddr {
	var out []armAddr
	pages := map[arm64asm.Reg]struct {
		page uint64
		i    int
	}{}
	for i := 0; 4*i+4 <= len(code); i++ {
		in, err := arm64asm.Decode(code[4*i : 4*i+4])
		if err != nil {
			continue
		}
		switch in.Op {
		case arm64asm.ADRP:
			r, isReg := in.Args[0].(arm64asm.Reg)
			rel, isRel := in.Args[1].(arm64asm.PCRel)
			if isReg && isRel {
				pages[r] = struct {
					page uint64
					i    int
				}{uint64(int64((base+4*uint64(i))&^0xfff) + int64(rel)), i}
			}
		case arm64asm.ADD:
			d, dOK := in.Args[0].(arm64asm.RegSP)
			src, sOK := in.Args[1].(arm64asm.RegSP)
			imm, iOK := in.Args[2].(arm64asm.ImmShift)
			if !dOK || !sOK || !iOK {
				continue
			}
			if p, known := pages[arm64asm.Reg(src)]; known && i-p.i <= armPairWindow {
				if v, ok := immValue(imm); ok {
					out = append(out, armAddr{i, p.page + v})
				}
			}
			// Other writes to a paged register are not tracked: the
			// window bounds how long a page is believed.
			delete(pages, arm64asm.Reg(d))
		}
	}
	return out
}

// armPairWindow bounds, in instructions, how far apart an adrp and its
// add may be; armFuncWindow how far from the name's address the thread
// function's is formed (both are hoisted out of the creation loop, next
// to each other: erts_start_schedulers in Debian's 27 and 29).
const (
	armPairWindow = 8
	armFuncWindow = 4
)

// threadFuncARM64 finds where code forms the address of the thread name
// format and returns the one code address formed within armFuncWindow
// instructions of it. Exactly one is wanted.
func threadFuncARM64(addrs []armAddr, name uint64, inText func(uint64) bool) (uint64, error) {
	var found []uint64
	for k, a := range addrs {
		if a.addr != name {
			continue
		}
		var fns []uint64
		for j := max(0, k-armFuncWindow); j < min(len(addrs), k+armFuncWindow+1); j++ {
			b := addrs[j]
			if j != k && b.i >= a.i-armFuncWindow && b.i <= a.i+armFuncWindow && inText(b.addr) {
				fns = append(fns, b.addr)
			}
		}
		if len(fns) == 1 {
			found = append(found, fns[0])
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("%d thread functions named with it, want 1", len(found))
	}
	return found[0], nil
}

// schedDataKeyARM64 is schedDataKeyX86 for arm64: enif_thread_type's
// first bl calls erts_get_scheduler_data, adrp x0, page; ldr w0, [x0,
// #lo]; b (pthread_getspecific or ethr_tsd_get).
func schedDataKeyARM64(f *elf.File, text *elf.Section, code []byte) (uint64, error) {
	entry, err := exported(f, "enif_thread_type")
	if err != nil {
		return 0, err
	}
	inst := func(a uint64) (arm64asm.Inst, bool) {
		if a < text.Addr || a+4 > text.Addr+uint64(len(code)) {
			return arm64asm.Inst{}, false
		}
		in, err := arm64asm.Decode(code[a-text.Addr : a-text.Addr+4])
		return in, err == nil
	}
	var callee uint64
	for a := entry; a < entry+8*4 && callee == 0; a += 4 {
		if in, ok := inst(a); ok && in.Op == arm64asm.BL {
			if rel, isRel := in.Args[0].(arm64asm.PCRel); isRel {
				callee = uint64(int64(a) + int64(rel))
			}
		}
	}
	if callee == 0 {
		return 0, fmt.Errorf("enif_thread_type at %#x calls nothing", entry)
	}
	var page uint64
	var paged bool
	for a := callee; a < callee+4*4; a += 4 {
		in, ok := inst(a)
		if !ok {
			break
		}
		switch in.Op {
		case arm64asm.ADRP:
			if r, isReg := in.Args[0].(arm64asm.Reg); isReg && r == arm64asm.X0 {
				if rel, isRel := in.Args[1].(arm64asm.PCRel); isRel {
					page, paged = uint64(int64(a&^0xfff)+int64(rel)), true
				}
			}
		case arm64asm.LDR:
			d, dOK := in.Args[0].(arm64asm.Reg)
			m, mOK := in.Args[1].(arm64asm.MemImmediate)
			if paged && dOK && mOK && d == arm64asm.W0 && arm64asm.Reg(m.Base) == arm64asm.X0 {
				return writableKey(f, page+uint64(memOffset(m)))
			}
		}
	}
	return 0, fmt.Errorf("erts_get_scheduler_data at %#x does not load w0 from an adrp page", callee)
}

// exported is the address of a defined dynamic symbol.
func exported(f *elf.File, name string) (uint64, error) {
	syms, _ := f.DynamicSymbols()
	for _, s := range syms {
		if s.Name == name && s.Value != 0 {
			return s.Value, nil
		}
	}
	return 0, fmt.Errorf("no %s", name)
}

// writableKey checks that the key's address is in a writable data
// section.
func writableKey(f *elf.File, key uint64) (uint64, error) {
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_WRITE != 0 && s.Flags&elf.SHF_ALLOC != 0 && s.Flags&elf.SHF_EXECINSTR == 0 &&
			key >= s.Addr && key+4 <= s.Addr+s.Size {
			return key, nil
		}
	}
	return 0, fmt.Errorf("the key at %#x is in no writable data section", key)
}

// threadFuncWindow bounds, in instructions decoded linearly, how far after
// the name's lea the thread function's lea may be (OTP 27's compiler
// hoists the name out of the creation loop: 17 instructions apart).
const threadFuncWindow = 24

// threadFuncX86 finds the code that loads the address of the thread name
// format (lea r, [rip+name]) and returns the function whose address it
// loads next into rsi, the thread creation's second argument (lea rsi,
// [rip+fn]), within threadFuncWindow instructions. Exactly one such pair is wanted.
func threadFuncX86(code []byte, base, name uint64, inText func(uint64) bool) (uint64, error) {
	var found []uint64
	for off := 0; off < len(code); {
		in, err := interpreter.DecodeAMD64(code[off:])
		if err != nil || in.Len == 0 {
			off++
			continue
		}
		pc := base + uint64(off)
		off += in.Len
		if a, ok := ripTarget(pc, in, in.Args[1]); !ok || in.Op != x86asm.LEA || a != name {
			continue
		}
		for n, at := 0, off; n < threadFuncWindow && at < len(code); n++ {
			next, err := interpreter.DecodeAMD64(code[at:])
			if err != nil || next.Len == 0 {
				break
			}
			npc := base + uint64(at)
			at += next.Len
			if a, ok := ripTarget(npc, next, next.Args[1]); ok && next.Op == x86asm.LEA &&
				next.Args[0] == x86asm.RSI && inText(a) {
				found = append(found, a)
				break
			}
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("%d thread functions named with it, want 1", len(found))
	}
	return found[0], nil
}

// schedDataKeyX86 reads erts_get_scheduler_data from the exported
// enif_thread_type (erl_nif.c), which calls it first: the callee loads
// the key, mov edi, [rip+key], and jumps to pthread_getspecific (directly
// or through ethr_tsd_get, itself a jump).
func schedDataKeyX86(f *elf.File, text *elf.Section, code []byte) (uint64, error) {
	entry, err := exported(f, "enif_thread_type")
	if err != nil {
		return 0, err
	}
	at := func(a uint64) ([]byte, bool) {
		if a < text.Addr || a >= text.Addr+uint64(len(code)) {
			return nil, false
		}
		return code[a-text.Addr:], true
	}
	// The first call of enif_thread_type.
	c, ok := at(entry)
	var callee uint64
	for n, off := 0, 0; ok && n < 8 && callee == 0; n++ {
		in, err := interpreter.DecodeAMD64(c[off:])
		if err != nil || in.Len == 0 {
			break
		}
		if in.Op == x86asm.CALL {
			if rel, isRel := in.Args[0].(x86asm.Rel); isRel {
				callee = entry + uint64(off+in.Len) + uint64(int64(rel))
			}
		}
		off += in.Len
	}
	if callee == 0 {
		return 0, fmt.Errorf("enif_thread_type at %#x calls nothing", entry)
	}
	c, ok = at(callee)
	if !ok {
		return 0, fmt.Errorf("enif_thread_type calls %#x, outside .text", callee)
	}
	// Its first instruction after endbr64.
	pc := callee
	in, err := interpreter.DecodeAMD64(c)
	if err == nil && in.Op == x86asm.NOP {
		pc += uint64(in.Len)
		in, err = interpreter.DecodeAMD64(c[in.Len:])
	}
	if err != nil {
		return 0, fmt.Errorf("erts_get_scheduler_data at %#x: %w", callee, err)
	}
	key, ok := ripTarget(pc, in, in.Args[1])
	if in.Op != x86asm.MOV || in.Args[0] != x86asm.EDI || !ok {
		return 0, fmt.Errorf("erts_get_scheduler_data at %#x starts with %v, not mov edi, [rip+key]", callee, in)
	}
	return writableKey(f, key)
}

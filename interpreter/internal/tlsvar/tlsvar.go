// Package tlsvar finds where a thread-local variable of an ELF file is,
// from the code of a function that reads it: runtimes keep the state of
// the running thread in one (an execution context, a thread state), and
// their unwinders read it per sample from the thread pointer
// (support/ebpf/tracemgmt.h's tls_variable_address takes a Ref).
//
// The code the compiler and linker leave for each TLS model (Ulrich
// Drepper, "ELF Handling For Thread-Local Storage"; the AArch64 ELF ABI's
// TLS descriptors):
//   - x86_64 executable, local-exec: "mov %fs:OFF,%reg", or "mov $OFF,%r;
//     mov %fs:(%r),%reg": the variable is at the thread pointer + OFF.
//   - x86_64 library, general- or local-dynamic: "lea PAIR(%rip),%rdi;
//     call __tls_get_addr; mov DISP(%rax),%reg": PAIR is a GOT pair (module
//     id, offset in the module's block) that the dynamic loader fills; the
//     variable is at the pair's offset + DISP in the module's block, which
//     the thread's DTV lists.
//   - arm64 library: "adrp xA, page; ldr xB, [xA, #lo]; add x0, xA, #lo;
//     blr xB" calls a TLS descriptor (entry, argument); the variable's
//     offset in the module's block is its R_AARCH64_TLSDESC relocation's.
//   - arm64 executable, local-exec (or a descriptor the linker relaxed to
//     it): "mrs xT, tpidr_el0; add xT, xT, #hi, lsl #12; add xT, xT, #lo;
//     ldr xD, [xT, #off]": the variable is at the thread pointer + the sum.
package tlsvar

import (
	"debug/elf"
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/a64"
)

// Ref says where a thread-local variable is, in the file's virtual
// addresses (the load bias is added to Index, not to Offset).
type Ref struct {
	// Index is 0 for a variable at a constant offset from the thread
	// pointer (static TLS of an executable). Else, on x86_64, the GOT pair
	// (tls_index) whose first word the dynamic loader sets to the module
	// id; on arm64, the TLS descriptor (entry, argument).
	Index uint64
	// Offset is the variable's offset from the thread pointer (Index 0),
	// else in the module's TLS block.
	Offset uint64
}

// maxDecode bounds the instructions decoded per function.
const maxDecode = 256

// Find returns where the thread-local variable is that fn, a function of
// f (dynsym: f's dynamic symbols, for TLS relocations), reads first. On
// arm64 a function that does not read one itself may call one that does
// first: that callee is read too.
func Find(f *elf.File, fn elf.Symbol, dynsym []elf.Symbol) (Ref, error) {
	switch f.Machine {
	case elf.EM_X86_64:
		return findAMD64(f, fn, dynsym)
	case elf.EM_AARCH64:
		return findARM64(f, fn, dynsym)
	}
	return Ref{}, fmt.Errorf("thread-local variables of %v code are not decoded", f.Machine)
}

func findAMD64(f *elf.File, fn elf.Symbol, dynsym []elf.Symbol) (Ref, error) {
	code, err := interpreter.ReadELF(f, fn.Value, min(max(fn.Size, 16), 512))
	if err != nil {
		return Ref{}, err
	}
	var lea, index uint64
	var disp int64
	imm := map[x86asm.Reg]uint64{} // registers loaded with a constant
decode:
	for pc, n := uint64(0), 0; pc < uint64(len(code)) && n < maxDecode; n++ {
		in, err := interpreter.DecodeAMD64(code[pc:])
		if err != nil {
			return Ref{}, fmt.Errorf("%s+%#x: %w", fn.Name, pc, err)
		}
		next := pc + uint64(in.Len)
		pc = next
		m, memSrc := in.Args[1].(x86asm.Mem)
		if index != 0 {
			// After the call: the first load through its result, %rax.
			if in.Op == x86asm.MOV && memSrc && m.Base == x86asm.RAX && m.Index == 0 && m.Segment == 0 {
				disp = m.Disp
				break
			}
			if in.Op == x86asm.RET {
				break
			}
			continue
		}
		if memSrc && in.Op == x86asm.MOV && m.Segment == x86asm.FS && m.Index == 0 {
			if m.Base == 0 {
				return Ref{Offset: uint64(m.Disp)}, nil
			}
			if v, ok := imm[m.Base]; ok {
				return Ref{Offset: v + uint64(m.Disp)}, nil
			}
		}
		if r, ok := in.Args[0].(x86asm.Reg); ok && in.Op == x86asm.MOV {
			if v, ok := in.Args[1].(x86asm.Imm); ok {
				imm[r] = uint64(int64(v))
			} else {
				delete(imm, r)
			}
		}
		switch {
		case in.Op == x86asm.LEA && in.Args[0] == x86asm.RDI:
			if memSrc && m.Base == x86asm.RIP && m.Index == 0 {
				lea = fn.Value + next + uint64(m.Disp)
			}
		case in.Op == x86asm.CALL && lea != 0:
			index = lea
		case in.Op == x86asm.RET:
			break decode
		}
	}
	if index == 0 {
		return Ref{}, fmt.Errorf("%s neither calls __tls_get_addr with a GOT pair nor reads at the thread pointer", fn.Name)
	}
	off, ok, err := relocationAt(f, index+8, uint32(elf.R_X86_64_DTPOFF64), dynsym)
	if err != nil {
		return Ref{}, err
	}
	if !ok {
		b, err := interpreter.ReadELF(f, index+8, 8)
		if err != nil {
			return Ref{}, fmt.Errorf("reading the TLS offset at %#x: %w", index+8, err)
		}
		off = binary.LittleEndian.Uint64(b)
	}
	return Ref{Index: index, Offset: off + uint64(disp)}, nil
}

func findARM64(f *elf.File, fn elf.Symbol, dynsym []elf.Symbol) (Ref, error) {
	start, name := fn.Value, fn.Name
	for hop := 0; hop < 2; hop++ {
		code, err := a64.Code(f, start, min(max(fn.Size, 16), 512))
		if err != nil {
			return Ref{}, err
		}
		var callee, desc uint64
		pages := map[int]uint64{}  // registers holding an ADRP page
		loaded := map[int]uint64{} // registers loaded from page+lo: that address
		tp := map[int]uint64{}     // registers holding the thread pointer + a constant
		arg := uint64(0)           // x0 as page+lo
	decode:
		for _, in := range code {
			if in.Word == a64.Ret {
				break
			}
			if rt, ok := in.MRSThreadPointer(); ok {
				tp[rt] = 0
				continue
			}
			if to, link, ok := in.Branch(); ok {
				if link && callee == 0 {
					callee = to
				}
				continue
			}
			if page, ok := in.ADRP(); ok {
				pages[in.Rd()] = page
				delete(tp, in.Rd())
				continue
			}
			if off, wide, ok := in.LDRImm(); ok {
				if base, ok := tp[in.Rn()]; ok && wide {
					return Ref{Offset: base + off}, nil
				}
				if page, ok := pages[in.Rn()]; ok && wide {
					loaded[in.Rd()] = page + off
				}
				delete(tp, in.Rd())
				continue
			}
			if imm, ok := in.ADDImmShifted(); ok {
				if base, ok := tp[in.Rn()]; ok {
					tp[in.Rd()] = base + imm
					continue
				}
				delete(tp, in.Rd())
				if page, ok := pages[in.Rn()]; ok && in.Rd() == 0 {
					arg = page + imm
				}
				continue
			}
			if in.BLR() && arg != 0 && loaded[in.Rn()] == arg {
				desc = arg
				break decode
			}
		}
		if desc != 0 {
			off, ok, err := relocationAt(f, desc, uint32(elf.R_AARCH64_TLSDESC), dynsym)
			if err != nil {
				return Ref{}, err
			}
			if !ok {
				return Ref{}, fmt.Errorf("no R_AARCH64_TLSDESC relocation at the TLS descriptor %#x", desc)
			}
			return Ref{Index: desc, Offset: off}, nil
		}
		if callee == 0 {
			break
		}
		start, name = callee, fmt.Sprintf("%s's callee at %#x", fn.Name, callee)
	}
	return Ref{}, fmt.Errorf("%s calls no TLS descriptor (adrp; ldr; add x0; blr) and reads nothing at the thread pointer", name)
}

// relocationAt is the value (symbol + addend) of a relocation of type
// typ at slot: for R_X86_64_DTPOFF64 and R_AARCH64_TLSDESC, the offset of
// its symbol (in dynsym) in the module's TLS block.
func relocationAt(f *elf.File, slot uint64, typ uint32, dynsym []elf.Symbol) (uint64, bool, error) {
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_RELA {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			return 0, false, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		for i := 0; i+24 <= len(b); i += 24 {
			info := binary.LittleEndian.Uint64(b[i+8:])
			if binary.LittleEndian.Uint64(b[i:]) != slot || uint32(info) != typ {
				continue
			}
			addend := binary.LittleEndian.Uint64(b[i+16:])
			idx := info >> 32
			if idx == 0 {
				return addend, true, nil
			}
			// Symbol index 0 is the null symbol, which DynamicSymbols omits.
			if idx > uint64(len(dynsym)) {
				return 0, false, fmt.Errorf("TLS relocation against symbol %d of %d", idx, len(dynsym))
			}
			return dynsym[idx-1].Value + addend, true, nil
		}
	}
	return 0, false, nil
}

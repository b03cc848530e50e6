package python

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// The native frames that Python frames replace are those of
// _PyEval_EvalFrameDefault, but its symbol does not always cover its code:
// with profile feedback, GCC moves the blocks it found cold into a
// separate part (_PyEval_EvalFrameDefault.cold in .symtab, nameless once
// stripped) that the function jumps to, and for Debian's python3.14 that is
// where the interpreter loop itself ended up (1 KiB hot, 84 KiB cold). A
// split-off part has an FDE of its own, so evalParts finds the FDEs that
// the function's own code jumps into.

// evalPartMinJumps is how many jumps from the function must land in an FDE
// before it counts as a part of it: scanning x86 code byte by byte also
// finds jumps that are not instructions, and one such stray target could
// fall in another function.
const evalPartMinJumps = 2

// evalParts returns the address ranges of _PyEval_EvalFrameDefault: the
// symbol's, and those of the FDEs (functions, sorted by start) that its
// code jumps into and that no other symbol names.
func evalParts(f *elf.File, in *Interpreter, functions [][2]uint64) ([][2]uint64, error) {
	parts := [][2]uint64{in.EvalFrame}
	code, err := readCode(f, in.EvalFrame)
	if err != nil {
		return parts, err
	}
	named := namedStarts(f)
	hits := map[[2]uint64]int{}
	for _, target := range jumpTargets(f.Machine, in.EvalFrame[0], code) {
		if target >= in.EvalFrame[0] && target < in.EvalFrame[1] {
			continue
		}
		i := interpreter.FunctionAt(functions, target)
		if i < 0 {
			continue
		}
		fn := functions[i]
		if name, ok := named[fn[0]]; ok && !strings.HasPrefix(name, "_PyEval_EvalFrameDefault.") {
			continue
		}
		hits[fn]++
	}
	for fn, n := range hits {
		if n >= evalPartMinJumps && fn != in.EvalFrame {
			parts = append(parts, fn)
		}
	}
	slices.SortFunc(parts, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	return parts, nil
}

// readCode reads the bytes of [r[0], r[1]), at most 1 MiB of them.
func readCode(f *elf.File, r [2]uint64) ([]byte, error) {
	const maxCode = 1 << 20
	n := min(r[1]-r[0], maxCode)
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || r[0] < p.Vaddr || r[0]+n > p.Vaddr+p.Filesz {
			continue
		}
		code := make([]byte, n)
		if _, err := p.ReadAt(code, int64(r[0]-p.Vaddr)); err != nil {
			return nil, fmt.Errorf("reading code at %#x: %w", r[0], err)
		}
		return code, nil
	}
	return nil, fmt.Errorf("code at %#x is in no executable segment", r[0])
}

// namedStarts maps the start of every defined function symbol to its name.
func namedStarts(f *elf.File) map[uint64]string {
	out := map[uint64]string{}
	for _, load := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := load()
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && s.Value != 0 {
				out[s.Value] = s.Name
			}
		}
	}
	return out
}

// jumpTargets returns the targets of the direct jumps in code, which
// starts at addr: x86_64 jmp rel32 and jcc rel32 at every byte offset;
// arm64 B and B.cond.
func jumpTargets(machine elf.Machine, addr uint64, code []byte) []uint64 {
	var out []uint64
	le := binary.LittleEndian
	switch machine {
	case elf.EM_X86_64:
		for i := 0; i+5 <= len(code); i++ {
			switch {
			case code[i] == 0xe9:
				out = append(out, addr+uint64(i)+5+uint64(int64(int32(le.Uint32(code[i+1:])))))
			case code[i] == 0x0f && i+6 <= len(code) && code[i+1]&0xf0 == 0x80:
				out = append(out, addr+uint64(i)+6+uint64(int64(int32(le.Uint32(code[i+2:])))))
			}
		}
	case elf.EM_AARCH64:
		for i := 0; i+4 <= len(code); i += 4 {
			insn := le.Uint32(code[i:])
			pc := addr + uint64(i)
			switch {
			case insn&0xfc000000 == 0x14000000: // B imm26
				out = append(out, pc+uint64(int64(int32(insn<<6)>>6)*4))
			case insn&0xff000010 == 0x54000000: // B.cond imm19
				out = append(out, pc+uint64(int64(int32(insn<<8)>>13)*4))
			}
		}
	}
	return out
}

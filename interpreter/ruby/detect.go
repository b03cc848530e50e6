// Package ruby will unwind CRuby (MRI) stacks. This part reads what a
// libruby (or a static ruby executable) says of itself: its version, the
// range of its instruction loop, where a thread's execution context and
// the global symbol table are. Debian's libruby exports neither the
// thread-local ruby_current_ec (3.3+) nor vm_exec_core nor the symbol
// table, so they are found from the code and data that are exported or
// unmistakable; internals.md says what each step rests on.
package ruby

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/tlsvar"
	"golang.org/x/arch/x86/x86asm"
)

// ErrNotRuby says a file holds no CRuby interpreter.
var ErrNotRuby = errors.New("not a CRuby interpreter")

// Binary is what a libruby says of itself; addresses are the file's
// virtual addresses.
type Binary struct {
	Version interpreter.Version
	// EvalLoop is vm_exec_core, [start, end): the function that runs the
	// instructions of Ruby methods and blocks.
	EvalLoop [2]uint64
	// Exec are the functions that call vm_exec_core (vm_exec, one in
	// Debian's builds): a call of one runs the frames from the one pushed
	// for it, which it may not have entered vm_exec_core for yet.
	Exec [][2]uint64
	// TLSIndex is the GOT pair (tls_index: module id, offset) through
	// which the library reaches ruby_current_ec, the running thread's
	// rb_execution_context_t: the dynamic loader writes the module id
	// there, and TLSOffset is the variable's offset in the module's block.
	// On arm64 it is the TLS descriptor (entry, argument) instead, whose
	// argument the dynamic loader sets (internals.md §12.4).
	// A ruby executable with the interpreter linked in (local-exec TLS)
	// has no GOT pair: TLSIndex is 0 and TLSOffset the variable's offset
	// from the thread pointer (negative, two's complement).
	TLSIndex  uint64
	TLSOffset uint64
	// GlobalSymbols is ruby_global_symbols, the table of IDs' names.
	GlobalSymbols uint64
	// Text is the file's executable segment, [start, end): JIT code
	// returns into it.
	Text [2]uint64
}

// Symbols every CRuby 3.x exports (internals.md §1.3, §9): the version
// string, the table of instruction lengths (one byte per instruction,
// whose count finds the instruction loop), the function whose code shows
// where ruby_current_ec is, and the one that reads the symbol table.
const (
	versionSymbol       = "ruby_version"
	insnLenSymbol       = "rb_vm_insn_len_info"
	threadCurrentSymbol = "rb_thread_current"
	id2strSymbol        = "rb_id2str"
)

// Detect reads a CRuby interpreter's facts from f, whose exported symbols
// are dynsym and whose functions are functionRanges (nativeunwind's FDE
// ranges, sorted by start). Other files give ErrNotRuby.
func Detect(f *elf.File, dynsym []elf.Symbol, functionRanges func() ([][2]uint64, error)) (*Binary, error) {
	syms := map[string]elf.Symbol{}
	for _, s := range dynsym {
		switch s.Name {
		case versionSymbol, insnLenSymbol, threadCurrentSymbol, id2strSymbol:
			if s.Section != elf.SHN_UNDEF {
				syms[s.Name] = s
			}
		}
	}
	vs, ok1 := syms[versionSymbol]
	ls, ok2 := syms[insnLenSymbol]
	if !ok1 || !ok2 {
		return nil, ErrNotRuby
	}
	arm64 := f.Machine == elf.EM_AARCH64
	if f.Machine != elf.EM_X86_64 && !arm64 {
		return nil, fmt.Errorf("CRuby on %v: only x86_64 and arm64 are supported", f.Machine)
	}
	b := &Binary{}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && b.Text[1] == 0 {
			b.Text = [2]uint64{p.Vaddr, p.Vaddr + p.Memsz}
		}
	}
	var err error
	if b.Version, err = readVersion(f, vs.Value); err != nil {
		return nil, err
	}
	ranges, err := functionRanges()
	if err != nil {
		return nil, fmt.Errorf("CRuby %v: function ranges: %w", b.Version, err)
	}
	if b.EvalLoop, err = findEvalLoop(f, int(ls.Size), ranges); err != nil {
		return nil, fmt.Errorf("CRuby %v: %w", b.Version, err)
	}
	callers := findCallers
	if arm64 {
		callers = findCallersARM64
	}
	if b.Exec, err = callers(f, b.EvalLoop[0], ranges); err != nil {
		return nil, fmt.Errorf("CRuby %v: callers of vm_exec_core: %w", b.Version, err)
	}
	tc, ok := syms[threadCurrentSymbol]
	if !ok {
		return nil, fmt.Errorf("CRuby %v: no %s", b.Version, threadCurrentSymbol)
	}
	// rb_thread_current, or on arm64 the function it calls first
	// (rb_current_ec, 3.3+), reads ruby_current_ec (internals.md §1.4,
	// §12.4).
	ec, err := tlsvar.Find(f, tc, dynsym)
	if err != nil {
		return nil, fmt.Errorf("CRuby %v: execution context: %w", b.Version, err)
	}
	b.TLSIndex, b.TLSOffset = ec.Index, ec.Offset
	id2str, ok := syms[id2strSymbol]
	if !ok {
		return nil, fmt.Errorf("CRuby %v: no %s", b.Version, id2strSymbol)
	}
	globals := findGlobalSymbols
	if arm64 {
		globals = findGlobalSymbolsARM64
	}
	if b.GlobalSymbols, err = globals(f, id2str, ranges); err != nil {
		return nil, fmt.Errorf("CRuby %v: symbol table: %w", b.Version, err)
	}
	return b, nil
}

// readVersion parses the NUL-terminated "X.Y.Z" at addr.
func readVersion(f *elf.File, addr uint64) (interpreter.Version, error) {
	b, err := interpreter.ReadELF(f, addr, 16)
	if err != nil {
		return interpreter.Version{}, fmt.Errorf("reading %s: %w", versionSymbol, err)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	parts := strings.Split(string(b), ".")
	var v [3]int
	for i := range v {
		if len(parts) != 3 {
			break
		}
		v[i], err = strconv.Atoi(parts[i])
		if err != nil || v[i] < 0 || v[i] > 999 {
			err = errors.New("not a number")
			break
		}
	}
	if len(parts) != 3 || err != nil {
		return interpreter.Version{}, fmt.Errorf("%s is %q, not a version", versionSymbol, b)
	}
	return interpreter.Version{Major: v[0], Minor: v[1], Patch: v[2]}, nil
}

// findEvalLoop finds vm_exec_core through its table of instruction
// addresses (insns_address_table, with direct threading, which GCC builds
// use): insns pointers in a row, all into one function. No other table of
// a libruby is as long and points into one function (internals.md; 202,
// 204 and 220 entries in Debian's 3.1, 3.3 and 3.4). A shared library
// holds the table as relative relocations, an executable as addresses.
func findEvalLoop(f *elf.File, insns int, ranges [][2]uint64) ([2]uint64, error) {
	if insns < 64 {
		return [2]uint64{}, fmt.Errorf("%s has %d instructions, too few for a VM", insnLenSymbol, insns)
	}
	rangeOf := func(a uint64) int { return interpreter.FunctionAt(ranges, a) }
	ptrs, err := codePointers(f)
	if err != nil {
		return [2]uint64{}, err
	}
	// The longest run of consecutive slots into one function.
	best, bestRange := 0, -1
	for i := 0; i < len(ptrs); {
		r := rangeOf(ptrs[i].target)
		j := i
		for j+1 < len(ptrs) && ptrs[j+1].slot == ptrs[j].slot+8 && r >= 0 && rangeOf(ptrs[j+1].target) == r {
			j++
		}
		if n := j - i + 1; r >= 0 && n > best {
			best, bestRange = n, r
		}
		i = j + 1
	}
	if best != insns {
		return [2]uint64{}, fmt.Errorf("no instruction table of %d entries (the longest is %d)", insns, best)
	}
	return ranges[bestRange], nil
}

// maxCallers bounds the functions findCallers accepts: vm_exec_core has
// one caller in every build seen, a compiler's clones would add a few.
const maxCallers = 4

// findCallers finds the functions that call target directly: each
// "call rel32" (0xe8) byte pattern in the executable segments that lands
// on target, confirmed by decoding its function from the start up to it.
func findCallers(f *elf.File, target uint64, ranges [][2]uint64) ([][2]uint64, error) {
	var out [][2]uint64
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		code := make([]byte, p.Filesz)
		if _, err := p.ReadAt(code, 0); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		for i := 0; i+5 <= len(code); i++ {
			if code[i] != 0xe8 {
				continue
			}
			at := p.Vaddr + uint64(i)
			if at+5+uint64(int64(int32(binary.LittleEndian.Uint32(code[i+1:])))) != target {
				continue
			}
			r := interpreter.FunctionAt(ranges, at)
			if r < 0 || slices.Contains(out, ranges[r]) || !callAt(f, ranges[r], at) {
				continue
			}
			if out = append(out, ranges[r]); len(out) > maxCallers {
				return nil, fmt.Errorf("more than %d functions call %#x", maxCallers, target)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no function calls %#x", target)
	}
	return out, nil
}

// callAt says whether decoding function fn from its start meets a call
// instruction at address at.
func callAt(f *elf.File, fn [2]uint64, at uint64) bool {
	code, err := interpreter.ReadELF(f, fn[0], at+5-fn[0])
	if err != nil {
		return false
	}
	for pc := uint64(0); pc < uint64(len(code)); {
		in, err := interpreter.DecodeAMD64(code[pc:])
		if err != nil {
			return false
		}
		if fn[0]+pc == at {
			return in.Op == x86asm.CALL
		}
		pc += uint64(in.Len)
	}
	return false
}

// codePointer is a pointer the file keeps at slot.
type codePointer struct{ slot, target uint64 }

// codePointers lists, by slot, the pointers a shared library's dynamic
// relocations make (R_X86_64_RELATIVE, R_AARCH64_RELATIVE) or, in an executable, the aligned
// words of its read-only data after relocation that could be addresses.
func codePointers(f *elf.File) ([]codePointer, error) {
	var out []codePointer
	if f.Type == elf.ET_DYN {
		relative := uint64(elf.R_X86_64_RELATIVE)
		if f.Machine == elf.EM_AARCH64 {
			relative = uint64(elf.R_AARCH64_RELATIVE)
		}
		for _, sec := range f.Sections {
			if sec.Type != elf.SHT_RELA {
				continue
			}
			b, err := sec.Data()
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", sec.Name, err)
			}
			for i := 0; i+24 <= len(b); i += 24 {
				info := binary.LittleEndian.Uint64(b[i+8:])
				if info&0xffffffff == relative {
					out = append(out, codePointer{binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+16:])})
				}
			}
		}
	} else {
		for _, name := range []string{".data.rel.ro", ".rodata", ".data"} {
			sec := f.Section(name)
			if sec == nil || sec.Type != elf.SHT_PROGBITS {
				continue
			}
			b, err := sec.Data()
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", name, err)
			}
			for i := (8 - sec.Addr%8) % 8; i+8 <= uint64(len(b)); i += 8 {
				out = append(out, codePointer{sec.Addr + i, binary.LittleEndian.Uint64(b[i:])})
			}
		}
	}
	slices.SortFunc(out, func(a, b codePointer) int { return cmp.Compare(a.slot, b.slot) })
	return out, nil
}

// maxDecode bounds the instructions decoded per function.
const maxDecode = 256

// findGlobalSymbols finds ruby_global_symbols from rb_id2str: it, or the
// function it jumps or calls to first (get_id_serial_entry), compares the
// ID's serial with the table's first field, last_id, read RIP-relative
// (internals.md §7). The functions are read to their end, as their FDEs
// say: 3.4's puts an early return before the comparison.
func findGlobalSymbols(f *elf.File, fn elf.Symbol, ranges [][2]uint64) (uint64, error) {
	start, name := fn.Value, fn.Name
	for hop := 0; hop < 2; hop++ {
		size := uint64(512)
		for _, r := range ranges {
			if r[0] <= start && start < r[1] {
				size = min(r[1]-start, 4096)
			}
		}
		code, err := interpreter.ReadELF(f, start, size)
		if err != nil {
			return 0, err
		}
		var callee uint64
		for pc, n := uint64(0), 0; pc < uint64(len(code)) && n < maxDecode; n++ {
			in, err := interpreter.DecodeAMD64(code[pc:])
			if err != nil {
				return 0, fmt.Errorf("%s+%#x: %w", name, pc, err)
			}
			next := pc + uint64(in.Len)
			if in.Op == x86asm.CMP {
				for _, a := range in.Args[:2] {
					if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP && m.Index == 0 && in.MemBytes == 4 {
						return start + next + uint64(m.Disp), nil
					}
				}
			}
			if rel, ok := in.Args[0].(x86asm.Rel); ok && (in.Op == x86asm.JMP || in.Op == x86asm.CALL) && callee == 0 {
				callee = start + next + uint64(int64(rel))
			}
			pc = next
		}
		if callee == 0 {
			break
		}
		start, name = callee, fmt.Sprintf("%s's callee at %#x", fn.Name, callee)
	}
	return 0, fmt.Errorf("no comparison with the table's last_id in %s or its callee", fn.Name)
}

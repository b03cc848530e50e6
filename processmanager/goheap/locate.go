package goheap

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// Program is where a Go executable keeps its heap profile: file virtual
// addresses of the runtime's globals, and its release.
type Program struct {
	// Minor is the Go release's minor version (1.Minor).
	Minor int
	// Buckets is runtime.mbuckets, the bucket list's head.
	Buckets uint64
	// Cycle is runtime.mProfCycle (1.19+: the cycle number shifted left
	// by one, the low bit set once it was flushed), or 1.18's
	// runtime.mProf (the cycle, a uint32, then the flushed bool).
	Cycle uint64
	// Rate is runtime.MemProfileRate: bytes per sampled allocation on
	// average, 0 when memory profiling is off (the linker turns it off in
	// programs that cannot read their profile).
	Rate uint64
}

// maxFunctionBytes bounds the code decoded of one runtime function.
const maxFunctionBytes = 8 << 10

// Locate finds the heap profile of the Go executable r reads: from its symbol table, or
// in a stripped binary from the code of the runtime functions that use
// each global (named by the pclntab, which Go keeps): the first global
// runtime.mProf_FlushLocked reads is the bucket list, the first
// runtime.mProf_Free reads the cycle, and the one global both
// runtime.profilealloc and runtime.allocmcache read is the rate.
func Locate(r io.ReaderAt) (Program, error) {
	var p Program
	f, err := elf.NewFile(r)
	if err != nil {
		return p, err
	}
	bi, err := buildinfo.Read(r)
	if err != nil {
		return p, fmt.Errorf("not a Go program: %w", err)
	}
	if p.Minor, err = goMinor(bi.GoVersion); err != nil {
		return p, err
	}
	if _, err := LayoutFor(p.Minor); err != nil {
		return p, err
	}
	cycleSym := "runtime.mProfCycle"
	if p.Minor == 18 {
		cycleSym = "runtime.mProf"
	}
	if syms, err := f.Symbols(); err == nil {
		for _, s := range syms {
			switch s.Name {
			case "runtime.mbuckets":
				p.Buckets = s.Value
			case cycleSym:
				p.Cycle = s.Value
			case "runtime.MemProfileRate":
				p.Rate = s.Value
			}
		}
		if p.Buckets != 0 && p.Cycle != 0 && p.Rate != 0 {
			return p, nil
		}
	}
	return p, locateInCode(f, &p)
}

// locateInCode fills in p's addresses from the runtime's code.
func locateInCode(f *elf.File, p *Program) error {
	gs, err := nativeunwind.ReadGoSymbols(f, nil)
	if err != nil {
		return err
	}
	refs := map[string][]uint64{}
	for i := range gs.Len() {
		fn, err := gs.Func(i)
		if err != nil {
			continue
		}
		switch fn.Name {
		case "runtime.mProf_FlushLocked", "runtime.mProf_Free", "runtime.profilealloc", "runtime.allocmcache":
			code, err := interpreter.ReadELF(f, fn.Entry, min(fn.End-fn.Entry, maxFunctionBytes))
			if err != nil {
				return fmt.Errorf("reading %s: %w", fn.Name, err)
			}
			refs[fn.Name] = dataRefs(f.Machine, fn.Entry, code)
		}
	}
	first := func(name string) (uint64, error) {
		if len(refs[name]) == 0 {
			return 0, fmt.Errorf("%s reads no global (Go 1.%d)", name, p.Minor)
		}
		return refs[name][0], nil
	}
	if p.Buckets, err = first("runtime.mProf_FlushLocked"); err != nil {
		return err
	}
	if p.Cycle, err = first("runtime.mProf_Free"); err != nil {
		return err
	}
	var common []uint64
	for _, a := range refs["runtime.profilealloc"] {
		for _, b := range refs["runtime.allocmcache"] {
			if a == b && (len(common) == 0 || common[len(common)-1] != a) {
				common = append(common, a)
			}
		}
	}
	if len(common) != 1 {
		return fmt.Errorf("runtime.profilealloc and runtime.allocmcache share %d globals, not one (Go 1.%d)", len(common), p.Minor)
	}
	p.Rate = common[0]
	return nil
}

// goMinor parses "go1.26.8" (and "go1.27rc1", "go1.27.3 X:…").
func goMinor(v string) (int, error) {
	rest, ok := strings.CutPrefix(v, "go1.")
	if !ok {
		return 0, fmt.Errorf("Go version %q", v)
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	minor, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0, fmt.Errorf("Go version %q", v)
	}
	return minor, nil
}

// dataRefs lists, in order, the addresses code (at addr) takes of data:
// RIP-relative operands on x86_64; ADRP followed by an ADD or a load on
// the same register on arm64.
func dataRefs(machine elf.Machine, addr uint64, code []byte) []uint64 {
	var out []uint64
	switch machine {
	case elf.EM_X86_64:
		for off := 0; off < len(code); {
			inst, err := interpreter.DecodeAMD64(code[off:])
			if err != nil || inst.Len == 0 {
				off++
				continue
			}
			next := addr + uint64(off+inst.Len)
			for _, a := range inst.Args {
				if m, ok := a.(x86asm.Mem); ok && m.Base == x86asm.RIP && inst.Op != x86asm.CALL && inst.Op != x86asm.JMP {
					out = append(out, uint64(int64(next)+m.Disp))
				}
			}
			off += inst.Len
		}
	case elf.EM_AARCH64:
		var page [32]uint64
		var valid [32]bool
		le := binary.LittleEndian
		for off := 0; off+4 <= len(code); off += 4 {
			w := le.Uint32(code[off:])
			pc := addr + uint64(off)
			rd, rn := w&31, w>>5&31
			switch {
			case w&0x9f000000 == 0x90000000: // ADRP
				imm := int64(w>>29&3|(w>>5&0x7ffff)<<2) << 12
				imm = imm << 31 >> 31 // sign-extend 33 bits
				page[rd], valid[rd] = uint64(int64(pc&^0xfff)+imm), true
			case w&0xffc00000 == 0x91000000 && valid[rn]: // ADD Xd, Xn, #imm12
				out = append(out, page[rn]+uint64(w>>10&0xfff))
				valid[rn] = false
			case w&0xffc00000 == 0xf9400000 && valid[rn]: // LDR Xt, [Xn, #imm12*8]
				out = append(out, page[rn]+uint64(w>>10&0xfff)*8)
				valid[rn] = false
			case w&0xffc00000 == 0xb9400000 && valid[rn]: // LDR Wt, [Xn, #imm12*4]
				out = append(out, page[rn]+uint64(w>>10&0xfff)*4)
				valid[rn] = false
			}
		}
	}
	return out
}

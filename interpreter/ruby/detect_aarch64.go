package ruby

import (
	"debug/elf"
	"fmt"
	"slices"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/a64"
)

// The arm64 side of Detect (internals.md §12): the same facts found in
// A64 code (package a64 decodes the instructions read).

// findCallersARM64 finds the functions with a BL to target (A64's fixed
// width leaves no instruction boundary to confirm; a tail B from the
// boot-time table stub is not a call).
func findCallersARM64(f *elf.File, target uint64, ranges [][2]uint64) ([][2]uint64, error) {
	var out [][2]uint64
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		code, err := a64.Code(f, p.Vaddr&^3, p.Filesz)
		if err != nil {
			return nil, err
		}
		for _, in := range code {
			if to, link, ok := in.Branch(); !ok || !link || to != target {
				continue
			}
			r := interpreter.FunctionAt(ranges, in.PC)
			if r < 0 || slices.Contains(out, ranges[r]) {
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

// findGlobalSymbolsARM64 finds ruby_global_symbols from rb_id2str, or the
// function it branches to first (get_id_serial_entry): the first 32-bit
// load from an ADRP page that a CMP Wn, Wm then reads is last_id, the
// table's first field (internals.md §12.5). 64-bit loads from pages are
// GOT entries.
func findGlobalSymbolsARM64(f *elf.File, fn elf.Symbol, ranges [][2]uint64) (uint64, error) {
	start := fn.Value
	for hop := 0; hop < 2; hop++ {
		size := uint64(512)
		for _, r := range ranges {
			if r[0] <= start && start < r[1] {
				size = min(r[1]-start, 4096)
			}
		}
		code, err := a64.Code(f, start, size)
		if err != nil {
			return 0, err
		}
		var callee uint64
		pages := map[int]uint64{}
		for i, in := range code {
			if to, _, ok := in.Branch(); ok {
				if callee == 0 {
					callee = to
				}
				continue
			}
			if page, ok := in.ADRP(); ok {
				pages[in.Rd()] = page
				continue
			}
			off, wide, ok := in.LDRImm()
			page, fromPage := pages[in.Rn()]
			if !ok || wide || !fromPage {
				continue
			}
			// Compared within the next few instructions.
			for _, next := range code[i+1 : min(i+6, len(code))] {
				if n, m, ok := next.CmpW(); ok && (n == in.Rd() || m == in.Rd()) {
					return page + off, nil
				}
			}
		}
		if callee == 0 {
			break
		}
		start = callee
	}
	return 0, fmt.Errorf("no comparison with the table's last_id in %s or its callee", fn.Name)
}

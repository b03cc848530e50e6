package nativeunwind

import (
	"debug/elf"
	"fmt"
	"slices"
)

// FunctionRanges returns the address range, [start, end), of every FDE in
// f's .eh_frame (or, if it has none, .debug_frame), sorted by start. An FDE
// describes one function, or one part of a function the compiler split
// into hot and cold parts: unlike symbols, FDEs survive stripping.
func FunctionRanges(f *elf.File) ([][2]uint64, error) {
	arch := archFor(f.Machine)
	if arch == nil || f.Class != elf.ELFCLASS64 {
		return nil, fmt.Errorf("%w: %v %v", ErrUnsupportedArch, f.Class, f.Machine)
	}
	for _, name := range []string{".eh_frame", ".debug_frame"} {
		sec, err := cfiSectionOf(elfImage{f: f}, name, arch)
		if err != nil {
			return nil, err
		}
		if sec == nil {
			continue
		}
		var out [][2]uint64
		st := Stats{Unsupported: map[string]int{}}
		err = sec.forEachFDE(&st, func(fd *fde) error {
			if fd.end > fd.start {
				out = append(out, [2]uint64{fd.start, fd.end})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		slices.SortFunc(out, func(a, b [2]uint64) int { return cmpUint(a[0], b[0]) })
		return out, nil
	}
	return nil, nil
}

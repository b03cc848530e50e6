// Package elftls computes where an executable's thread-local variables
// are: the executable's TLS block (its PT_TLS segment) is at a fixed
// offset from every thread's pointer, whatever code reads it.
package elftls

import (
	"debug/elf"
	"fmt"
)

// Segment is the file's PT_TLS segment, nil when it has none.
func Segment(f *elf.File) *elf.Prog {
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS {
			return p
		}
	}
	return nil
}

// ExecutableOffset is the offset from the thread pointer of the variable
// at value in an executable's TLS segment. On x86_64 (TLS variant II) the
// block ends at the thread pointer: value minus the segment's size
// rounded up to its alignment. On arm64 (variant I) it starts past the
// 16-byte thread control block, rounded up to the alignment.
func ExecutableOffset(machine elf.Machine, tls *elf.Prog, value uint64) (int64, error) {
	align := max(tls.Align, 1)
	switch machine {
	case elf.EM_X86_64:
		return int64(value) - int64(roundUp(tls.Memsz, align)), nil
	case elf.EM_AARCH64:
		return int64(roundUp(16, align) + value), nil
	}
	return 0, fmt.Errorf("static TLS of %v code is not known", machine)
}

func roundUp(n, align uint64) uint64 { return (n + align - 1) / align * align }

// IsExecutable says whether f is a program rather than a library: a
// non-PIE executable, a PIE (DF_1_PIE), or one with an interpreter.
func IsExecutable(f *elf.File) bool {
	if f.Type == elf.ET_EXEC {
		return true
	}
	if flags, err := f.DynValue(elf.DT_FLAGS_1); err == nil && len(flags) > 0 && flags[0]&uint64(elf.DF_1_PIE) != 0 {
		return true
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

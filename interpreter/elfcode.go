package interpreter

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"runtime"

	"golang.org/x/arch/x86/x86asm"
)

// endbr64 starts functions built with control-flow protection; x86asm
// does not know it.
var endbr64 = []byte{0xf3, 0x0f, 0x1e, 0xfa}

// DecodeAMD64 decodes the x86_64 instruction code starts with (endbr64 as
// a NOP), for runtimes that find what they need in a function's code.
func DecodeAMD64(code []byte) (x86asm.Inst, error) {
	if bytes.HasPrefix(code, endbr64) {
		return x86asm.Inst{Op: x86asm.NOP, Len: len(endbr64)}, nil
	}
	return x86asm.Decode(code, 64)
}

// ReadELF reads up to n bytes at virtual address addr of f's loaded
// segments (fewer where the segment's file contents end).
func ReadELF(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr >= p.Vaddr+p.Filesz {
			continue
		}
		n = min(n, p.Vaddr+p.Filesz-addr)
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(addr-p.Vaddr)); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x is not in the file", addr)
}

// HostMachine is the ELF machine of the architecture the daemon runs on,
// whose processes it unwinds: EM_X86_64 or EM_AARCH64 (EM_NONE on any
// other).
func HostMachine() elf.Machine {
	switch runtime.GOARCH {
	case "amd64":
		return elf.EM_X86_64
	case "arm64":
		return elf.EM_AARCH64
	}
	return elf.EM_NONE
}

// CheckMachine says why runtime name's BPF unwinder cannot unwind a file:
// it is built for another architecture than the host's, or the host is
// neither x86_64 nor arm64, the two the unwinders know. Nil if it can.
func CheckMachine(name string, f *File) error {
	host := HostMachine()
	switch {
	case host == elf.EM_NONE:
		return fmt.Errorf("%s frames are unwound on x86_64 and arm64 only, not on %s", name, runtime.GOARCH)
	case f.ELF.Machine != host:
		return fmt.Errorf("%s: %s is built for %v, not for this host's %v", name, f.Path, f.ELF.Machine, host)
	}
	return nil
}

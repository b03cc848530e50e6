// Package php unwinds PHP (Zend Engine 8.0-8.4) stacks: it finds the
// engine in the CLI, php-fpm or the Apache module, describes each process
// to the BPF unwinder (support/ebpf/php.ebpf.c) and names its frames
// Class::method or function with file and line. internals.md says what
// every offset and rule rests on.
package php

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"golang.org/x/arch/x86/x86asm"
)

// ErrNotPHP says a file holds no PHP engine.
var ErrNotPHP = errors.New("not a PHP engine")

// Binary is what a PHP engine's file says of itself; addresses are the
// file's virtual addresses.
type Binary struct {
	Version interpreter.Version
	// ExecutorGlobals is executor_globals, the engine's state (EG).
	ExecutorGlobals uint64
	// ExecuteEx is execute_ex, [start, end): the VM loop.
	ExecuteEx [2]uint64
	// JITReturn is the address in execute_ex just past its first dispatch
	// (x86_64 jmp *(%r15), arm64 ldr xN, [x28]; br xN), where the body's
	// stack frame is set up: OPcache's JIT code runs in that frame and is
	// unwound as if from here. 0 if not found.
	JITReturn uint64
	// BodyFrameRecord is, on arm64, where the body's frame record is above
	// its stack pointer (x29 - sp, from the prologue's add x29, sp, #imm):
	// JIT code there moves sp (no red zone), so the unwinder takes the
	// body's sp from x29. 0 on x86_64, whose JIT code leaves rsp alone.
	BodyFrameRecord uint64
	// ThreadSafe: a ZTS build, whose globals are per thread (not
	// supported).
	ThreadSafe bool
}

// poweredBy precedes the version in every SAPI's read-only data.
var poweredBy = []byte("X-Powered-By: PHP/")

// Detect reads a PHP engine's file: one that defines execute_ex and
// executor_globals (or, built thread-safe, executor_globals_offset).
func Detect(f *elf.File, dynsym []elf.Symbol) (*Binary, error) {
	var b Binary
	var haveLoop, haveGlobals bool
	for _, s := range dynsym {
		if s.Section == elf.SHN_UNDEF {
			continue
		}
		switch s.Name {
		case "execute_ex":
			b.ExecuteEx = [2]uint64{s.Value, s.Value + s.Size}
			haveLoop = s.Size > 0 && elf.ST_TYPE(s.Info) == elf.STT_FUNC
		case "executor_globals":
			b.ExecutorGlobals = s.Value
			haveGlobals = true
		case "executor_globals_offset":
			b.ThreadSafe = true
		}
	}
	if !haveLoop || !(haveGlobals || b.ThreadSafe) {
		return nil, ErrNotPHP
	}
	v, err := readVersion(f)
	if err != nil {
		return nil, err
	}
	b.Version = v
	switch f.Machine {
	case elf.EM_X86_64:
		b.JITReturn, err = findDispatchAMD64(f, b.ExecuteEx)
	case elf.EM_AARCH64:
		b.JITReturn, b.BodyFrameRecord, err = findDispatchARM64(f, b.ExecuteEx)
	}
	if err != nil {
		return nil, err
	}
	return &b, nil
}

// readVersion finds "X-Powered-By: PHP/8.2.36" in the read-only data.
func readVersion(f *elf.File) (interpreter.Version, error) {
	sec := f.Section(".rodata")
	if sec == nil {
		return interpreter.Version{}, errors.New("PHP engine without .rodata: no version")
	}
	// A read-only data section of a PHP build is a few MiB.
	if sec.Size > 64<<20 {
		return interpreter.Version{}, fmt.Errorf("PHP engine's .rodata is %d bytes", sec.Size)
	}
	data, err := sec.Data()
	if err != nil {
		return interpreter.Version{}, fmt.Errorf("reading .rodata: %w", err)
	}
	i := bytes.Index(data, poweredBy)
	if i < 0 {
		return interpreter.Version{}, errors.New("PHP engine without a version string")
	}
	rest := data[i+len(poweredBy):]
	if end := bytes.IndexByte(rest, 0); end >= 0 {
		rest = rest[:end]
	}
	return parseVersion(string(rest))
}

// parseVersion parses "8.2.36" (a suffix such as "-dev" or "RC1" after the
// patch number is ignored).
func parseVersion(s string) (interpreter.Version, error) {
	var parts [3]int
	for i := range parts {
		n := 0
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		v, err := strconv.Atoi(s[:n])
		if err != nil || n > 4 {
			return interpreter.Version{}, fmt.Errorf("PHP version %q", s)
		}
		parts[i] = v
		s = s[n:]
		if i < 2 {
			if len(s) == 0 || s[0] != '.' {
				return interpreter.Version{}, fmt.Errorf("PHP version %q", s)
			}
			s = s[1:]
		}
	}
	return interpreter.Version{Major: parts[0], Minor: parts[1], Patch: parts[2]}, nil
}

// dispatchScan bounds the instructions of execute_ex's start searched for
// its first dispatch (the x86_64 8.2 and 8.4 builds have it at the 15th
// and 20th, the arm64 ones at the 22nd and 33rd).
const dispatchScan = 64

// findDispatchAMD64 finds the first jmp *(%r15) in the loop (the hybrid
// VM's dispatch to the first handler) and returns the address after it; 0
// when there is none (not the hybrid VM).
func findDispatchAMD64(f *elf.File, fn [2]uint64) (uint64, error) {
	code, err := interpreter.ReadELF(f, fn[0], min(fn[1]-fn[0], 16*dispatchScan))
	if err != nil {
		return 0, fmt.Errorf("reading execute_ex: %w", err)
	}
	for off, n := 0, 0; off < len(code) && n < dispatchScan; n++ {
		inst, err := interpreter.DecodeAMD64(code[off:])
		if err != nil {
			return 0, nil
		}
		off += inst.Len
		if inst.Op != x86asm.JMP {
			continue
		}
		if m, ok := inst.Args[0].(x86asm.Mem); ok && m.Base == x86asm.R15 && m.Index == 0 && m.Disp == 0 {
			return fn[0] + uint64(off), nil
		}
	}
	return 0, nil
}

// A64 encodings (Arm ARM): LDR Xt, [X28] (unsigned offset 0), BR Xn and
// ADD X29, SP, #imm12 (unshifted); the low 5 bits are Xt, bits 5-9 Xn.
const (
	a64LdrX28     = 0xf9400380
	a64Br         = 0xd61f0000
	a64AddX29SP   = 0x910003fd
	a64AddImmMask = 0xffc003ff
)

// findDispatchARM64 finds the loop's first ldr xN, [x28]; br xN (x28 is
// the opline register), and the prologue's add x29, sp, #imm before it;
// it returns the address after the br and imm, or 0s when either is
// missing (not the hybrid VM).
func findDispatchARM64(f *elf.File, fn [2]uint64) (uint64, uint64, error) {
	code, err := interpreter.ReadELF(f, fn[0], min(fn[1]-fn[0], 4*dispatchScan))
	if err != nil {
		return 0, 0, fmt.Errorf("reading execute_ex: %w", err)
	}
	var record uint64
	le := binary.LittleEndian
	for off := 0; off+8 <= len(code); off += 4 {
		w := le.Uint32(code[off:])
		if w&a64AddImmMask == a64AddX29SP {
			record = uint64(w >> 10 & 0xfff)
		}
		if w&^0x1f == a64LdrX28 && le.Uint32(code[off+4:]) == a64Br|(w&0x1f)<<5 {
			if record == 0 {
				return 0, 0, nil
			}
			return fn[0] + uint64(off) + 8, record, nil
		}
	}
	return 0, 0, nil
}

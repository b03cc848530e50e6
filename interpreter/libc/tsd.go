package libc

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A runtime that keeps its thread state behind a pthread key
// finds a thread's state as the value the thread bound to that key, so its
// BPF program must do what pthread_getspecific does, from the task's thread
// pointer (x86_64: fsbase; arm64: tpidr_el0). Where the C library keeps
// that per-thread data is private to it and differs between versions and
// architectures, so this file learns it from the code of the
// pthread_getspecific the process maps, which tsd_x86.go and
// tsd_aarch64.go decode (the shared symbolic machine is in tsd_decode.go).

// ErrNoGetspecific says a file does not define pthread_getspecific: glibc
// before 2.34 keeps it in libpthread.so.0, not in libc.so.6.
var ErrNoGetspecific = errors.New("no pthread_getspecific")

// ErrTSDCode says pthread_getspecific's code has a shape the decoder does
// not know; the error says where and what.
var ErrTSDCode = errors.New("unrecognized pthread_getspecific code")

// Libc is the C library a TSDLayout was decoded from, as told by the shape
// of its code.
type Libc int

const (
	// LibcGlibc keeps the data of keys below MaxFastKey inline in struct
	// pthread, in specific_1stblock[key] (nptl/descr.h), an array of
	// struct pthread_key_data { uintptr_t seq; void *data; }.
	LibcGlibc Libc = iota + 1
	// LibcMusl keeps a pointer to an array of void * in struct pthread,
	// tsd (src/internal/pthread_impl.h).
	LibcMusl
)

func (l Libc) String() string {
	switch l {
	case LibcGlibc:
		return "glibc"
	case LibcMusl:
		return "musl"
	}
	return fmt.Sprintf("Libc(%d)", int(l))
}

// TSDLayout is where a C library keeps the value pthread_getspecific(key)
// returns, relative to the thread pointer tp. The address of that value is
//
//	base := tp
//	if SelfDeref { base = *(uint64 *)(tp + SelfOffset) }
//	block := base + FirstBlockOffset
//	if BlockDeref { block = *(uint64 *)block }
//	slot := block + key*EntrySize + DataOffset
//
// for key < MaxFastKey; SlotAddress does the same in Go. Offsets are signed:
// on arm64 glibc's struct pthread lies below tp. Where the function reads
// per-key data through a generation check (glibc's seq), a key deleted and
// reused could show a stale value; runtimes that use this keep their key
// while they run.
type TSDLayout struct {
	Libc Libc
	// SelfDeref says the function reads the thread's own pointer at tp +
	// SelfOffset (glibc x86_64: header.self at %fs:0x10, equal to tp;
	// musl x86_64: self at %fs:0) instead of computing from tp.
	SelfDeref  bool
	SelfOffset int64
	// FirstBlockOffset is, from base, where the entry of key 0 is (glibc:
	// specific_1stblock), or where the pointer to it is if BlockDeref
	// (musl: tsd).
	FirstBlockOffset int64
	BlockDeref       bool
	// EntrySize is the size of one key's entry: 16 (glibc's struct
	// pthread_key_data) or 8 (musl's void *).
	EntrySize int64
	// DataOffset is where the value is in an entry: 8 in glibc (data
	// follows seq), 0 in musl.
	DataOffset int64
	// MaxFastKey bounds the keys this layout covers: the size of glibc's
	// first block (PTHREAD_KEY_2NDLEVEL_SIZE, 32), whose bound the
	// function checks; musl's PTHREAD_KEYS_MAX (128).
	MaxFastKey uint32
}

// muslKeysMax is PTHREAD_KEYS_MAX in musl's include/limits.h: its
// pthread_getspecific does not check the key, pthread_key_create never
// hands out a larger one.
const muslKeysMax = 128

// SlotAddress computes, as the BPF unwinder does, the address of the
// value of key for the thread whose thread pointer is tp, reading the
// pointers it needs from mem (the process's memory).
func (l TSDLayout) SlotAddress(mem io.ReaderAt, tp uint64, key uint32) (uint64, error) {
	if key >= l.MaxFastKey {
		return 0, fmt.Errorf("key %d: the layout covers keys below %d", key, l.MaxFastKey)
	}
	base := tp
	if l.SelfDeref {
		var err error
		if base, err = ReadPointer(mem, tp+uint64(l.SelfOffset)); err != nil {
			return 0, fmt.Errorf("reading the thread's self pointer: %w", err)
		}
	}
	block := base + uint64(l.FirstBlockOffset)
	if l.BlockDeref {
		var err error
		if block, err = ReadPointer(mem, block); err != nil {
			return 0, fmt.Errorf("reading the thread's key data pointer: %w", err)
		}
	}
	return block + uint64(key)*uint64(l.EntrySize) + uint64(l.DataOffset), nil
}

func ReadPointer(mem io.ReaderAt, addr uint64) (uint64, error) {
	var buf [8]byte
	if _, err := mem.ReadAt(buf[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("at %#x: %w", addr, err)
	}
	return binary.LittleEndian.Uint64(buf[:]), nil
}

// maxGetspecificCode bounds how much of the function the decoder reads:
// the fast path of every known build is within its first 64 bytes.
const maxGetspecificCode = 256

// TSDLayoutFromLibc decodes where the C library f keeps thread-specific
// data from the fast path of its pthread_getspecific: libc.so.6 for glibc
// 2.34+, libpthread.so.0 for older glibc (ErrNoGetspecific from the older
// libc.so.6), musl's libc.so. x86_64 and arm64 code are supported; code of
// another shape gives an error wrapping ErrTSDCode.
func TSDLayoutFromLibc(f *elf.File) (TSDLayout, error) {
	sym, err := tsdFunction(f)
	if err != nil {
		return TSDLayout{}, err
	}
	code, err := tsdCode(f, sym)
	if err != nil {
		return TSDLayout{}, err
	}
	var l TSDLayout
	switch f.Machine {
	case elf.EM_X86_64:
		l, err = decodeGetspecificAMD64(code)
	case elf.EM_AARCH64:
		l, err = decodeGetspecificARM64(code)
	default:
		return TSDLayout{}, fmt.Errorf("pthread_getspecific for %v: only x86_64 and arm64 are supported", f.Machine)
	}
	if err != nil {
		return TSDLayout{}, fmt.Errorf("pthread_getspecific at %#x: %w", sym.Value, err)
	}
	return l, nil
}

// tsdFunction finds pthread_getspecific, exported or local.
func tsdFunction(f *elf.File) (elf.Symbol, error) {
	for _, load := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := load()
		for _, s := range syms {
			if s.Name == "pthread_getspecific" && s.Section != elf.SHN_UNDEF && s.Value != 0 &&
				elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				return s, nil
			}
		}
	}
	return elf.Symbol{}, ErrNoGetspecific
}

// tsdCode reads the start of the function: up to its size, at most
// maxGetspecificCode bytes.
func tsdCode(f *elf.File, sym elf.Symbol) ([]byte, error) {
	n := uint64(maxGetspecificCode)
	if sym.Size != 0 && sym.Size < n {
		n = sym.Size
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || sym.Value < p.Vaddr || sym.Value >= p.Vaddr+p.Filesz {
			continue
		}
		n = min(n, p.Vaddr+p.Filesz-sym.Value)
		code := make([]byte, n)
		if _, err := p.ReadAt(code, int64(sym.Value-p.Vaddr)); err != nil {
			return nil, fmt.Errorf("reading pthread_getspecific at %#x: %w", sym.Value, err)
		}
		return code, nil
	}
	return nil, fmt.Errorf("pthread_getspecific at %#x is in no executable segment", sym.Value)
}

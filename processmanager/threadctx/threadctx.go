// Package threadctx finds the thread-local pointer through which an
// OpenTelemetry SDK publishes each thread's context (OTEP 4947,
// oteps/profiles/4947-thread-ctx.md in
// open-telemetry/opentelemetry-specification): otel_thread_ctx_v1, an
// 8-byte TLS variable in the dynamic symbol table of the executable or of
// a library, and where BPF's tls_variable_address reaches it in a process.
// The OTEP allows every TLS access model but local-dynamic; the dynamic
// relocations the variable has say which the code uses:
//   - none, in an executable: its TLS block is at a fixed offset from the
//     thread pointer (local-exec, or initial-exec the linker resolved);
//   - R_*_TPOFF64: a GOT slot the loader fills with that offset
//     (initial-exec);
//   - R_*_TLSDESC: a TLS descriptor, whose argument the loader sets to the
//     offset (static TLS) or to a pointer to {module id, offset} (dynamic
//     TLS, for a library loaded later);
//   - R_*_DTPMOD64: a GOT pair {module id, offset} for __tls_get_addr
//     (general-dynamic).
package threadctx

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hostprof/ebpf-profiler/processmanager/elftls"
)

// Symbol is the thread-local pointer's name.
const Symbol = "otel_thread_ctx_v1"

// Errors of Find and Where.
var (
	// ErrNoVariable: the file does not define the variable.
	ErrNoVariable = errors.New(Symbol + " not defined")
	// ErrNotResolved: the loader has not filled the slot yet.
	ErrNotResolved = errors.New("thread context's TLS slot not resolved yet")
)

// ELF relocation types (elf.h).
const (
	relX86DTPMod64  = 16
	relX86TPOff64   = 18
	relX86TLSDesc   = 36
	relA64DTPMod64  = 1028
	relA64TPRel64   = 1030
	relA64TLSDesc   = 1031
	maxRelaSize     = 64 << 20
	relaEntrySize   = 24
	maxStaticOffset = 1 << 20
)

// Var is where a file keeps the variable.
type Var struct {
	Machine elf.Machine
	// Value is its offset in the file's TLS block.
	Value uint64
	// Static is set for an executable: the variable is at Offset from
	// the thread pointer.
	Static bool
	Offset int64
	// Desc, TPSlot and GOTPair are the file addresses of its TLS
	// descriptor, its initial-exec GOT slot and its general-dynamic GOT
	// pair; 0 where it has none.
	Desc, TPSlot, GOTPair uint64
}

// Find finds the variable in f, dynsym its dynamic symbols.
func Find(f *elf.File, dynsym []elf.Symbol) (*Var, error) {
	index := -1
	var value uint64
	for i, s := range dynsym {
		if s.Name == Symbol && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_TLS && s.Size == 8 {
			// Relocations count symbols from the null symbol, which
			// dynsym leaves out.
			index, value = i+1, s.Value
		}
	}
	if index < 0 {
		return nil, ErrNoVariable
	}
	v := &Var{Machine: f.Machine, Value: value}
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 {
		return nil, fmt.Errorf("%s in %v code: only x86_64 and arm64 are read", Symbol, f.Machine)
	}
	if elftls.IsExecutable(f) {
		tls := elftls.Segment(f)
		if tls == nil || value+8 > tls.Memsz {
			return nil, fmt.Errorf("%s at %#x is outside the TLS segment", Symbol, value)
		}
		off, err := elftls.ExecutableOffset(f.Machine, tls, value)
		v.Static, v.Offset = true, off
		return v, err
	}
	if err := v.readRelocations(f, uint32(index)); err != nil {
		return nil, err
	}
	if v.Desc == 0 && v.TPSlot == 0 && v.GOTPair == 0 {
		return nil, fmt.Errorf("%s: no TLS relocation of it (a local-dynamic access, which OTEP 4947 excludes?)", Symbol)
	}
	return v, nil
}

// readRelocations notes the GOT entries of the symbol with index sym.
func (v *Var) readRelocations(f *elf.File, sym uint32) error {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || s.Size > maxRelaSize || s.Entsize != relaEntrySize {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return fmt.Errorf("reading %s: %w", s.Name, err)
		}
		for off := 0; off+relaEntrySize <= len(data); off += relaEntrySize {
			info := f.ByteOrder.Uint64(data[off+8:])
			if uint32(info>>32) != sym {
				continue
			}
			addr := f.ByteOrder.Uint64(data[off:])
			switch uint32(info) {
			case relX86TLSDesc, relA64TLSDesc:
				v.Desc = addr
			case relX86TPOff64, relA64TPRel64:
				v.TPSlot = addr
			case relX86DTPMod64, relA64DTPMod64:
				v.GOTPair = addr
			}
		}
	}
	return nil
}

// Where is what BPF takes to reach the variable in a process that maps
// the file at bias (process address minus file address), reading what the
// loader filled in from mem: tls_variable_address's index and offset, or,
// with gotPair, a general-dynamic GOT pair's address and the variable's
// offset in its module's block.
func (v *Var) Where(mem io.ReaderAt, bias uint64) (index, offset uint64, gotPair bool, err error) {
	switch {
	case v.Static:
		return 0, uint64(v.Offset), false, nil
	case v.Desc != 0 && v.Machine == elf.EM_AARCH64:
		// BPF follows an arm64 descriptor itself, static or dynamic.
		return v.Desc + bias, v.Value, false, nil
	case v.Desc != 0:
		var desc [16]byte
		if _, err := mem.ReadAt(desc[:], int64(v.Desc+bias)); err != nil {
			return 0, 0, false, fmt.Errorf("reading the TLS descriptor: %w", err)
		}
		resolver, arg := binary.LittleEndian.Uint64(desc[:8]), binary.LittleEndian.Uint64(desc[8:])
		if resolver == 0 {
			return 0, 0, false, ErrNotResolved
		}
		if s := int64(arg); s > -maxStaticOffset && s < maxStaticOffset {
			return 0, arg, false, nil
		}
		// Dynamic TLS: glibc's argument points to {module id, offset},
		// as a general-dynamic GOT pair holds them.
		return arg, v.Value, true, nil
	case v.TPSlot != 0:
		var slot [8]byte
		if _, err := mem.ReadAt(slot[:], int64(v.TPSlot+bias)); err != nil {
			return 0, 0, false, fmt.Errorf("reading the TLS GOT slot: %w", err)
		}
		off := binary.LittleEndian.Uint64(slot[:])
		if off == 0 {
			return 0, 0, false, ErrNotResolved
		}
		return 0, off, false, nil
	default:
		return v.GOTPair + bias, v.Value, true, nil
	}
}

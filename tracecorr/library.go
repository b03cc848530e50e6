package tracecorr

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
)

// Symbols of the correlation spec, version 1.
const (
	TLSSymbol            = "elastic_apm_profiling_correlation_tls_v1"
	ProcessStorageSymbol = "elastic_apm_profiling_correlation_process_storage_v1"
)

// libraryPattern is the spec's pattern for the agent's library file name.
var libraryPattern = regexp.MustCompile(`.*/elastic-jvmti-linux-([\w-]*)\.so$`)

// IsAgentLibrary says whether a mapped file's path names an APM agent's
// native library, the cheap test before reading the file.
func IsAgentLibrary(path string) bool { return libraryPattern.MatchString(filepath.Clean(path)) }

// ErrNotAgent says an ELF file lacks the spec's symbols.
var ErrNotAgent = errors.New("not an APM agent library")

// Library is what an agent library's file says about where, relative to its
// load address, the correlation data is.
type Library struct {
	// ProcessStorage is the file virtual address of the pointer to the
	// process storage.
	ProcessStorage uint64
	// TLSDescriptor is the file virtual address of the TLS descriptor of
	// the thread-local pointer: two words, a resolver and an argument. Once
	// the dynamic loader resolved it for static TLS, the argument is the
	// variable's offset from the thread pointer.
	TLSDescriptor uint64
}

// ELF relocation types of a TLS descriptor (elf.h): R_X86_64_TLSDESC,
// R_AARCH64_TLSDESC.
const (
	relX86TLSDesc   = 36
	relARM64TLSDesc = 1031
)

// ReadLibrary finds the spec's symbols in f and the TLS descriptor of the
// thread-local one, from its R_X86_64_TLSDESC or R_AARCH64_TLSDESC
// relocation: the symbol's own value is only an offset into the library's
// TLS template.
func ReadLibrary(f *elf.File) (*Library, error) {
	var tlsType uint32
	switch f.Machine {
	case elf.EM_X86_64:
		tlsType = relX86TLSDesc
	case elf.EM_AARCH64:
		tlsType = relARM64TLSDesc
	default:
		return nil, fmt.Errorf("agent library for %v: only x86_64 and arm64 are supported", f.Machine)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return nil, fmt.Errorf("reading dynamic symbols: %w", err)
	}
	lib := &Library{}
	tlsIndex := -1
	for i, s := range syms {
		if s.Section == elf.SHN_UNDEF {
			continue
		}
		switch {
		case s.Name == ProcessStorageSymbol && elf.ST_TYPE(s.Info) == elf.STT_OBJECT && s.Size == 8:
			lib.ProcessStorage = s.Value
		case s.Name == TLSSymbol && elf.ST_TYPE(s.Info) == elf.STT_TLS && s.Size == 8:
			// Relocations count symbols from the null symbol, which
			// DynamicSymbols leaves out.
			tlsIndex = i + 1
		}
	}
	if lib.ProcessStorage == 0 || tlsIndex < 0 {
		return nil, fmt.Errorf("%w: %s or %s missing", ErrNotAgent, ProcessStorageSymbol, TLSSymbol)
	}
	desc, err := tlsDescriptor(f, tlsType, uint32(tlsIndex))
	if err != nil {
		return nil, err
	}
	lib.TLSDescriptor = desc
	return lib, nil
}

// maxRelaSize bounds the relocation sections read: a library's are a few
// hundred KiB at most.
const maxRelaSize = 64 << 20

// tlsDescriptor finds the address of the TLS descriptor relocation of the
// symbol with index sym among the file's RELA sections.
func tlsDescriptor(f *elf.File, relType, sym uint32) (uint64, error) {
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA || s.Size > maxRelaSize || s.Entsize != 24 {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", s.Name, err)
		}
		for off := 0; off+24 <= len(data); off += 24 {
			info := f.ByteOrder.Uint64(data[off+8:])
			if uint32(info) == relType && uint32(info>>32) == sym {
				return f.ByteOrder.Uint64(data[off:]), nil
			}
		}
	}
	return 0, fmt.Errorf("%w: no TLS descriptor relocation for %s (not built with -mtls-dialect=gnu2/desc?)",
		ErrNotAgent, TLSSymbol)
}

// ErrNotResolved says the loader has not resolved the TLS descriptor yet:
// read it again later.
var ErrNotResolved = errors.New("TLS descriptor not resolved yet")

// maxStaticTLSOffset bounds a static TLS offset: a thread's static TLS
// block is a few KiB. A larger argument is the pointer glibc's resolver
// for dynamically allocated TLS takes, which the BPF reader cannot follow.
const maxStaticTLSOffset = 1 << 20

// TLSOffset reads the resolved TLS descriptor at addr (the library's
// TLSDescriptor plus its load bias) from the process's memory and returns
// the thread-local variable's offset from the thread pointer.
func TLSOffset(mem io.ReaderAt, addr uint64) (int64, error) {
	var desc [16]byte
	if _, err := mem.ReadAt(desc[:], int64(addr)); err != nil {
		return 0, fmt.Errorf("reading the TLS descriptor at %#x: %w", addr, err)
	}
	resolver := binary.LittleEndian.Uint64(desc[:8])
	arg := int64(binary.LittleEndian.Uint64(desc[8:]))
	switch {
	case resolver == 0:
		return 0, ErrNotResolved
	case arg <= -maxStaticTLSOffset || arg >= maxStaticTLSOffset:
		return 0, fmt.Errorf("TLS descriptor argument %#x: not a static TLS offset (dynamic TLS is not supported)", uint64(arg))
	}
	return arg, nil
}

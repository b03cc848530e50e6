package v8

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// V8 builds export their post-mortem debug metadata as int globals named
// v8dbg_<what> (tools/gen-postmortem-metadata.py): object field offsets
// (v8dbg_class_<Class>__<field>__<Type>), instance types, frame offsets
// and constants. The values are static initialisers, so the file holds
// them (internals.md §1.1). Node's official builds export them in .dynsym
// and .symtab; a value of 0 sits in .bss.

// metadataPrefix starts every metadata symbol.
const metadataPrefix = "v8dbg_"

// ErrNotV8 says a file exports no V8 metadata.
var ErrNotV8 = errors.New("no V8 post-mortem metadata (v8dbg_* symbols)")

// maxMetadata bounds the symbols kept (Node 18-26 export 457-531).
const maxMetadata = 4096

// Metadata is a build's v8dbg_* values, by name without the prefix.
type Metadata map[string]int64

// readMetadata reads the v8dbg_* ints of an ELF file from its dynamic
// symbols dyn, or its symbol table syms where those have none. The caller
// reads the tables: a node binary's, read again here with debug/elf, were
// 17 MiB of a start-up's heap.
func readMetadata(f *elf.File, dyn, syms []elf.Symbol) (Metadata, error) {
	md := Metadata{}
	for _, syms := range [][]elf.Symbol{dyn, syms} {
		for _, s := range syms {
			if !strings.HasPrefix(s.Name, metadataPrefix) || elf.ST_TYPE(s.Info) != elf.STT_OBJECT {
				continue
			}
			if len(md) >= maxMetadata {
				return nil, fmt.Errorf("more than %d %s symbols", maxMetadata, metadataPrefix)
			}
			v, err := readInt32(f, s)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.Name, err)
			}
			md[strings.TrimPrefix(s.Name, metadataPrefix)] = int64(v)
		}
		if len(md) > 0 {
			return md, nil
		}
	}
	return nil, ErrNotV8
}

// readInt32 reads the little-endian int32 a data symbol holds in the file.
func readInt32(f *elf.File, s elf.Symbol) (int32, error) {
	b, err := symbolBytes(f, s, 4)
	if err != nil {
		return 0, err
	}
	return int32(binary.LittleEndian.Uint32(b)), nil
}

// symbolBytes reads the n bytes at a data symbol's address from the file;
// zeros in .bss.
func symbolBytes(f *elf.File, s elf.Symbol, n uint64) ([]byte, error) {
	if int(s.Section) <= 0 || int(s.Section) >= len(f.Sections) {
		return nil, fmt.Errorf("in section %d", s.Section)
	}
	sec := f.Sections[s.Section]
	if s.Value < sec.Addr || s.Value+n > sec.Addr+sec.Size {
		return nil, fmt.Errorf("at %#x, outside its section %s", s.Value, sec.Name)
	}
	b := make([]byte, n)
	if sec.Type == elf.SHT_NOBITS {
		return b, nil
	}
	if _, err := sec.ReadAt(b, int64(s.Value-sec.Addr)); err != nil {
		return nil, err
	}
	return b, nil
}

// has reports whether the build exports name.
func (md Metadata) has(name string) bool {
	_, ok := md[name]
	return ok
}

// field finds the offset of Class's field under any of its names: the
// exported symbol names the field's type too, which changes between
// versions (JSFunction's shared is __SharedFunctionInfo in one,
// __Tagged_SharedFunctionInfo_ in another). ok is false when none is
// exported, or when two exports of one name disagree.
func (md Metadata) field(class string, fields ...string) (int64, bool) {
	for _, f := range fields {
		prefix := "class_" + class + "__" + f + "__"
		v, found := int64(0), false
		for name, val := range md {
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			if found && val != v {
				return 0, false
			}
			v, found = val, true
		}
		if found {
			return v, true
		}
	}
	return 0, false
}

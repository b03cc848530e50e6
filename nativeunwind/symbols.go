package nativeunwind

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"strings"
)

// maxSymbolNames bounds the string table ReadSymbols reads: the largest
// real ones (libLLVM, Chromium) are tens of MiB.
const maxSymbolNames = 512 << 20

// ReadSymbols returns the symbols of f's table of type typ (elf.SHT_SYMTAB
// or elf.SHT_DYNSYM), like elf.File.Symbols and DynamicSymbols, without
// symbol versions. Their names are substrings of one string holding the
// table's names, not a string each: for a large Go or C++ binary that was
// most of the megabytes elf.File.Symbols allocates. A caller that keeps a
// name past the table's use clones it (strings.Clone), or it keeps all the
// names alive. It returns an error wrapping elf.ErrNoSymbols when f has no
// such table.
func ReadSymbols(f *elf.File, typ elf.SectionType) ([]elf.Symbol, error) {
	if f.Class != elf.ELFCLASS64 {
		if typ == elf.SHT_DYNSYM {
			return f.DynamicSymbols()
		}
		return f.Symbols()
	}
	sec := f.SectionByType(typ)
	if sec == nil {
		return nil, fmt.Errorf("no %v section: %w", typ, elf.ErrNoSymbols)
	}
	if sec.Link == 0 || int(sec.Link) >= len(f.Sections) {
		return nil, fmt.Errorf("%s: string table link %d out of range", sec.Name, sec.Link)
	}
	strSec := f.Sections[sec.Link]
	if strSec.Size > maxSymbolNames {
		return nil, fmt.Errorf("%s: %d bytes of names, more than %d", strSec.Name, strSec.Size, maxSymbolNames)
	}
	var b strings.Builder
	b.Grow(int(strSec.Size))
	if _, err := io.Copy(&b, io.LimitReader(strSec.Open(), int64(strSec.Size))); err != nil {
		return nil, fmt.Errorf("reading %s: %w", strSec.Name, err)
	}
	names := b.String()

	if sec.Size%elf64SymSize != 0 {
		return nil, fmt.Errorf("%s: size %d is not a multiple of %d", sec.Name, sec.Size, elf64SymSize)
	}
	n := sec.Size / elf64SymSize
	if n == 0 {
		return nil, fmt.Errorf("%s is empty: %w", sec.Name, elf.ErrNoSymbols)
	}
	// A damaged size is found out by the reads below, not by the
	// allocation.
	syms := make([]elf.Symbol, 0, min(n-1, 1<<20))
	r := bufio.NewReader(sec.Open())
	var ent [elf64SymSize]byte
	for i := uint64(0); i < n; i++ {
		if _, err := io.ReadFull(r, ent[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("reading %s: %w", sec.Name, err)
		}
		if i == 0 {
			continue // the null symbol, as elf.File.Symbols leaves it out
		}
		syms = append(syms, elf.Symbol{
			Name:    nameAt(names, f.ByteOrder.Uint32(ent[0:])),
			Info:    ent[4],
			Other:   ent[5],
			Section: elf.SectionIndex(f.ByteOrder.Uint16(ent[6:])),
			Value:   f.ByteOrder.Uint64(ent[8:]),
			Size:    f.ByteOrder.Uint64(ent[16:]),
		})
	}
	return syms, nil
}

// nameAt is the NUL-terminated name at off in names; "" out of range.
func nameAt(names string, off uint32) string {
	if int64(off) >= int64(len(names)) {
		return ""
	}
	s := names[off:]
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return s
}

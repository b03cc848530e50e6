package v8

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Symbols of V8's version: static ints in .data (internals.md §1.1).
var versionSymbols = [3]string{
	"_ZN2v88internal7Version6major_E",
	"_ZN2v88internal7Version6minor_E",
	"_ZN2v88internal7Version6build_E",
}

// The embedded builtins: their code's start (V8 10.2 names the code
// _data_ and the other symbol a pointer to it) and size (a uint32).
const (
	blobSymbol     = "v8_Default_embedded_blob_code_"
	blobDataSymbol = "v8_Default_embedded_blob_code_data_"
	blobSizeSymbol = "v8_Default_embedded_blob_code_size_"
	builtinPrefix  = "Builtins_"
	// bytecodeSizes is interpreter::Bytecodes::kBytecodeSizes, a uint8
	// [3][bytecodes]: each bytecode's size at operand scale 1, 2 and 4.
	bytecodeSizesSymbol = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE"
)

// The interpreter's entry builtins, laid out in a row in every version
// (the trampoline, its profiling copy, the two that enter at a bytecode):
// an interpreted frame returns into one of them (internals.md §3.2).
const (
	entryFirst = "InterpreterEntryTrampoline"
	entryLast  = "InterpreterEnterAtNextBytecode"
)

// maxBuiltins bounds the builtins kept (Node 24 has 2,384).
const maxBuiltins = 1 << 14

// builtin is one of the embedded builtins, at file addresses
// [Addr, Addr+Size).
type builtin struct {
	Addr uint64
	Size uint32
	Name string
}

// binaryInfo is what a node binary (or libnode.so) holds for the unwinder.
type binaryInfo struct {
	Version [3]int
	md      Metadata
	// Blob is the embedded builtins' code [BlobAddr, BlobAddr+BlobSize)
	// and BlobOffset its place in the file.
	BlobAddr, BlobOffset uint64
	BlobSize             uint32
	// Builtins, by address.
	Builtins []builtin
	// Offsets in the blob of the interpreter's entry builtins and of its
	// bytecode handlers.
	EntryLo, EntryHi       uint32
	HandlersLo, HandlersHi uint32
	// BytecodeSizes are the bytecodes' sizes by operand scale (1, 2, 4).
	BytecodeSizes [3][]byte
}

// readBinary reads a V8 binary's version, metadata and builtins.
func readBinary(f *elf.File) (*binaryInfo, error) {
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	return readBinarySymbols(f, dyn, syms)
}

// readBinarySymbols is readBinary with f's .dynsym and .symtab read
// already.
func readBinarySymbols(f *elf.File, dyn, syms []elf.Symbol) (*binaryInfo, error) {
	md, err := readMetadata(f, dyn, syms)
	if err != nil {
		return nil, err
	}
	if len(syms) == 0 {
		return nil, errors.New("V8 without a symbol table")
	}
	b := &binaryInfo{md: md}
	byName := map[string]elf.Symbol{}
	for _, list := range [][]elf.Symbol{dyn, syms} {
		for _, s := range list {
			switch {
			case s.Name == versionSymbols[0] || s.Name == versionSymbols[1] || s.Name == versionSymbols[2],
				s.Name == blobSymbol, s.Name == blobDataSymbol, s.Name == blobSizeSymbol,
				s.Name == bytecodeSizesSymbol:
				byName[s.Name] = s
			case strings.HasPrefix(s.Name, builtinPrefix) && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0:
				if len(b.Builtins) >= maxBuiltins {
					return nil, fmt.Errorf("more than %d builtins", maxBuiltins)
				}
				b.Builtins = append(b.Builtins, builtin{Addr: s.Value, Size: uint32(s.Size),
					Name: strings.Clone(strings.TrimPrefix(s.Name, builtinPrefix))})
			}
		}
	}
	for i, name := range versionSymbols {
		s, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("no %s", name)
		}
		v, err := readInt32(f, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		b.Version[i] = int(v)
	}
	blob, ok := byName[blobDataSymbol]
	if !ok {
		blob, ok = byName[blobSymbol]
	}
	size, hasSize := byName[blobSizeSymbol]
	if !ok || !hasSize {
		return nil, errors.New("no embedded builtins (v8_Default_embedded_blob_code_)")
	}
	n, err := readInt32(f, size)
	if err != nil || n <= 0 {
		return nil, fmt.Errorf("%s: %d, %v", blobSizeSymbol, n, err)
	}
	b.BlobAddr, b.BlobSize = blob.Value, uint32(n)
	if b.BlobOffset, err = fileOffset(f, b.BlobAddr); err != nil {
		return nil, err
	}
	if err := b.readBytecodeSizes(f, byName[bytecodeSizesSymbol]); err != nil {
		return nil, err
	}
	sort.Slice(b.Builtins, func(i, j int) bool { return b.Builtins[i].Addr < b.Builtins[j].Addr })
	if err := b.findInterpreter(); err != nil {
		return nil, err
	}
	return b, nil
}

// findInterpreter finds the interpreter's entry builtins and handlers.
func (b *binaryInfo) findInterpreter() error {
	var entryLo, entryHi, hLo, hHi uint64
	for _, s := range b.Builtins {
		switch s.Name {
		case entryFirst:
			entryLo = s.Addr
		case entryLast:
			entryHi = s.Addr + uint64(s.Size)
		}
	}
	// Bytecode handlers (LdarHandler, …, and their Wide and ExtraWide
	// forms) are the last builtins, in a row.
	for i := len(b.Builtins) - 1; i >= 0 && strings.HasSuffix(b.Builtins[i].Name, "Handler"); i-- {
		if hHi == 0 {
			hHi = b.Builtins[i].Addr + uint64(b.Builtins[i].Size)
		}
		hLo = b.Builtins[i].Addr
	}
	if entryLo == 0 || entryHi <= entryLo || hLo == 0 {
		return fmt.Errorf("no interpreter entry (%s..%s) or bytecode handlers in the builtins", entryFirst, entryLast)
	}
	in := func(a uint64) bool { return a >= b.BlobAddr && a <= b.BlobAddr+uint64(b.BlobSize) }
	if !in(entryLo) || !in(entryHi) || !in(hLo) || !in(hHi) {
		return errors.New("interpreter builtins outside the embedded blob")
	}
	b.EntryLo, b.EntryHi = uint32(entryLo-b.BlobAddr), uint32(entryHi-b.BlobAddr)
	b.HandlersLo, b.HandlersHi = uint32(hLo-b.BlobAddr), uint32(hHi-b.BlobAddr)
	return nil
}

// builtinAt names the builtin at a file address.
func (b *binaryInfo) builtinAt(addr uint64) (string, bool) {
	i := sort.Search(len(b.Builtins), func(i int) bool { return b.Builtins[i].Addr > addr }) - 1
	if i < 0 || addr >= b.Builtins[i].Addr+uint64(b.Builtins[i].Size) {
		return "", false
	}
	return b.Builtins[i].Name, true
}

// fileOffset is where a virtual address lies in the file.
func fileOffset(f *elf.File, addr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr < p.Vaddr+p.Filesz {
			return addr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x in no loaded segment", addr)
}

// le reads little-endian words.
var le = binary.LittleEndian

// readBytecodeSizes reads the bytecodes' sizes (baseline code maps PCs to
// bytecodes by them).
func (b *binaryInfo) readBytecodeSizes(f *elf.File, s elf.Symbol) error {
	if s.Name == "" || s.Size == 0 || s.Size%3 != 0 || s.Size > 3*256 {
		return fmt.Errorf("no %s of 3 x up to 256 bytes", bytecodeSizesSymbol)
	}
	buf, err := symbolBytes(f, s, s.Size)
	if err != nil {
		return fmt.Errorf("%s: %w", bytecodeSizesSymbol, err)
	}
	n := len(buf) / 3
	for i := range b.BytecodeSizes {
		b.BytecodeSizes[i] = buf[i*n : (i+1)*n]
	}
	return nil
}

package nativeunwind

import (
	"debug/elf"
	"errors"
	"fmt"
)

// GoSymbols names the functions of a Go executable and the source lines of
// its code addresses from the pclntab, which Go keeps in stripped binaries
// and in `go test` binaries that have no symbol table. It is immutable and
// safe for concurrent use; it holds the table's bytes, not the file.
type GoSymbols struct {
	t *pclntab
}

// GoFunc is one function of the table.
type GoFunc struct {
	Name       string
	Entry, End uint64 // file virtual addresses of [Entry, End)
}

// GoFrame is what an address resolves to: its function and the source
// position of the instruction (the innermost one, for inlined code).
type GoFrame struct {
	Func GoFunc
	File string
	Line int
	// Inlined says the compiler inlined Func into the next frame's
	// function (GoLines.Lookup); Func then has no Entry or End.
	Inlined bool
}

// ErrNotGoCode is returned by Lookup for addresses outside the table.
var ErrNotGoCode = errors.New("address is not in Go code")

// ReadGoSymbols reads f's pclntab. The error wraps ErrNoGoPclntab when f
// is not a Go executable. mapped, if not nil, is the whole file in memory
// (WithMappedFile): the table is then used in place, and the GoSymbols
// must not be used once it is unmapped (the names it returns are copies).
func ReadGoSymbols(f *elf.File, mapped []byte) (*GoSymbols, error) {
	t, err := elfImage{f: f, mapped: mapped}.openPclntab()
	if err != nil {
		return nil, err
	}
	return &GoSymbols{t: t}, nil
}

// Layout names the table layout by the first Go release that wrote it:
// "go1.2", "go1.16", "go1.18" or "go1.20".
func (s *GoSymbols) Layout() string { return s.t.version.String() }

// Len returns the number of functions.
func (s *GoSymbols) Len() int { return s.t.nfunc }

// Func returns function i, in address order.
func (s *GoSymbols) Func(i int) (GoFunc, error) {
	f, err := s.t.fn(i)
	if err != nil {
		return GoFunc{}, fmt.Errorf("pclntab: %w", err)
	}
	return s.goFunc(f)
}

func (s *GoSymbols) goFunc(f goFunc) (GoFunc, error) {
	name, err := s.t.funcName(f)
	if err != nil {
		return GoFunc{}, fmt.Errorf("pclntab: function at %#x: %w", f.entry, err)
	}
	return GoFunc{Name: name, Entry: f.entry, End: f.end}, nil
}

// Lookup resolves a file virtual address. It returns ErrNotGoCode for
// addresses no function covers. File and Line are empty for addresses
// the line tables do not cover (padding, linker markers); a function
// whose line tables are damaged still comes back, with the error.
func (s *GoSymbols) Lookup(pc uint64) (GoFrame, error) {
	i, ok := s.t.findFunc(pc)
	if !ok {
		return GoFrame{}, ErrNotGoCode
	}
	f, err := s.t.fn(i)
	if err != nil {
		return GoFrame{}, fmt.Errorf("pclntab: %w", err)
	}
	var fr GoFrame
	if fr.Func, err = s.goFunc(f); err != nil {
		return fr, err
	}
	if f.pcln == 0 || f.pcfile == 0 {
		return fr, nil // no tables, as for linker markers
	}
	line, ok, err := s.t.pcValue(f, f.pcln, pc)
	if err != nil {
		return fr, fmt.Errorf("pclntab: line of %#x in %s: %w", pc, fr.Func.Name, err)
	}
	if !ok {
		return fr, nil // padding after the code
	}
	fileNo, ok, err := s.t.pcValue(f, f.pcfile, pc)
	if err == nil && ok {
		fr.File, err = s.t.fileName(f, fileNo)
	}
	if err != nil {
		return fr, fmt.Errorf("pclntab: file of %#x in %s: %w", pc, fr.Func.Name, err)
	}
	fr.Line = int(line)
	return fr, nil
}

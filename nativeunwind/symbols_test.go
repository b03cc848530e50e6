package nativeunwind

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// symbolFiles are files with real symbol tables: the go command (a large
// .symtab), this test binary and the C library (.dynsym).
func symbolFiles(t testing.TB) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(runtime.GOROOT(), "bin", "go"), exe}
	if libc, err := filepath.Glob("/usr/lib/x86_64-linux-gnu/libc.so.6"); err == nil && len(libc) > 0 {
		files = append(files, libc[0])
	}
	return files
}

// TestReadSymbols: the same symbols as debug/elf gives, in the same order.
func TestReadSymbols(t *testing.T) {
	for _, path := range symbolFiles(t) {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, tt := range []struct {
			typ  elf.SectionType
			read func() ([]elf.Symbol, error)
		}{{elf.SHT_SYMTAB, f.Symbols}, {elf.SHT_DYNSYM, f.DynamicSymbols}} {
			want, wantErr := tt.read()
			got, err := ReadSymbols(f, tt.typ)
			if wantErr != nil {
				if !errors.Is(wantErr, elf.ErrNoSymbols) || !errors.Is(err, elf.ErrNoSymbols) {
					t.Errorf("%s %v: error %v, debug/elf's %v", path, tt.typ, err, wantErr)
				}
				continue
			}
			if err != nil || len(got) != len(want) {
				t.Fatalf("%s %v: %d symbols, %v; debug/elf has %d", path, tt.typ, len(got), err, len(want))
			}
			for i := range want {
				w, g := want[i], got[i]
				if g.Name != w.Name || g.Info != w.Info || g.Other != w.Other || g.Section != w.Section ||
					g.Value != w.Value || g.Size != w.Size {
					t.Fatalf("%s %v symbol %d: %+v, debug/elf's %+v", path, tt.typ, i, g, w)
				}
			}
			t.Logf("%s %v: %d symbols", filepath.Base(path), tt.typ, len(got))
		}
	}
}

// TestReadSymbolsDamaged: a table cut short or linked to no string table
// is an error, not a panic.
func TestReadSymbolsDamaged(t *testing.T) {
	f, err := elf.Open(symbolFiles(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.SectionByType(elf.SHT_SYMTAB)
	if sec == nil {
		t.Fatal("the go command has no .symtab")
	}
	size, link := sec.Size, sec.Link
	sec.Size += elf64SymSize * 1000
	if _, err := ReadSymbols(f, elf.SHT_SYMTAB); err == nil {
		t.Error("no error for a table past the end of its section")
	}
	sec.Size = size + 1
	if _, err := ReadSymbols(f, elf.SHT_SYMTAB); err == nil {
		t.Error("no error for a size that is not a multiple of an entry")
	}
	sec.Size, sec.Link = size, uint32(len(f.Sections))
	if _, err := ReadSymbols(f, elf.SHT_SYMTAB); err == nil {
		t.Error("no error for a link out of range")
	}
	sec.Link = link
}

// BenchmarkReadSymbols compares allocations with debug/elf's on the go
// command's .symtab.
func BenchmarkReadSymbols(b *testing.B) {
	f, err := elf.Open(symbolFiles(b)[0])
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.Run("ReadSymbols", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ReadSymbols(f, elf.SHT_SYMTAB); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("debug-elf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.Symbols(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package nativeunwind

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// FuzzGoPclntab feeds arbitrary tables to the parser, the symbolizer and
// the delta conversion of both architectures. Seeds: the synthetic tables
// of every layout and the real table of this test binary.
func FuzzGoPclntab(f *testing.F) {
	for _, st := range synthTables() {
		f.Add(st.bytes())
	}
	if exe, err := os.Executable(); err == nil {
		if ef, err := elf.Open(exe); err == nil {
			if s := ef.Section(".gopclntab"); s != nil {
				if data, err := s.Data(); err == nil {
					f.Add(data)
				}
			}
			ef.Close()
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Code bytes for the prologue checks come from the input too.
		code := func(addr, n uint64) ([]byte, error) {
			if len(data) == 0 {
				return nil, os.ErrNotExist
			}
			off := addr % uint64(len(data))
			if uint64(len(data))-off < n {
				return nil, os.ErrNotExist
			}
			return data[off : off+n], nil
		}
		for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
			tab, err := parsePclntab(data, 0x400000, order)
			if err != nil {
				continue
			}
			if tab.textStart == 0 {
				tab.textStart = 0x401000
			}
			syms := &GoSymbols{t: tab}
			// Inline trees are read from the input too.
			lines := &GoLines{syms: syms, read: code, gofunc: 0x400000}
			for i := range min(tab.nfunc, 64) {
				fn, err := syms.Func(i)
				if err != nil {
					continue
				}
				for _, pc := range []uint64{fn.Entry, (fn.Entry + fn.End) / 2, fn.End - 1} {
					_, _ = syms.Lookup(pc)
					if frames, _ := lines.Lookup(pc); len(frames) > maxInlineDepth+1 {
						t.Fatalf("%d frames at %#x", len(frames), pc)
					}
				}
			}
			for _, a := range []*goArch{&goAMD64, &goARM64} {
				d, err := tab.deltas(a, code)
				if err != nil {
					continue
				}
				for i := 1; i < len(d); i++ {
					if d[i].Address <= d[i-1].Address || d[i].Rule == d[i-1].Rule {
						t.Fatalf("deltas %d, %d not sorted and distinct: %v %v", i-1, i, d[i-1], d[i])
					}
				}
			}
		}
	})
}

// BenchmarkGoDeltas converts the Go compiler's table, a large Go binary.
func BenchmarkGoDeltas(b *testing.B) {
	f := openCompiler(b)
	syms, err := ReadGoSymbols(f, nil)
	if err != nil {
		b.Fatal(err)
	}
	var n int
	for b.Loop() {
		d, err := goDeltas(elfImage{f: f})
		if err != nil {
			b.Fatal(err)
		}
		n = len(d)
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(syms.Len()*b.N)/sec, "funcs/s")
	b.ReportMetric(float64(n*b.N)/sec, "deltas/s")
	b.ReportMetric(float64(n), "deltas")
}

// BenchmarkGoSymbolsLookup resolves addresses spread over the compiler.
func BenchmarkGoSymbolsLookup(b *testing.B) {
	syms, err := ReadGoSymbols(openCompiler(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	first, _ := syms.Func(0)
	last, _ := syms.Func(syms.Len() - 1)
	span := last.End - first.Entry
	i := uint64(0)
	for b.Loop() {
		i++
		if _, err := syms.Lookup(first.Entry + (i*0x9e3779b97f4a7c15)%span); err != nil {
			b.Fatal(err)
		}
	}
}

func openCompiler(b *testing.B) *elf.File {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skip("no go command")
	}
	path := filepath.Join(strings.TrimSpace(string(out)), "pkg", "tool", runtime.GOOS+"_"+runtime.GOARCH, "compile")
	f, err := elf.Open(path)
	if err != nil {
		b.Skipf("no compiler binary: %v", err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}

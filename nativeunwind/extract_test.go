package nativeunwind

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

func TestMergeLayers(t *testing.T) {
	sp := func(off int32) Rule { return Rule{CFA: CFASP, CFAOffset: off, RAOffset: -8} }
	eh := layer{
		spans: []span{{0x100, 0x200, 0, 2}, {0x300, 0x400, 2, 3}},
		rows:  []Delta{{0x100, sp(8)}, {0x180, sp(16)}, {0x300, sp(8)}},
	}
	// .debug_frame covers [0x80, 0x380): only [0x80, 0x100) and
	// [0x200, 0x300) remain for it, and its row in force at 0x200 starts
	// there.
	debug := layer{
		spans: []span{{0x80, 0x380, 0, 3}},
		rows:  []Delta{{0x80, sp(24)}, {0x150, sp(32)}, {0x280, sp(8)}},
	}
	var st Stats
	d, err := mergeLayers([]layer{eh, debug}, &st)
	if err != nil {
		t.Fatal(err)
	}
	want := Deltas{
		{0x80, sp(24)}, {0x100, sp(8)}, {0x180, sp(16)}, {0x200, sp(32)}, {0x280, sp(8)}, {0x400, Rule{}},
	}
	if !sameDeltas(d, want) {
		t.Errorf("got  %v\nwant %v", d, want)
	}
	if st.Overlaps != 1 {
		t.Errorf("overlaps %d, want 1", st.Overlaps)
	}
}

func TestLayerOf(t *testing.T) {
	sp := Rule{CFA: CFASP, CFAOffset: 8, RAOffset: -8}
	d := Deltas{{0x10, sp}, {0x20, Rule{}}, {0x30, sp}, {0x38, Rule{CFA: CFAStop}}, {0x40, Rule{}}}
	l := layerOf(d)
	want := []span{{0x10, 0x20, 0, 1}, {0x30, 0x40, 2, 4}}
	if len(l.spans) != len(want) || l.spans[0] != want[0] || l.spans[1] != want[1] {
		t.Errorf("spans %v, want %v", l.spans, want)
	}
	got, err := mergeLayers([]layer{l}, &Stats{})
	if err != nil || !sameDeltas(got, d) {
		t.Errorf("merged alone: %v, %v; want %v", got, err, d)
	}
}

func TestOverlay(t *testing.T) {
	sp := Rule{CFA: CFASP, CFAOffset: 8, RAOffset: -8}
	stop := func(Rule) Rule { return Rule{CFA: CFAStop} }
	stopUnknown := func(r Rule) Rule {
		if r.CFA == CFAUnknown {
			return Rule{CFA: CFAStop}
		}
		return r
	}
	base := Deltas{{0x10, sp}, {0x20, Rule{}}, {0x30, sp}, {0x40, Rule{}}}
	tests := []struct {
		name       string
		start, end uint64
		mark       func(Rule) Rule
		want       Deltas
	}{
		{"inside one delta", 0x12, 0x14, stop, Deltas{{0x10, sp}, {0x12, Rule{CFA: CFAStop}}, {0x14, sp}, {0x20, Rule{}}, {0x30, sp}, {0x40, Rule{}}}},
		{"exactly a delta", 0x10, 0x20, stop, Deltas{{0x10, Rule{CFA: CFAStop}}, {0x20, Rule{}}, {0x30, sp}, {0x40, Rule{}}}},
		{"across deltas", 0x18, 0x38, stop, Deltas{{0x10, sp}, {0x18, Rule{CFA: CFAStop}}, {0x38, sp}, {0x40, Rule{}}}},
		{"unknown parts only", 0x18, 0x38, stopUnknown, Deltas{{0x10, sp}, {0x20, Rule{CFA: CFAStop}}, {0x30, sp}, {0x40, Rule{}}}},
		{"before everything", 0x0, 0x8, stop, Deltas{{0x0, Rule{CFA: CFAStop}}, {0x8, Rule{}}, {0x10, sp}, {0x20, Rule{}}, {0x30, sp}, {0x40, Rule{}}}},
		{"after everything", 0x50, 0x58, stop, Deltas{{0x10, sp}, {0x20, Rule{}}, {0x30, sp}, {0x40, Rule{}}, {0x50, Rule{CFA: CFAStop}}, {0x58, Rule{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append(Deltas(nil), base...)
			got := overlay(in, tt.start, tt.end, tt.mark)
			if !sameDeltas(got, tt.want) {
				t.Errorf("got  %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestStopDeltas(t *testing.T) {
	t.Run("_start and start_thread of a compiled program", func(t *testing.T) {
		// A function named start_thread stands in for glibc's, whose
		// symbol only the separate debug file has.
		src := testProgram + `
__attribute__((noinline)) void *start_thread(void *arg) { return (void *)(long)recurse((long)arg); }
void *use_start_thread(void *arg) { return start_thread(arg); }
`
		bin := buildC(t, t.TempDir(), "stops", src, "-O2", "-fomit-frame-pointer")
		f, d := openAndExtract(t, bin)
		checkStop(t, f, d, "_start")
		checkStop(t, f, d, "start_thread")
		if r, _ := d.Lookup(symbolAddr(t, f, "main")); r.CFA != CFASP {
			t.Errorf("main: %v, want an SP rule", r)
		}
	})
	t.Run("clone in libc", func(t *testing.T) {
		f, d := openAndExtract(t, "/lib/x86_64-linux-gnu/libc.so.6")
		start := symbolAddr(t, f, "__clone")
		syms, _ := f.DynamicSymbols()
		var size uint64
		for _, s := range syms {
			if symbolName(s.Name) == "__clone" {
				size = s.Size
			}
		}
		// The parent side keeps its rule; the child side (CFI with an
		// undefined return address) and what the CFI leaves uncovered
		// around the system call stop.
		if r, _ := d.Lookup(start); r.CFA != CFASP {
			t.Errorf("__clone entry: %v, want an SP rule", r)
		}
		var stops, unknowns int
		for a := start; a < start+size; a++ {
			r, _ := d.Lookup(a)
			switch r.CFA {
			case CFAStop:
				stops++
			case CFAUnknown:
				unknowns++
			}
		}
		if stops == 0 || unknowns != 0 {
			t.Errorf("__clone: %d stop and %d unknown bytes, want some stop and no unknown", stops, unknowns)
		}
	})
}

func symbolAddr(t *testing.T, f *elf.File, name string) uint64 {
	t.Helper()
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	for _, s := range append(syms, dyn...) {
		if symbolName(s.Name) == name {
			return s.Value
		}
	}
	t.Fatalf("no symbol %s", name)
	return 0
}

// TestARM64Fixture checks what readelf cannot show: return address
// signing, signal frames and entry points (see testdata/cfi-arm64).
func TestARM64Fixture(t *testing.T) {
	f, err := elf.Open("testdata/cfi-arm64/fixture.so")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, st, err := ExtractWithStats(f)
	if err != nil {
		t.Fatal(err)
	}
	at := func(sym string, off uint64) Rule {
		r, _ := d.Lookup(symbolAddr(t, f, sym) + off)
		return r
	}
	// dyn: pacibsp; stp x29, x30, [sp, #-16]!; mov x29, sp; ... (alloca).
	tests := []struct {
		sym  string
		off  uint64
		want Rule
	}{
		{"leaf", 0, Rule{CFA: CFASP}},
		{"dyn", 0, Rule{CFA: CFASP}},
		{"_start", 4, Rule{CFA: CFAStop}},
		{"__kernel_rt_sigreturn", 0, Rule{CFA: CFASignal}},
		{"__kernel_rt_sigreturn", 4, Rule{CFA: CFASignal}},
		{"dbg_callee", 0, Rule{CFA: CFASP}},                                             // .debug_frame
		{"dbg_callee", 4, Rule{CFA: CFASP, CFAOffset: 16, FPOffset: -16, RAOffset: -8}}, // .debug_frame
		{"twoexits", 4, Rule{CFA: CFASP, CFAOffset: 32, FPOffset: -32, RAOffset: -24}},
		{"twoexits", 16, Rule{CFA: CFASP}},                                              // ret of the early exit
		{"twoexits", 20, Rule{CFA: CFASP, CFAOffset: 32, FPOffset: -32, RAOffset: -24}}, // restored
	}
	for _, tt := range tests {
		if got := at(tt.sym, tt.off); got != tt.want {
			t.Errorf("%s+%d: %v, want %v", tt.sym, tt.off, got, tt.want)
		}
	}
	// The signing state: off at entry, on after pacibsp, in the frame and
	// on the FP-based CFA, off again after autibsp.
	var signed, fpSigned int
	dyn := symbolAddr(t, f, "dyn")
	for a := dyn; a < dyn+0x60; a += 4 {
		r, _ := d.Lookup(a)
		if r.RASigned {
			signed++
			if r.CFA == CFAFP {
				fpSigned++
			}
		}
	}
	if signed == 0 || fpSigned == 0 {
		t.Errorf("dyn: %d signed rows (%d FP based), want both > 0", signed, fpSigned)
	}
	if r := at("dyn", 0); r.RASigned {
		t.Errorf("dyn entry is signed: %v", r)
	}
	t.Logf("%d deltas, %+v", len(d), st)
}

// TestEhFrameHdr cross-checks the .eh_frame walk with the binary search
// table of .eh_frame_hdr: every entry names an FDE we parsed, at the same
// initial location.
func TestEhFrameHdr(t *testing.T) {
	for _, path := range []string{
		"/lib/x86_64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
		"testdata/cfi-arm64/fixture.so",
	} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := elf.Open(path)
			if err != nil {
				t.Skip(err)
			}
			defer f.Close()
			hs, es := f.Section(".eh_frame_hdr"), f.Section(".eh_frame")
			hdata, _ := hs.Data()
			h, err := parseEhFrameHdr(hdata, hs.Addr, f.ByteOrder)
			if err != nil {
				t.Fatal(err)
			}
			if h.ehFrame != es.Addr {
				t.Errorf("eh_frame_ptr %#x, want %#x", h.ehFrame, es.Addr)
			}
			sec, err := cfiSectionOf(elfImage{f: f}, ".eh_frame", archFor(f.Machine))
			if err != nil {
				t.Fatal(err)
			}
			starts := map[uint64]uint64{} // FDE address -> initial location
			err = sec.forEachFDE(&Stats{}, func(fd *fde) error {
				starts[es.Addr+uint64(fd.offset)] = fd.start
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range h.table {
				if s, ok := starts[e.fde]; !ok || s != e.start {
					t.Errorf("table entry %d: FDE at %#x for %#x; parsed: %#x, %v", i, e.fde, e.start, s, ok)
				}
				if i > 0 && h.table[i-1].start > e.start {
					t.Errorf("table not sorted at %d", i)
				}
			}
			if len(h.table) != len(starts) {
				t.Errorf("%d table entries, %d FDEs", len(h.table), len(starts))
			}
		})
	}
}

func TestGoPrecedence(t *testing.T) {
	// Where .gopclntab and Go's .debug_frame both cover code, the pclntab
	// wins: it knows where the frame pointer is saved.
	if testing.Short() {
		t.Skip("builds a Go program")
	}
	bin := buildGo(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := Extract(f)
	if err != nil {
		t.Fatal(err)
	}
	gd, err := goDeltas(elfImage{f: f})
	if err != nil {
		t.Fatal(err)
	}
	main := symbolAddr(t, f, "main.main")
	want, _ := gd.Lookup(main + 8)
	if got, _ := all.Lookup(main + 8); got != want {
		t.Errorf("main.main+8: %v, want the pclntab's %v", got, want)
	}
}

func buildGo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return bin
}

func TestExtractErrors(t *testing.T) {
	if _, err := ExtractReader(bytes.NewReader([]byte("not an ELF file"))); err == nil {
		t.Error("ExtractReader accepted garbage")
	}
	// A minimal ELF header of another machine.
	hdr := make([]byte, 64)
	copy(hdr, "\x7fELF\x02\x01\x01")
	hdr[16], hdr[18], hdr[20], hdr[52] = 3, byte(elf.EM_RISCV), 1, 64
	if _, err := ExtractReader(bytes.NewReader(hdr)); !errors.Is(err, ErrUnsupportedArch) {
		t.Errorf("RISC-V: %v, want ErrUnsupportedArch", err)
	}

	// The fixture with its first FDE's length pointing past the section.
	data, err := os.ReadFile("testdata/cfi-arm64/fixture.so")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	eh := f.Section(".eh_frame")
	const fdeAt = 0x14 // after the first CIE
	f.ByteOrder.PutUint32(data[eh.Offset+fdeAt:], 0x7fffff00)
	_, err = ExtractReader(bytes.NewReader(data))
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Section != ".eh_frame" || fe.Offset != fdeAt+4 {
		t.Errorf("corrupt length: %v, want a FormatError at .eh_frame+%#x", err, fdeAt+4)
	}
}

// openAndExtract opens an ELF file for the test's duration and extracts
// its deltas.
func openAndExtract(t *testing.T, path string) (*elf.File, Deltas) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	d, err := Extract(f)
	if err != nil {
		t.Fatalf("extracting %s: %v", path, err)
	}
	return f, d
}

// TestEntryPointSymbols: reading the symbol tables in place finds the same
// entry points as debug/elf's symbol lists.
func TestEntryPointSymbols(t *testing.T) {
	for _, path := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/proc/self/exe"} {
		f, err := elf.Open(path)
		if err != nil {
			t.Skip(err)
		}
		var want []string
		syms, _ := f.Symbols()
		dyn, _ := f.DynamicSymbols()
		for _, s := range append(syms, dyn...) {
			if isEntryPointName([]byte(s.Name)) {
				want = append(want, fmt.Sprintf("%s %#x %d %v", s.Name, s.Value, s.Size, s.Section))
			}
		}
		var got []string
		for _, s := range entryPointSymbols(f) {
			got = append(got, fmt.Sprintf("%s %#x %d %v", s.Name, s.Value, s.Size, s.Section))
		}
		f.Close()
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: entry points %v, debug/elf has %v", path, got, want)
		}
		t.Logf("%s: %d entry point symbols", path, len(got))
	}
}

// A Go executable's deltas alone are not merged: what they would merge into
// is taken as is. This checks that it is what merging makes, on the test
// binary itself (a Go executable without .eh_frame).
func TestGoLayerAloneIsMerged(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gd, err := goDeltas(elfImage{f: f})
	if err != nil {
		t.Fatal(err)
	}
	l := layerOf(gd)
	var st Stats
	want, err := mergeLayers([]layer{l}, &st)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 1000 || !slices.Equal(l.alone, want) {
		t.Fatalf("alone %d deltas, merged %d: not the same", len(l.alone), len(want))
	}
	// With the unknown rows before the first rule, which merging drops.
	l = layerOf(append(Deltas{{Address: gd[0].Address - 16}}, gd...))
	if !slices.Equal(l.alone, want) {
		t.Fatalf("a leading unknown row was kept")
	}
}

// A CFI layer's rows are its deltas as parsed (layer.alone): a file with
// no other layer is not merged. This checks that they are what merging
// makes, on the host's libraries.
func TestCFILayerAloneIsMerged(t *testing.T) {
	var checked int
	for _, path := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
		"/usr/lib/x86_64-linux-gnu/libLLVM-16.so.1", "/usr/bin/node", "/usr/bin/perl"} {
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		arch := archFor(f.Machine)
		st := Stats{Unsupported: map[string]int{}}
		l, err := cfiLayer(elfImage{f: f}, ".eh_frame", arch, codeRanges(f), &st)
		f.Close()
		if err != nil || l == nil {
			t.Fatalf("%s: %v", path, err)
		}
		if l.alone == nil {
			t.Fatalf("%s: a CFI layer without its deltas", path)
		}
		checked++
		alone := compact(slices.Clone(l.alone))
		want, err := mergeLayers([]layer{*l}, &st)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(alone, want) {
			i := 0
			for i < min(len(alone), len(want)) && alone[i] == want[i] {
				i++
			}
			t.Errorf("%s: %d deltas as parsed, %d merged; first difference at %d", path, len(alone), len(want), i)
		}
	}
	if checked == 0 {
		t.Fatal("no library found: the test checked nothing")
	}
}

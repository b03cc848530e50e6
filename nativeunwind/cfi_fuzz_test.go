package nativeunwind

import (
	"debug/elf"
	"testing"
)

// checkDeltas asserts the invariants of Deltas: strictly ascending
// addresses and no two neighbours with the same rule.
func checkDeltas(t *testing.T, d Deltas) {
	t.Helper()
	for i := 1; i < len(d); i++ {
		if d[i].Address <= d[i-1].Address {
			t.Fatalf("delta %d at %#x after %#x", i, d[i].Address, d[i-1].Address)
		}
		if d[i].Rule == d[i-1].Rule {
			t.Fatalf("deltas %d and %d share rule %v", i-1, i, d[i].Rule)
		}
	}
	if n := len(d); n > 0 && d[n-1].Rule.CFA != CFAUnknown {
		t.Fatalf("last delta %v is not CFAUnknown", d[n-1])
	}
}

// realEhFrame returns up to max bytes from the start of a real file's
// .eh_frame: whole CIEs and FDEs to seed the fuzzers with.
func realEhFrame(path string, max int) []byte {
	f, err := elf.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	s := f.Section(".eh_frame")
	if s == nil {
		return nil
	}
	data, err := s.Data()
	if err != nil {
		return nil
	}
	return data[:min(len(data), max)]
}

// fuzzSeeds are .eh_frame sections: hand-built ones for each feature and
// the beginnings of real ones.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	add := func(build func(b *cfiBuilder)) {
		b := &cfiBuilder{addr: testAddr}
		build(b)
		seeds = append(seeds, b.buf)
	}
	add(func(b *cfiBuilder) {
		c := b.cie(amd64CIE("zR", []byte{0x1b}))
		b.fde(c, 0x1000, 0x40, 0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x0a, 0x41, 0x0c, 7, 8, 0x41, 0x0b)
		b.fde(c, 0x1040, 0x40, 0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22)
	})
	add(func(b *cfiBuilder) {
		c := b.cie(amd64CIE("zPLRS", []byte{0x9b, 0, 0, 0, 0, 0x1b, 0x1b}))
		b.fde(c, 0x1000, 0x10, 0x0f, 4, 0x77, 0xa0, 0x01, 0x06)
	})
	add(func(b *cfiBuilder) {
		b.dwarf64 = true
		c := b.cie(arm64CIE("zRB", []byte{0x1b}))
		b.fde(c, 0x1000, 0x40, 0x41, 0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1, 0x41, 0x0d, 29, 0x07, 30)
	})
	for _, p := range []string{"testdata/cfi-arm64/fixture.so", "/lib/x86_64-linux-gnu/libc.so.6"} {
		if b := realEhFrame(p, 2048); b != nil {
			seeds = append(seeds, b)
		}
	}
	return seeds
}

// FuzzEhFrame feeds arbitrary bytes as an .eh_frame (or .debug_frame) at
// a fixed address: extraction must fail with an error or yield valid
// deltas, never panic or hang.
func FuzzEhFrame(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s, false, false)
		f.Add(s, true, false)
	}
	b := &cfiBuilder{debug: true}
	c := b.cie(cieBody(4, "", 1, -8, 16, nil, 0x0c, 7, 8, 0x90, 1))
	b.fde(c, 0x1000, 0x10, 0x41, 0x0e, 16)
	f.Add(b.buf, false, true)
	f.Fuzz(func(t *testing.T, data []byte, arm64, debugFrame bool) {
		a, name := &archAMD64, ".eh_frame"
		if arm64 {
			a = &archARM64
		}
		if debugFrame {
			name = ".debug_frame"
		}
		d, _, err := sectionDeltas(name, data, testAddr, a)
		if err != nil {
			return
		}
		checkDeltas(t, d)
	})
}

// FuzzCFAProgram runs arbitrary CFA instructions in a CIE and an FDE that
// are otherwise well formed.
func FuzzCFAProgram(f *testing.F) {
	f.Add([]byte{0x0c, 7, 8, 0x90, 1}, []byte{0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x0a, 0x41, 0x0c, 7, 8, 0x41, 0x0b}, false)
	f.Add([]byte{0x0c, 7, 8, 0x90, 1}, []byte{0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22}, false)
	f.Add([]byte{0x0c, 31, 0}, []byte{0x41, 0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1, 0x41, 0x0d, 29, 0x41, 0xde, 0xdd, 0x0c, 31, 0, 0x41, 0x2d}, true)
	f.Add([]byte{0x0c, 7, 8, 0x90, 1}, []byte{0x02, 0x10, 0x03, 0x10, 0x00, 0x04, 0x10, 0, 0, 0, 0x1d, 1, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0}, false)
	f.Add([]byte{0x0c, 7, 8, 0x90, 1}, []byte{0x05, 6, 3, 0x11, 6, 0x7c, 0x2f, 6, 1, 0x14, 6, 2, 0x15, 6, 0x7e, 0x10, 6, 2, 0x77, 0, 0x16, 6, 1, 0x30, 0x09, 6, 3, 0x08, 6, 0x07, 6, 0x06, 6, 0xc6, 0x2e, 8, 0x12, 7, 0x7e, 0x13, 0x7d}, false)
	f.Fuzz(func(t *testing.T, cieInsns, fdeInsns []byte, arm64 bool) {
		a, ra, code := &archAMD64, uint64(16), uint64(1)
		if arm64 {
			a, ra, code = &archARM64, 30, 4
		}
		b := &cfiBuilder{addr: testAddr}
		c := b.cie(cieBody(1, "zR", code, -8, ra, []byte{0x1b}, cieInsns...))
		b.fde(c, 0x1000, 0x100, fdeInsns...)
		d, _, err := sectionDeltas(".eh_frame", b.buf, testAddr, a)
		if err != nil {
			return
		}
		checkDeltas(t, d)
		if len(d) == 0 || d[0].Address != 0x1000 || d[len(d)-1].Address > 0x1100 {
			t.Fatalf("deltas %v outside the FDE's range", d)
		}
	})
}

package nativeunwind

import (
	"debug/elf"
	"testing"
)

// TestFramelessLeaves: in the arm64 vDSO (no CFI), the clock functions
// are unwound through the link register and __kernel_getrandom, which
// makes a frame record, is left to the frame pointer; the signal
// trampoline keeps its rule.
func TestFramelessLeaves(t *testing.T) {
	for _, name := range []string{"vdso-6.1.so", "vdso-6.12.so"} {
		t.Run(name, func(t *testing.T) { checkFramelessLeaves(t, "testdata/vdso-arm64/"+name) })
	}
	// A frame record made, a call, a return address saved or loaded: not
	// a frameless leaf.
	for _, c := range []struct {
		name string
		word uint32
	}{
		{"stp x29, x30, [sp, #-16]!", 0xa9bf7bfd},
		{"sub sp, sp, #0x20", 0xd10083ff},
		{"bl .", 0x94000000},
		{"blr x8", 0xd63f0100},
		{"str x30, [sp, #8]", 0xf90007fe},
		{"mov x29, sp", 0x910003fd},
	} {
		code := []byte{byte(c.word), byte(c.word >> 8), byte(c.word >> 16), byte(c.word >> 24)}
		if framelessLeaf(code) {
			t.Errorf("%s (%#08x) counted as a frameless leaf", c.name, c.word)
		}
	}
}

// checkFramelessLeaves checks the rules of one vDSO image.
func checkFramelessLeaves(t *testing.T, path string) {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := Extract(f)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]CFABase{
		"__kernel_clock_gettime": CFASP, "__kernel_gettimeofday": CFASP, "__kernel_clock_getres": CFASP,
		"__kernel_getrandom": CFAUnknown, "__kernel_rt_sigreturn": CFASignal,
	}
	for _, s := range syms {
		w, ok := want[s.Name]
		if !ok {
			continue
		}
		delete(want, s.Name)
		for _, addr := range []uint64{s.Value, s.Value + s.Size - 4} {
			r, _ := d.Lookup(addr)
			if r.CFA != w || (w == CFASP && (r.CFAOffset != 0 || r.RAOffset != 0 || r.FPOffset != 0 || !r.RASigned)) {
				t.Errorf("%s+%#x: %v, want %v with the return address in the link register, maybe signed", s.Name, addr-s.Value, r, w)
			}
		}
	}
	delete(want, "__kernel_getrandom") // since 6.11
	if len(want) > 0 {
		t.Errorf("symbols not found: %v", want)
	}
}

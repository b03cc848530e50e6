package nativeunwind

import (
	"slices"
	"testing"
)

func TestMarkRuntime(t *testing.T) {
	a := Rule{CFA: CFASP, CFAOffset: 8, RAOffset: -8}
	b := Rule{CFA: CFASP, CFAOffset: 16, RAOffset: -8}
	c := Rule{CFA: CFAFP, CFAOffset: 16, FPOffset: -16, RAOffset: -8}
	gap := Rule{}
	mark := func(r Rule) Rule { r.Runtime = 4; return r }
	base := Deltas{{0x100, a}, {0x104, b}, {0x110, c}, {0x180, a}, {0x200, gap}}
	for _, tc := range []struct {
		name       string
		start, end uint64
		want       Deltas
	}{
		{"whole function, aligned with deltas", 0x100, 0x180,
			Deltas{{0x100, mark(a)}, {0x104, mark(b)}, {0x110, mark(c)}, {0x180, a}, {0x200, gap}}},
		{"split at both ends", 0x108, 0x120,
			Deltas{{0x100, a}, {0x104, b}, {0x108, mark(b)}, {0x110, mark(c)}, {0x120, c}, {0x180, a}, {0x200, gap}}},
		{"gaps stay unmarked", 0x180, 0x300,
			Deltas{{0x100, a}, {0x104, b}, {0x110, c}, {0x180, mark(a)}, {0x200, gap}}},
		{"before every delta", 0x10, 0x104,
			Deltas{{0x100, mark(a)}, {0x104, b}, {0x110, c}, {0x180, a}, {0x200, gap}}},
		{"empty range", 0x110, 0x110, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(base)
			got := base.MarkRuntime(tc.start, tc.end, 4)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
			if !slices.Equal(base, orig) {
				t.Errorf("the input was modified")
			}
			for i := 1; i < len(got); i++ {
				if got[i].Address <= got[i-1].Address || got[i].Rule == got[i-1].Rule {
					t.Errorf("deltas %d and %d are out of order or repeat a rule: %v", i-1, i, got)
				}
			}
			for addr := uint64(0); addr < 0x320; addr += 4 {
				r, _ := got.Lookup(addr)
				want, _ := base.Lookup(addr)
				if addr >= tc.start && addr < tc.end && want.CFA != CFAUnknown {
					want.Runtime = 4
				}
				if r != want {
					t.Fatalf("at %#x: rule %v, want %v", addr, r, want)
				}
			}
		})
	}
}

package nativeunwind

import (
	"math/rand/v2"
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

// TestMarkRuntimeRandom checks marking on random deltas and ranges, one
// range after another as a file with two runtimes' code gets them: every
// address keeps its rule, marked within a range, and no two neighbours
// share an address or a rule.
func TestMarkRuntimeRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rules := []Rule{{}, {CFA: CFASP, CFAOffset: 8}, {CFA: CFASP, CFAOffset: 16}, {CFA: CFAFP, CFAOffset: 16, FPOffset: -16}}
	for range 2000 {
		var base Deltas
		for addr := uint64(rng.IntN(8)); addr < 200; addr += 1 + uint64(rng.IntN(12)) {
			r := rules[rng.IntN(len(rules))]
			if n := len(base); n > 0 && base[n-1].Rule == r {
				continue
			}
			base = append(base, Delta{addr, r})
		}
		type mark struct {
			start, end uint64
			rt         uint8
		}
		var marks []mark
		got := base
		for i := range 2 {
			m := mark{uint64(rng.IntN(220)), uint64(rng.IntN(220)), uint8(i + 1)}
			if m.start > m.end {
				m.start, m.end = m.end, m.start
			}
			if len(marks) > 0 && m.start < marks[0].end && marks[0].start < m.end {
				continue // runtimes' code does not overlap
			}
			marks = append(marks, m)
			got = got.MarkRuntime(m.start, m.end, m.rt)
		}
		for i := 1; i < len(got); i++ {
			if got[i].Address <= got[i-1].Address || got[i].Rule == got[i-1].Rule {
				t.Fatalf("deltas %d and %d are out of order or repeat a rule: %v", i-1, i, got)
			}
		}
		for addr := uint64(0); addr < 240; addr++ {
			r, _ := got.Lookup(addr)
			want, _ := base.Lookup(addr)
			for _, m := range marks {
				if addr >= m.start && addr < m.end && want.CFA != CFAUnknown {
					want.Runtime = m.rt
				}
			}
			if r != want {
				t.Fatalf("marks %v of %v: at %d rule %v, want %v (got %v)", marks, base, addr, r, want, got)
			}
		}
		// A consumer that stops early gets no more (a yield after it
		// returned false panics).
		n := 0
		for range MarkRuntimeSeq(slices.Values(base), 10, 100, 1) {
			if n++; n == 2 {
				break
			}
		}
	}
}

package unwindmaps

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/support"
)

// lookupRun is what BPF does with the runs: the last delta of the address's
// page at or below it.
func lookupRun(runs []pageRun, pageBits uint, addr uint64) (uint16, bool) {
	for _, r := range runs {
		if r.page != addr>>pageBits {
			continue
		}
		low := uint16(addr & (1<<pageBits - 1))
		var rule uint16
		for _, d := range r.deltas {
			if d.AddrLow > low {
				break
			}
			rule = d.Rule
		}
		return rule, true
	}
	return 0, false
}

func TestLayoutDeltas(t *testing.T) {
	const pageBits = 8 // small pages to exercise page crossings
	sp8 := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8}
	sp16 := nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 16, RAOffset: -8}
	stop := nativeunwind.Rule{CFA: nativeunwind.CFAStop}
	deltas := nativeunwind.Deltas{
		{Address: 0x1010, Rule: sp8},
		{Address: 0x1014, Rule: sp16},
		{Address: 0x1320, Rule: sp8}, // sp16 spans pages 0x10..0x13
		{Address: 0x1340, Rule: nativeunwind.Rule{}},
		{Address: 0x2000, Rule: stop},
		{Address: 0x2008, Rule: nativeunwind.Rule{}},
	}
	ids := map[nativeunwind.Rule]uint16{}
	intern := func(r nativeunwind.Rule) (uint16, error) {
		if id, ok := ids[r]; ok {
			return id, nil
		}
		ids[r] = uint16(len(ids) + 1)
		return ids[r], nil
	}
	runs, all, err := layoutDeltas(seqOf(deltas), pageBits, intern)
	if err != nil {
		t.Fatal(err)
	}
	var concat []support.StackDelta
	for _, r := range runs {
		concat = append(concat, r.deltas...)
	}
	if !slices.Equal(concat, all) {
		t.Errorf("the runs' deltas in order %v, the array %v: they must be the same", concat, all)
	}
	for i, r := range runs {
		if len(r.deltas) == 0 || r.deltas[0].AddrLow != 0 {
			t.Errorf("run %d (page %#x) does not start at the page start: %+v", i, r.page, r.deltas)
		}
	}
	// Every address must get the rule Deltas.Lookup gives.
	for addr := uint64(0xf00); addr < 0x2200; addr++ {
		want, known := deltas.Lookup(addr)
		got, found := lookupRun(runs, pageBits, addr)
		wantID := uint16(0)
		if known {
			wantID = ids[want]
		}
		if got != wantID || (known && !found) {
			t.Fatalf("address %#x: rule %d (page found %v), want %d", addr, got, found, wantID)
		}
	}
	if got := len(runs); got != 5 {
		t.Errorf("%d pages, want 5 (0x10-0x13 and 0x20)", got)
	}
}

func TestLayoutDeltasRuleTableFull(t *testing.T) {
	deltas := nativeunwind.Deltas{{Address: 0x1000, Rule: nativeunwind.Rule{CFA: nativeunwind.CFASP, CFAOffset: 8}}}
	_, _, err := layoutDeltas(seqOf(deltas), 16, func(nativeunwind.Rule) (uint16, error) { return 0, errTooManyRules })
	if err != errTooManyRules {
		t.Errorf("error %v, want errTooManyRules", err)
	}
}

// TestCFABaseMatchesBPF: the rule kinds are written to BPF as their
// nativeunwind values, which must be enum cfa_base's.
func TestCFABaseMatchesBPF(t *testing.T) {
	spec, err := support.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("cfa_base", &e); err != nil {
		t.Fatal(err)
	}
	want := map[string]nativeunwind.CFABase{
		"CFA_UNKNOWN": nativeunwind.CFAUnknown, "CFA_SP": nativeunwind.CFASP, "CFA_FP": nativeunwind.CFAFP,
		"CFA_STOP": nativeunwind.CFAStop, "CFA_SIGNAL": nativeunwind.CFASignal, "CFA_PLT": nativeunwind.CFAPLT,
		"CFA_GO_CGO": nativeunwind.CFAGoCgo,
	}
	if len(e.Values) != len(want) {
		t.Errorf("BPF has %d CFA bases, nativeunwind %d", len(e.Values), len(want))
	}
	for _, v := range e.Values {
		if w, ok := want[v.Name]; !ok || uint64(w) != v.Value {
			t.Errorf("BPF %s=%d has no equal nativeunwind value", v.Name, v.Value)
		}
	}
}

// BenchmarkLayoutDeltas lays out a million deltas (libLLVM's count) over
// 64 MiB of code; allocated bytes per op are the garbage a large file's
// load makes.
func BenchmarkLayoutDeltas(b *testing.B) {
	deltas, intern := millionDeltas()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := layoutDeltas(seqOf(deltas), 16, intern); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCachedLayout lays out a million cached deltas: decoded into a
// slice first, as loads once did, and decoded as they are laid out.
func BenchmarkCachedLayout(b *testing.B) {
	deltas, intern := millionDeltas()
	id := libpf.FileID{1}
	file := encodeDeltaCache(id, deltas)
	b.Run("decoded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d, err := decodeDeltaCache(file, id)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := layoutDeltas(seqOf(d), 16, intern); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("streamed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := parseDeltaCache(file, id)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := layoutDeltas(c.seq(), 16, intern); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// millionDeltas are a million deltas (libLLVM's count) over 64 MiB of
// code, three rules taking turns, and the interning of those rules.
func millionDeltas() (nativeunwind.Deltas, func(nativeunwind.Rule) (uint16, error)) {
	rules := []nativeunwind.Rule{
		{CFA: nativeunwind.CFASP, CFAOffset: 8, RAOffset: -8},
		{CFA: nativeunwind.CFASP, CFAOffset: 16, RAOffset: -8},
		{CFA: nativeunwind.CFAFP, CFAOffset: 16, RAOffset: -8, FPOffset: -16},
	}
	deltas := make(nativeunwind.Deltas, 1<<20)
	for i := range deltas {
		deltas[i] = nativeunwind.Delta{Address: 0x400000 + uint64(i)*64, Rule: rules[i%len(rules)]}
	}
	return deltas, func(r nativeunwind.Rule) (uint16, error) { return uint16(slices.Index(rules, r) + 1), nil }
}

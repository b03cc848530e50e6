package execinfo

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
)

// TestStrippedGoNamedFromPclntab checks that a Go binary stripped of
// .symtab still gets Go function names, from .gopclntab, and that they
// agree with nm on the unstripped binary.
func TestStrippedGoNamedFromPclntab(t *testing.T) {
	for _, tool := range []string{"go", "nm", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "gochain")
	build := exec.Command("go", "build", "-o", bin, "../../utils/workloads/gochain")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	syms := filetest.NMFunctions(t, bin)
	stripped := filepath.Join(dir, "gochain-stripped")
	if out, err := exec.Command("strip", "--strip-all", "-o", stripped, bin).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, out)
	}
	f, err := os.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := parseELF(f, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for name, addr := range syms {
		if !strings.HasPrefix(name, "main.") && !strings.HasPrefix(name, "runtime.") ||
			name == "runtime.text" || name == "runtime.etext" { // linker markers
			continue
		}
		// .symtab marks assembly functions with their ABI; .gopclntab
		// does not.
		if got, _ := d.symbols.lookup(addr + 1); got != strings.TrimSuffix(name, ".abi0") {
			t.Errorf("lookup(%s+1 = %#x) = %q", name, addr+1, got)
		}
		checked++
	}
	for _, name := range []string{"main.goLeaf", "main.goMid", "main.goTop", "main.main", "runtime.goexit.abi0"} {
		if _, ok := syms[name]; !ok {
			t.Errorf("nm lists no %s", name)
		}
	}
	t.Logf("%d Go functions agree with nm; the table has %d", checked, d.symbols.len())
}

// BenchmarkBuildSymbolTable builds the table of a runtime's binary: node's
// .symtab and .dynsym together have about 180,000 function symbols, many
// of them twice.
func BenchmarkBuildSymbolTable(b *testing.B) {
	const n = 180_000
	base := make([]symbolCandidate, n)
	for i := range base {
		// Every other symbol is in both tables, at one address.
		addr := uint64(0x400000 + (i/2)*64)
		base[i] = symbolCandidate{start: addr, size: 48, name: fmt.Sprintf("v8::internal::Function%d", i/2), rank: i % 2}
	}
	// The tables' order is not the addresses'.
	rand.New(rand.NewPCG(1, 2)).Shuffle(n, func(i, j int) { base[i], base[j] = base[j], base[i] })
	cands := make([]symbolCandidate, n)
	b.ReportAllocs()
	for b.Loop() {
		copy(cands, base)
		if t := buildSymbolTable(cands); t.len() != n/2 {
			b.Fatalf("%d symbols", t.len())
		}
	}
}

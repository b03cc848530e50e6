package execinfo

import (
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

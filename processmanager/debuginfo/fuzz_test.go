package debuginfo

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// FuzzDWARFLines mutates the DWARF sections of the C++ workload built
// with -g (DWARF 5, and 4 with .debug_ranges) and looks up addresses
// around its code: the unit index, the line-table row search, the scope
// walk and the name links must not panic or loop. debug/dwarf itself
// trusts some lengths: a panic raised inside it is what File.Lookup's
// recover is for and is tolerated here; one raised in this package is a
// failure.
func FuzzDWARFLines(f *testing.F) {
	dir := f.TempDir()
	for _, flags := range [][]string{{"-gdwarf-5"}, {"-gdwarf-4"}} {
		bin := filepath.Join(dir, "bin"+flags[0])
		args := append([]string{"-O2", "-o", bin}, flags...)
		if out, err := exec.Command("g++", append(args, cppChain)...).CombinedOutput(); err != nil {
			f.Fatalf("g++: %v\n%s", err, out)
		}
		ef, err := elf.Open(bin)
		if err != nil {
			f.Fatal(err)
		}
		secs := map[string][]byte{}
		for _, name := range append(dwarfSections, dwarf5Sections...) {
			if s := ef.Section(".debug_" + name); s != nil {
				if secs[name], err = s.Data(); err != nil {
					f.Fatal(err)
				}
			}
		}
		text := ef.Section(".text")
		ef.Close()
		f.Add(secs["info"], secs["abbrev"], secs["line"], secs["str"], secs["line_str"],
			append(secs["rnglists"], secs["ranges"]...), text.Addr, text.Size)
	}
	f.Fuzz(func(t *testing.T, info, abbrev, line, str, lineStr, ranges []byte, start, size uint64) {
		secs := map[string][]byte{"info": info, "abbrev": abbrev, "line": line, "str": str, "line_str": lineStr,
			"rnglists": ranges, "ranges": ranges}
		defer func() {
			if p := recover(); p != nil {
				if stack := string(debug.Stack()); !panickedIn(stack, "debug/dwarf.") {
					t.Fatalf("panic: %v\n%s", p, stack)
				}
			}
		}()
		l, _, err := newDWARFLines(secs)
		if err != nil {
			return
		}
		size = min(size, 4096)
		for addr := start; addr < start+size; addr += 7 {
			frames, err := l.lookup(addr)
			if err == nil && len(frames) > maxScopeEntries {
				t.Fatalf("%d frames", len(frames))
			}
		}
	})
}

// panickedIn says whether the innermost frame of a goroutine's stack,
// below the runtime's panic machinery, is in package prefix pkg.
func panickedIn(stack, pkg string) bool {
	_, after, ok := strings.Cut(stack, "panic(")
	if !ok {
		return false
	}
	// The frame after panic's own two lines is the one that panicked.
	lines := strings.Split(after, "\n")
	for _, l := range lines[2:] {
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") {
			continue
		}
		return strings.HasPrefix(l, pkg)
	}
	return false
}

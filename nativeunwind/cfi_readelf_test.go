package nativeunwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The agreement tests compare Extract with binutils' interpretation of the
// same CFI: `readelf --debug-dump=frames-interp` prints, per FDE, a table
// of rows (LOC, CFA, one column per register with a rule, ra).

type readelfRow struct {
	loc         uint64
	cfa, fp, ra string
	cieRA       uint64 // the CIE's return address column
	signal      bool
}

type readelfFDE struct {
	section    string
	start, end uint64
	rows       []readelfRow
}

var (
	readelfCIE    = regexp.MustCompile(`^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE "([^"]*)" .* ra=(\d+)`)
	readelfFDELn  = regexp.MustCompile(`^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)`)
	readelfRowLn  = regexp.MustCompile(`^([0-9a-f]{16}) (.*)$`)
	readelfTokens = regexp.MustCompile(`r\d+ \([^)]*\)|\S+`)
	readelfSect   = regexp.MustCompile(`^Contents of the (\S+) section`)
)

// readelfFrames runs readelf on path and parses its tables. fpName is the
// frame pointer's column name (rbp, x29).
func readelfFrames(t *testing.T, path, fpName string) []readelfFDE {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		t.Skip("readelf not installed")
	}
	out, err := exec.Command("readelf", "-W", "--debug-dump=frames-interp", path).Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("readelf %s: %v", path, err)
	}
	// readelf exits with 1 for libc without a message (its separate debug
	// file is missing) after printing everything.
	type cieInfo struct {
		rows   []readelfRow
		ra     uint64
		signal bool
	}
	var (
		fdes    []readelfFDE
		section string
		cies    = map[string]*cieInfo{}
		curCIE  *cieInfo
		curFDE  *readelfFDE
		cols    []string
	)
	finish := func() {
		if curFDE != nil {
			fdes = append(fdes, *curFDE)
		}
		curFDE, curCIE = nil, nil
	}
	var fdeCIE *cieInfo
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := readelfSect.FindStringSubmatch(line); m != nil {
			finish()
			section = m[1]
			continue
		}
		if strings.HasSuffix(line, "ZERO terminator") {
			finish()
			cols = nil
			continue
		}
		if m := readelfCIE.FindStringSubmatch(line); m != nil {
			finish()
			ra, _ := strconv.ParseUint(m[3], 10, 64)
			curCIE = &cieInfo{ra: ra, signal: strings.Contains(m[2], "S")}
			cies[section+"/"+m[1]] = curCIE
			cols = nil
			continue
		}
		if m := readelfFDELn.FindStringSubmatch(line); m != nil {
			finish()
			fdeCIE = cies[section+"/"+m[1]]
			if fdeCIE == nil {
				t.Fatalf("readelf %s: FDE before its CIE: %s", path, line)
			}
			start, _ := strconv.ParseUint(m[2], 16, 64)
			end, _ := strconv.ParseUint(m[3], 16, 64)
			curFDE = &readelfFDE{section: section, start: start, end: end}
			// Without instructions readelf prints no table: the CIE's row.
			for _, r := range fdeCIE.rows {
				r.loc = start
				curFDE.rows = append(curFDE.rows, r)
			}
			cols = nil
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "LOC ") {
			cols = strings.Fields(line)[1:]
			if curFDE != nil {
				curFDE.rows = curFDE.rows[:0]
			}
			continue
		}
		m := readelfRowLn.FindStringSubmatch(line)
		if m == nil || cols == nil {
			continue
		}
		loc, _ := strconv.ParseUint(m[1], 16, 64)
		vals := readelfTokens.FindAllString(m[2], -1)
		if len(vals) != len(cols) {
			t.Fatalf("readelf %s: %d values for %d columns: %q", path, len(vals), len(cols), line)
		}
		row := readelfRow{loc: loc, fp: "u", ra: "u"}
		for i, c := range cols {
			switch c {
			case "CFA":
				row.cfa = vals[i]
			case fpName:
				row.fp = vals[i]
			case "ra":
				row.ra = vals[i]
			}
		}
		switch {
		case curFDE != nil:
			row.cieRA, row.signal = fdeCIE.ra, fdeCIE.signal
			curFDE.rows = append(curFDE.rows, row)
		case curCIE != nil:
			row.cieRA, row.signal = curCIE.ra, curCIE.signal
			curCIE.rows = append(curCIE.rows, row)
		}
	}
	finish()
	return fdes
}

// expectation is the rule a readelf row should become, or, where readelf
// cannot tell (CFA expressions, arm64 "u"), the acceptable kinds.
type expectation struct {
	rule  Rule
	kinds []CFABase // if set, any rule of these kinds is right
}

func (e expectation) matches(r Rule) bool {
	if e.kinds != nil {
		return slices.Contains(e.kinds, r.CFA)
	}
	r.RASigned = false // readelf does not show the signing state
	return r == e.rule
}

func (e expectation) String() string {
	if e.kinds != nil {
		return fmt.Sprint(e.kinds)
	}
	return e.rule.String()
}

// expect maps a readelf row to a rule: sp and fp are the readelf names of
// the stack and frame pointers.
func expect(row readelfRow, a *archInfo, sp, fp string) expectation {
	if row.signal {
		return expectation{rule: Rule{CFA: CFASignal}}
	}
	raUndefined := row.ra == "u"
	if a.machine == machineAMD64 && raUndefined {
		return expectation{rule: Rule{CFA: CFAStop}}
	}
	if row.cfa == "exp" {
		return expectation{kinds: []CFABase{CFAPLT, CFASignal, CFAUnknown}}
	}
	unknown := expectation{rule: Rule{}}
	var r Rule
	base, off, ok := strings.Cut(row.cfa, "+")
	if !ok {
		base, off, ok = strings.Cut(row.cfa, "-")
		off = "-" + off
	}
	n, err := strconv.ParseInt(off, 10, 32)
	switch {
	case !ok || err != nil:
		return unknown
	case base == sp:
		r.CFA = CFASP
	case base == fp:
		r.CFA = CFAFP
	default:
		return unknown
	}
	r.CFAOffset = int32(n)
	switch {
	case row.fp == "u" || row.fp == "s":
	case strings.HasPrefix(row.fp, "c") && row.fp != "c+0":
		v, err := strconv.ParseInt(row.fp[1:], 10, 32)
		if err != nil {
			return unknown
		}
		r.FPOffset = int32(v)
	default:
		return unknown
	}
	switch {
	case raUndefined || row.ra == "s":
		// arm64: readelf prints "u" both for "no rule" (still in LR) and
		// DW_CFA_undefined; the CIE of hand-written code may name another
		// return address column.
		if row.cieRA != a.lr {
			return unknown
		}
		if raUndefined {
			return expectation{kinds: []CFABase{r.CFA, CFAStop}}
		}
	case strings.HasPrefix(row.ra, "c") && row.ra != "c+0":
		v, err := strconv.ParseInt(row.ra[1:], 10, 32)
		if err != nil {
			return unknown
		}
		r.RAOffset = int32(v)
	default:
		return unknown
	}
	return expectation{rule: r}
}

// agreement is the outcome of comparing one file.
type agreement struct {
	fdes, rows, addrs, mismatches int
	skippedFDEs                   int // overlapping, outside code, or shadowed by .eh_frame
	stopOverrides                 int // addresses in entry point symbols
	byKind                        map[CFABase]int
}

// compareWithReadelf checks Extract(path) against readelf at each row's
// first, middle and last address.
func compareWithReadelf(t *testing.T, path string) agreement {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := archFor(f.Machine)
	sp, fp := "rsp", "rbp"
	if a.machine == machineARM64 {
		sp, fp = "sp", "x29"
	}
	fdes := readelfFrames(t, path, fp)
	d, _, err := extract(elfImage{f: f}, false) // the CFI alone: readelf knows nothing of .gopclntab
	if err != nil {
		t.Fatalf("Extract(%s): %v", path, err)
	}
	code := codeRanges(f)
	symbols := entryPointRanges(f)

	// FDEs overlapping another FDE of any section, or .debug_frame FDEs
	// overlapping any .eh_frame FDE, are ambiguous: skip them.
	ambiguous := make([]bool, len(fdes))
	order := make([]int, len(fdes))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmpUint(fdes[x].start, fdes[y].start) })
	for k := 1; k < len(order); k++ {
		for j := k - 1; j >= 0 && j >= k-8; j-- {
			p, q := fdes[order[j]], fdes[order[k]]
			if p.end > q.start && p.start < q.end && p.start != p.end && q.start != q.end {
				ambiguous[order[j]], ambiguous[order[k]] = true, true
			}
		}
	}

	ag := agreement{byKind: map[CFABase]int{}}
	for i, fd := range fdes {
		if _, inCode := clipToCode(code, fd.start, fd.end); ambiguous[i] || !inCode || fd.start == fd.end {
			ag.skippedFDEs++
			continue
		}
		ag.fdes++
		for k, row := range fd.rows {
			next := fd.end
			if k+1 < len(fd.rows) {
				next = fd.rows[k+1].loc
			}
			if row.loc >= next {
				continue // a row readelf prints for an advance of 0
			}
			ag.rows++
			want := expect(row, a, sp, fp)
			for _, addr := range []uint64{row.loc, row.loc + (next-row.loc)/2, next - 1} {
				ag.addrs++
				got, _ := d.Lookup(addr)
				ag.byKind[got.CFA]++
				if inRanges(symbols, addr) {
					ag.stopOverrides++
					continue
				}
				if !want.matches(got) {
					ag.mismatches++
					if ag.mismatches <= 20 {
						t.Errorf("%s %s %#x (row %#x: CFA %s fp %s ra %s): got %v, want %v",
							filepath.Base(path), fd.section, addr, row.loc, row.cfa, row.fp, row.ra, got, want)
					}
				}
			}
		}
	}
	t.Logf("%s: %d FDEs (%d skipped), %d rows, %d addresses compared, %d in entry point symbols, %d mismatches; kinds %v",
		path, ag.fdes, ag.skippedFDEs, ag.rows, ag.addrs, ag.stopOverrides, ag.mismatches, ag.byKind)
	if ag.rows == 0 {
		t.Errorf("%s: no rows compared", path)
	}
	return ag
}

// entryPointRanges are the ranges markEntryPoints rewrites.
func entryPointRanges(f *elf.File) []addrRange {
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	var rs []addrRange
	for _, s := range append(syms, dyn...) {
		n := symbolName(s.Name)
		if s.Size > 0 && (stopSymbols[n] || cloneSymbols[n] || signalSymbols[n]) {
			rs = append(rs, addrRange{s.Value, s.Value + s.Size})
		}
	}
	return rs
}

func inRanges(rs []addrRange, a uint64) bool {
	for _, r := range rs {
		if a >= r.start && a < r.end {
			return true
		}
	}
	return false
}

// buildC compiles a C program with gcc into dir and returns its path.
func buildC(t *testing.T, dir, name, src string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	c := filepath.Join(dir, name+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("gcc", append(args, "-o", out, c)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

// testProgram has frames of every common shape: leaf, stack-only,
// callee-saved registers, alloca (CFA on the frame pointer), a tail call
// and noreturn paths.
const testProgram = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <alloca.h>

__attribute__((noinline)) static long leaf(long x) { return x * 7 + 3; }
__attribute__((noinline)) static long many(long a, long b, long c, long d, long e, long f, long g, long h) {
	long s = 0;
	for (long i = 0; i < a; i++) s += leaf(i ^ b) * c + d * e - f * g + h;
	return s;
}
__attribute__((noinline)) static long dyn(int n) {
	char *p = alloca(n);
	memset(p, n, n);
	return many(p[n / 2], n, 2, 3, 4, 5, 6, 7);
}
__attribute__((noinline)) static long recurse(int n) {
	if (n <= 0) return dyn(16 + n);
	return recurse(n - 1) + recurse(n - 2) + 1;
}
__attribute__((noinline, noreturn)) static void die(const char *why) { fprintf(stderr, "%s\n", why); exit(1); }
int main(int argc, char **argv) {
	if (argc > 5) die("too many");
	long r = recurse(argc + 3);
	printf("%ld\n", r);
	return 0;
}
`

// debugFrameUnit is compiled without unwind tables but with -g: its CFI
// lands in .debug_frame.
const debugFrameUnit = `
__attribute__((noinline)) long df_leaf(long x) { return x + 1; }
long df_caller(long x) { volatile long a[16]; a[x & 15] = x; return df_leaf(a[3]) * 2; }
`

func TestReadelfAgreementLibraries(t *testing.T) {
	files := []string{
		"/lib/x86_64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
		"/usr/bin/bash",
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the system libraries are x86_64 ones")
	}
	// More files to check, e.g. the largest libraries of the machine.
	if env := os.Getenv("NATIVEUNWIND_READELF_FILES"); env != "" {
		files = filepath.SplitList(env)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				t.Skip(err)
			}
			compareWithReadelf(t, path)
		})
	}
}

func TestReadelfAgreementCompiled(t *testing.T) {
	dir := t.TempDir()
	t.Run("omit-frame-pointer", func(t *testing.T) {
		bin := buildC(t, dir, "omitfp", testProgram, "-O2", "-fomit-frame-pointer")
		compareWithReadelf(t, bin)
	})
	t.Run("frame-pointer", func(t *testing.T) {
		bin := buildC(t, dir, "fp", testProgram, "-O1", "-fno-omit-frame-pointer")
		ag := compareWithReadelf(t, bin)
		if ag.byKind[CFAFP] == 0 {
			t.Errorf("no CFA=FP rows in a frame pointer build")
		}
	})
	t.Run("debug_frame", func(t *testing.T) {
		unit := filepath.Join(dir, "dfunit.c")
		if err := os.WriteFile(unit, []byte(debugFrameUnit), 0o644); err != nil {
			t.Fatal(err)
		}
		obj := filepath.Join(dir, "dfunit.o")
		if b, err := exec.Command("gcc", "-O2", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
			"-c", "-o", obj, unit).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, b)
		}
		bin := buildC(t, dir, "withdf", testProgram+"long df_caller(long);\nlong use(long x) { return df_caller(x); }\n",
			"-O2", obj)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Section(".debug_frame") == nil {
			t.Fatal("gcc produced no .debug_frame")
		}
		compareWithReadelf(t, bin)
	})
}

// Go binaries built by the toolchain carry DWARF .debug_frame (zlib
// compressed); the released go command is stripped of it.
func TestReadelfAgreementGo(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	t.Run("go-command", func(t *testing.T) {
		f, err := elf.Open(goBin)
		if err != nil {
			t.Skip(err)
		}
		defer f.Close()
		d, st, err := ExtractWithStats(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d deltas, %+v", goBin, len(d), st)
		if f.Section(".eh_frame") == nil && f.Section(".debug_frame") == nil && st.FDEs != 0 {
			t.Errorf("FDEs without CFI sections")
		}
		if f.Section(".symtab") != nil {
			checkStop(t, f, d, "runtime.goexit.abi0")
		}
	})
	t.Run("built", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds a Go program")
		}
		bin := buildGo(t)
		compareWithReadelf(t, bin)
		f, d := openAndExtract(t, bin)
		for _, s := range []string{"runtime.goexit.abi0", "runtime.mstart.abi0", "runtime.rt0_go.abi0"} {
			checkStop(t, f, d, s)
		}
	})
}

func TestReadelfAgreementARM64(t *testing.T) {
	files := []string{
		"testdata/cfi-arm64/fixture.so",
		// Installed with gcc-aarch64-linux-gnu (package libc6-arm64-cross).
		"/usr/aarch64-linux-gnu/lib/libc.so.6",
		"/usr/aarch64-linux-gnu/lib/libgcc_s.so.1",
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				t.Skip(err)
			}
			compareWithReadelf(t, path)
		})
	}
}

// checkStop asserts that the symbol's whole range is CFAStop.
func checkStop(t *testing.T, f *elf.File, d Deltas, name string) {
	t.Helper()
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	for _, s := range append(syms, dyn...) {
		if s.Name != name && symbolName(s.Name) != name {
			continue
		}
		for _, a := range []uint64{s.Value, s.Value + s.Size/2, s.Value + s.Size - 1} {
			if r, _ := d.Lookup(a); r.CFA != CFAStop {
				t.Errorf("%s+%#x: %v, want stop", name, a-s.Value, r)
			}
		}
		return
	}
	t.Errorf("symbol %s not found", name)
}

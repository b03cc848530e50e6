package python

import (
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

// ltDumpScript prints the line tables of a corpus of code objects and the
// lines CPython itself gives their offsets; see its header.
//
//go:embed testdata/linetable/dump_lines.py
var ltDumpScript string

type ltDump struct {
	Version string       `json:"version"`
	Codes   []ltDumpCode `json:"codes"`
}

// ltDumpCode is one code object; Lines, C and Pos hold the line of every
// 2-byte code unit by three of CPython's decoders, nil for "no line" (Pos
// is nil before 3.11).
type ltDumpCode struct {
	File    string `json:"file"`
	Name    string `json:"name"`
	First   int    `json:"first"`
	Table   string `json:"table"`
	CodeLen int    `json:"codelen"`
	Lines   []*int `json:"lines"`
	C       []*int `json:"c"`
	Pos     []*int `json:"pos"`
}

// ltNewestMinor is the newest minor version the line tables are checked
// for.
const ltNewestMinor = 15

// ltPythons finds one CPython per minor version 3.6 to 3.15: a pyenv
// installation ($PYENV_ROOT, or ~/.pyenv) first, else python3.X on PATH
// (not a pyenv shim, which fails for a version that is not installed),
// else the release utils/pyfetch fetched.
func ltPythons() map[int]string {
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		if home, err := os.UserHomeDir(); err == nil {
			root = filepath.Join(home, ".pyenv")
		}
	}
	found := map[int]string{}
	for minor := 6; minor <= ltNewestMinor; minor++ {
		name := fmt.Sprintf("python3.%d", minor)
		matches, _ := filepath.Glob(filepath.Join(root, "versions", fmt.Sprintf("3.%d.*", minor), "bin", name))
		sort.Strings(matches)
		if len(matches) > 0 {
			found[minor] = matches[len(matches)-1]
		} else if p, err := exec.LookPath(name); err == nil && !strings.Contains(p, "/shims/") {
			found[minor] = p
		} else if p, err := pyfetch.Python(name[len("python"):]); err == nil {
			found[minor] = p
		}
	}
	return found
}

// TestLineTableAgainstCPython checks LineForOffset, for every offset of
// every code object of a corpus (sample functions, generated code at the
// formats' limits, a few stdlib modules and random well-formed tables),
// against what each CPython found says the line is.
func TestLineTableAgainstCPython(t *testing.T) {
	pythons := ltPythons()
	if len(pythons) == 0 {
		t.Fatal("no CPython 3.6 to 3.15 found: install one with pyenv or as python3.X on PATH")
	}
	for minor := 6; minor <= ltNewestMinor; minor++ {
		t.Run(fmt.Sprintf("3.%d", minor), func(t *testing.T) {
			path, ok := pythons[minor]
			if !ok {
				t.Fatalf("no python3.%d: pyenv installs 3.6-3.13, make test-deps fetches the newer ones (utils/pyfetch)", minor)
			}
			t.Parallel()
			ltCheckAgainst(t, path, minor)
		})
	}
}

func ltCheckAgainst(t *testing.T, python string, minor int) {
	// Isolated from the environment, but for a fetched release, whose
	// wrapper finds its standard library through PYTHONHOME: only without
	// the user's site directory.
	isolate := "-I"
	if strings.HasPrefix(python, fetchcache.Dir("")) {
		isolate = "-s"
	}
	out, err := exec.Command(python, isolate, "-c", ltDumpScript).Output()
	if err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	var dump ltDump
	if err := json.Unmarshal(out, &dump); err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	if !strings.HasPrefix(dump.Version, fmt.Sprintf("3.%d.", minor)) {
		t.Fatalf("%s is %s", python, dump.Version)
	}
	format, err := LineTableFormatFor(Version{Major: 3, Minor: minor})
	if err != nil {
		t.Fatal(err)
	}
	var offsets, noLine, synthetic, failures int
	features := map[string]int{}
	for _, c := range dump.Codes {
		table, err := hex.DecodeString(c.Table)
		if err != nil {
			t.Fatal(err)
		}
		if c.File == "<synthetic>" {
			synthetic++
		}
		ltCountFeatures(format, table, features)
		for i := 0; i < c.CodeLen/2; i++ {
			line, ok, err := LineForOffset(format, table, c.First, uint32(2*i))
			if err != nil {
				t.Fatalf("%s %s:%s: offset %d: %v", dump.Version, c.File, c.Name, 2*i, err)
			}
			offsets++
			if !ok {
				noLine++
			}
			for _, want := range []struct {
				by    string
				lines []*int
			}{{"the Python-level decoder", c.Lines}, {"PyCode_Addr2Line", c.C}, {"co_positions()", c.Pos}} {
				if want.lines == nil || ltSameLine(want.lines[i], line, ok) {
					continue
				}
				if failures++; failures <= 10 {
					t.Errorf("%s %s:%s (first line %d, table %s): offset %d: got %d (ok %v), %s says %v",
						dump.Version, c.File, c.Name, c.First, c.Table, 2*i, line, ok, want.by, ltFormatLine(want.lines[i]))
				}
			}
		}
	}
	for _, f := range ltFeatureNames[format] {
		if features[f] == 0 {
			t.Errorf("%s: no table in the corpus has %s", dump.Version, f)
		}
	}
	t.Logf("%s: %d code objects (%d synthetic), %d offsets (%d without a line), %d mismatches; table features %v",
		dump.Version, len(dump.Codes), synthetic, offsets, noLine, failures, features)
}

func ltSameLine(want *int, line int, ok bool) bool {
	if want == nil {
		return !ok
	}
	return ok && line == *want
}

func ltFormatLine(l *int) string {
	if l == nil {
		return "no line"
	}
	return fmt.Sprint(*l)
}

// ltFeatureNames are the encoding rules of each format the corpus must
// exercise, so that it keeps testing what it claims to.
var ltFeatureNames = map[LineTableFormat][]string{
	LineTableLnotab:    {"byte increment 255", "line increment 127", "line increment -128", "negative line increment"},
	LineTableRanges:    {"length 254", "no line", "empty range", "line delta 127", "line delta -127"},
	LineTableLocations: {"short form", "one-line form", "no-columns form", "long form", "no location", "8-unit entry", "varint of 3+ bytes"},
}

// ltCountFeatures counts the encoding rules a well-formed table uses.
func ltCountFeatures(format LineTableFormat, table []byte, features map[string]int) {
	count := func(name string, has bool) {
		if has {
			features[name]++
		}
	}
	switch format {
	case LineTableLnotab:
		for i := 0; i+1 < len(table); i += 2 {
			n, d := table[i], int8(table[i+1])
			count("byte increment 255", n == 255)
			count("line increment 127", d == 127)
			count("line increment -128", d == -128)
			count("negative line increment", d < 0)
		}
	case LineTableRanges:
		for i := 0; i+1 < len(table); i += 2 {
			n, d := table[i], int8(table[i+1])
			count("length 254", n == 254)
			count("no line", d == ltNoLine310)
			count("empty range", n == 0)
			count("line delta 127", d == 127)
			count("line delta -127", d == -127)
		}
	case LineTableLocations:
		for i, b := range table {
			if b&ltEntryStart == 0 {
				continue
			}
			code := b >> 3 & 0xf
			count("short form", code < ltCodeOneLine0)
			count("one-line form", code >= ltCodeOneLine0 && code <= ltCodeOneLine2)
			count("no-columns form", code == ltCodeNoColumns)
			count("long form", code == ltCodeLong)
			count("no location", code == ltCodeNone)
			count("8-unit entry", b&7 == 7)
			count("varint of 3+ bytes", (code == ltCodeNoColumns || code == ltCodeLong) &&
				i+2 < len(table) && table[i+1]&0x40 != 0 && table[i+2]&0x40 != 0)
		}
	}
}

package nativeunwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// goBuild is one way of building the test programs in
// testdata/gopclntab; the tests build them at test time.
type goBuild struct {
	name      string
	goarch    string
	cgo       bool
	pie       bool
	strip     bool   // -ldflags=-s -w: no .symtab, no DWARF
	testBin   bool   // go test -c of testpkg instead of prog
	toolchain string // GOTOOLCHAIN; "" is the local one
	twin      string // the build with the same layout, symbols kept
	noReplay  bool   // its code is a sibling's: skip the objdump replay
	// derive edits a copy of the twin's file instead of building.
	derive func(t *testing.T, b []byte) []byte
}

// goBuilds are the variants every pclntab test covers. Older layouts
// (Go 1.2–1.19) cannot be built here: the module proxy serves toolchains
// from Go 1.21 on, which all write the 1.20 layout; the synthetic tests
// cover the older ones.
var goBuilds = []goBuild{
	{name: "amd64", goarch: "amd64"},
	{name: "amd64-pie", goarch: "amd64", pie: true, noReplay: true},
	{name: "amd64-stripped", goarch: "amd64", strip: true, twin: "amd64"},
	{name: "amd64-cgo", goarch: "amd64", cgo: true, noReplay: true},
	{name: "amd64-cgo-pie", goarch: "amd64", cgo: true, pie: true},
	{name: "amd64-cgo-pie-stripped", goarch: "amd64", cgo: true, pie: true, strip: true, twin: "amd64-cgo-pie"},
	{name: "amd64-gotest", goarch: "amd64", testBin: true},
	{name: "amd64-gotest-stripped", goarch: "amd64", testBin: true, strip: true, twin: "amd64-gotest"},
	{name: "arm64", goarch: "arm64"},
	{name: "arm64-pie", goarch: "arm64", pie: true, noReplay: true},
	{name: "arm64-pie-stripped", goarch: "arm64", pie: true, strip: true, twin: "arm64-pie"},
	{name: "arm64-cgo-pie", goarch: "arm64", cgo: true, pie: true},
	{name: "amd64-go1.21", goarch: "amd64", toolchain: "go1.21.0"},
	{name: "amd64-go1.22-cgo-pie", goarch: "amd64", cgo: true, pie: true, toolchain: "go1.22.0"},
	// Found by the runtime.pclntab symbol: the section is renamed.
	{name: "amd64-cgo-renamed", twin: "amd64-cgo", derive: renameSection(".gopclntab", ".gopclntaX")},
	// Found by scanning, text start from a scan for moduledata: no
	// section headers and no symbols.
	{name: "amd64-cgo-pie-nosections", twin: "amd64-cgo-pie", derive: dropSectionHeaders},
	{name: "arm64-pie-nosections", twin: "arm64-pie", derive: dropSectionHeaders},
}

// crossCC are the C compilers of cgo builds for another architecture
// (.ci/install-test-deps.sh installs the arm64 one on amd64 machines).
var crossCC = map[string]string{"arm64": "aarch64-linux-gnu-gcc", "amd64": "x86_64-linux-gnu-gcc"}

// goBuildSet builds variants on demand into one temporary directory.
type goBuildSet struct {
	dir   string
	paths map[string]string
}

func newGoBuildSet(t *testing.T) *goBuildSet {
	return &goBuildSet{dir: t.TempDir(), paths: map[string]string{}}
}

func findGoBuild(name string) goBuild {
	for _, b := range goBuilds {
		if b.name == name {
			return b
		}
	}
	panic("no build " + name)
}

// path returns the built file, building it (and its twin) first; it
// skips the test when the variant's toolchain cannot be had.
func (s *goBuildSet) path(t *testing.T, name string) string {
	t.Helper()
	if p, ok := s.paths[name]; ok {
		return p
	}
	b := findGoBuild(name)
	out := filepath.Join(s.dir, name)
	if b.derive != nil {
		data, err := os.ReadFile(s.path(t, b.twin))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, b.derive(t, data), 0o755); err != nil {
			t.Fatal(err)
		}
	} else {
		s.build(t, b, out)
	}
	s.paths[name] = out
	return out
}

func (s *goBuildSet) build(t *testing.T, b goBuild, out string) {
	t.Helper()
	if b.toolchain != "" {
		if testing.Short() {
			t.Skipf("-short: not fetching toolchain %s", b.toolchain)
		}
		cmd := exec.Command("go", "version")
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN="+b.toolchain)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("toolchain %s not available: %v\n%s", b.toolchain, err, out)
		}
	}
	src := filepath.Join("testdata", "gopclntab", "prog")
	module := "prog"
	if b.testBin {
		src, module = filepath.Join("testdata", "gopclntab", "testpkg"), "testpkg"
	}
	work := filepath.Join(s.dir, "src-"+b.name)
	copyGoSource(t, src, work)
	gomod := "module " + module + "\n\ngo 1.21\n"
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"build"}
	if b.testBin {
		args = []string{"test", "-c"}
	}
	args = append(args, "-o", out)
	if b.pie {
		args = append(args, "-buildmode=pie")
	}
	if b.strip {
		args = append(args, "-ldflags=-s -w")
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = work
	cgo := "0"
	if b.cgo {
		cgo = "1"
	}
	toolchain := b.toolchain
	if toolchain == "" {
		toolchain = "local"
	}
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+b.goarch, "CGO_ENABLED="+cgo,
		"GOTOOLCHAIN="+toolchain, "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if b.cgo && b.goarch != runtime.GOARCH {
		cc := crossCC[b.goarch]
		if _, err := exec.LookPath(cc); err != nil {
			t.Skipf("no C cross compiler for %s: %v (make test-deps installs it)", b.goarch, err)
		}
		cmd.Env = append(cmd.Env, "CC="+cc)
	}
	if outb, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, outb)
	}
}

func copyGoSource(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// dropSectionHeaders clears e_shoff, e_shnum and e_shstrndx of a 64-bit
// little-endian ELF file, as some strippers and packers leave files.
func dropSectionHeaders(t *testing.T, b []byte) []byte {
	t.Helper()
	if len(b) < 64 || string(b[:4]) != elf.ELFMAG || elf.Class(b[elf.EI_CLASS]) != elf.ELFCLASS64 {
		t.Fatal("not a 64-bit ELF file")
	}
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint64(b[0x28:], 0) // e_shoff
	binary.LittleEndian.PutUint16(b[0x3c:], 0) // e_shnum
	binary.LittleEndian.PutUint16(b[0x3e:], 0) // e_shstrndx
	return b
}

// renameSection renames a section in the section name table; the names
// must be of the same length.
func renameSection(from, to string) func(*testing.T, []byte) []byte {
	return func(t *testing.T, b []byte) []byte {
		t.Helper()
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		shstrndx := int(binary.LittleEndian.Uint16(b[0x3e:])) // 64-bit little-endian
		if shstrndx >= len(f.Sections) {
			t.Fatal("no section name table")
		}
		strtab := f.Sections[shstrndx]
		at := bytes.Index(b[strtab.Offset:strtab.Offset+strtab.Size], []byte(from+"\x00"))
		if at < 0 || len(from) != len(to) {
			t.Fatalf("cannot rename %s to %s", from, to)
		}
		b = bytes.Clone(b)
		copy(b[int(strtab.Offset)+at:], to)
		return b
	}
}

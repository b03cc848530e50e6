package execinfo

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	// Registers every runtime, so that FuzzParseELF's files are offered
	// to each.
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	"github.com/hostprof/ebpf-profiler/support"
)

// note encodes one ELF note record with 4-byte alignment.
func note(name string, typ uint32, desc []byte) []byte {
	pad := func(b []byte) []byte { return append(b, make([]byte, (4-len(b)%4)%4)...) }
	var b []byte
	b = binary.NativeEndian.AppendUint32(b, uint32(len(name)+1))
	b = binary.NativeEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.NativeEndian.AppendUint32(b, typ)
	b = append(b, pad(append([]byte(name), 0))...)
	return append(b, pad(desc)...)
}

func TestGNUBuildIDFromNotes(t *testing.T) {
	id := []byte{0xab, 0xf9, 0xec, 0x0e, 0xc5, 0x94, 0x66, 0x00, 0xc9, 0x06, 0x41, 0xcf, 0x5d, 0xb9, 0x98, 0x47, 0x2f, 0xac, 0x41, 0x0b}
	const want = "abf9ec0ec5946600c90641cf5db998472fac410b"
	linux := note("Linux", 0x100, []byte("6.1.102\x00"))
	buildID := note("GNU", ntGNUBuildID, id)
	tests := []struct {
		name    string
		data    []byte
		want    string
		wantErr bool
	}{
		{name: "alone", data: buildID, want: want},
		{name: "after other notes", data: append(append(append([]byte{}, linux...), note("Xen", 6, []byte{1, 2, 3, 4, 5})...), buildID...), want: want},
		{name: "wrong type", data: note("GNU", 1, id), wantErr: true},
		{name: "wrong owner", data: note("GNX", ntGNUBuildID, id), wantErr: true},
		{name: "desc cut short", data: buildID[:len(buildID)-4], wantErr: true},
		{name: "empty", data: nil, wantErr: true},
		{name: "huge sizes", data: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 3, 0, 0, 0, 'G', 'N', 'U', 0}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := GNUBuildIDFromNotes(tt.data)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestKernelNotes reads the running kernel's build id, if sysfs shows it.
func TestKernelNotes(t *testing.T) {
	data, err := os.ReadFile("/sys/kernel/notes")
	if err != nil {
		t.Skip(err)
	}
	id, err := GNUBuildIDFromNotes(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(id) < 16 || strings.Trim(id, "0123456789abcdef") != "" {
		t.Errorf("kernel build id %q", id)
	}
}

func TestBias(t *testing.T) {
	// A typical PIE: read-only headers, then text at offset 0x1000 loaded at
	// vaddr 0x1000; and a binary whose text segment's offset is not page
	// aligned.
	pie := &ELF{loads: []loadSegment{
		{vaddr: 0, offset: 0, filesz: 0x600},
		{vaddr: 0x1000, offset: 0x1000, filesz: 0x2000, executable: true},
		{vaddr: 0x3000, offset: 0x3000, filesz: 0x500},
	}}
	unaligned := &ELF{loads: []loadSegment{
		{vaddr: 0x400000, offset: 0, filesz: 0x2d0},
		{vaddr: 0x4012d0, offset: 0x12d0, filesz: 0x5000, executable: true},
	}}
	tests := []struct {
		name       string
		d          *ELF
		start, off uint64
		want       uint64
		wantOK     bool
	}{
		{"pie text", pie, 0x55550000_1000, 0x1000, 0x55550000_0000, true},
		{"pie whole file mapped at 0", pie, 0x7f00_0000_0000, 0, 0x7f00_0000_0000, true},
		{"non-pie aligned down", unaligned, 0x401000, 0x1000, 0, true},
		{"offset past segments", pie, 0x1000, 0x9000, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.d.Bias(tt.start, tt.off)
			if ok != tt.wantOK || got != tt.want {
				t.Errorf("bias = %#x, %v; want %#x, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestKnownFile: what BPF is told of a file: p_vaddr - p_offset of its
// executable segments and the lowest one's p_vaddr (the kernel's
// start_code of a process running it, minus the load bias).
func TestKnownFile(t *testing.T) {
	two := &ELF{loads: []loadSegment{
		{vaddr: 0x400000, offset: 0},
		{vaddr: 0x402000, offset: 0x2000, executable: true},
		{vaddr: 0x401000, offset: 0x1000, executable: true},
	}}
	if got, ok := two.KnownFile(); !ok || got != (support.KnownFile{VaddrAdjust: 0x400000, TextVaddr: 0x401000}) {
		t.Errorf("two text segments: %+v, %v", got, ok)
	}
	disagree := &ELF{loads: []loadSegment{
		{vaddr: 0x1000, offset: 0x1000, executable: true},
		{vaddr: 0x5000, offset: 0x2000, executable: true},
	}}
	if got, ok := disagree.KnownFile(); ok {
		t.Errorf("segments that disagree: %+v, want none", got)
	}
	if got, ok := (&ELF{loads: []loadSegment{{vaddr: 0}}}).KnownFile(); ok {
		t.Errorf("no text: %+v, want none", got)
	}
}

func TestSymbolTable(t *testing.T) {
	tab := buildSymbolTable([]symbolCandidate{
		{start: 0x3000, size: 0x10, name: "c"},
		{start: 0x1000, size: 0x100, name: "a_local", rank: 2},
		{start: 0x1000, size: 0x100, name: "a"},
		{start: 0x2000, size: 0, name: "asm_b", rank: 10},
		{start: 0x4000, size: 0, name: "last_asm", sectionEnd: 0x4100, rank: 10},
		{start: 0x5000, size: 0, name: "no_section", rank: 10},
	})
	tests := []struct {
		addr uint64
		want string
	}{
		{0xfff, ""},
		{0x1000, "a"},
		{0x10ff, "a"},
		{0x1100, ""}, // past a's size
		{0x2000, "asm_b"},
		{0x2fff, "asm_b"}, // size 0 extends to the next symbol
		{0x3008, "c"},
		{0x3010, ""},
		{0x40ff, "last_asm"}, // bounded by its section
		{0x4100, ""},
		{0x5000, "no_section"},
		{0x5001, ""},
	}
	for _, tt := range tests {
		if got, _ := tab.lookup(tt.addr); got != tt.want {
			t.Errorf("lookup(%#x) = %q, want %q", tt.addr, got, tt.want)
		}
	}
	if buildSymbolTable(nil) != nil {
		t.Error("empty table is not nil")
	}
	var none *symbolTable
	if _, ok := none.lookup(1); ok {
		t.Error("nil table found a symbol")
	}
}

func TestParseELFVDSO(t *testing.T) {
	d, err := parseELF(bytes.NewReader(filetest.OwnVDSO(t)), "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.symbols.len() == 0 {
		t.Error("vdso has no function symbols")
	}
	if _, ok := d.Bias(0x7fff_0000_0000, 0); !ok {
		t.Error("no load segment at offset 0")
	}
}

// TestParseELFTruncated cuts real ELF files short and corrupts their
// headers: parsing must fail or succeed, never panic.
func TestParseELFTruncated(t *testing.T) {
	images := [][]byte{filetest.OwnVDSO(t)}
	if b, err := os.ReadFile("/bin/true"); err == nil {
		images = append(images, b)
	}
	for _, image := range images {
		for _, n := range []int{4, 16, 63, 64, 100, 500, 1000, len(image) / 2, len(image) - 1} {
			if n > len(image) {
				continue
			}
			_, err := parseELF(bytes.NewReader(image[:n]), "", nil, nil)
			if n < 64 && err == nil {
				t.Errorf("%d bytes: header cut short but no error", n)
			}
		}
		// Point the section and program header tables far away, and make
		// their counts huge.
		for _, off := range []int{0x20, 0x28, 0x36, 0x38, 0x3a, 0x3c, 0x3e} {
			bad := bytes.Clone(image)
			for i := off; i < off+2 && i < len(bad); i++ {
				bad[i] = 0xff
			}
			_, _ = parseELF(bytes.NewReader(bad), "", nil, nil)
		}
	}
	if _, err := parseELF(bytes.NewReader([]byte("#!/bin/sh\necho hi\n")), "", nil, nil); err != errNotELF {
		t.Errorf("script: err = %v, want errNotELF", err)
	}
}

// FuzzParseELF is seeded with an 8 KiB image; the fuzzer's minimization of
// inputs that large is slow, so run it with -fuzzminimizetime=0.
func FuzzParseELF(f *testing.F) {
	f.Add(filetest.OwnVDSO(f))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := parseELF(bytes.NewReader(data), "fuzz", interpreter.All(), nil)
		if err == nil && d.symbols != nil {
			for _, e := range d.symbols.entries {
				d.symbols.lookup(e.start)
			}
		}
	})
}

func FuzzNotes(f *testing.F) {
	f.Add(note("GNU", ntGNUBuildID, []byte{1, 2, 3, 4, 5, 6, 7, 8}))
	f.Fuzz(func(t *testing.T, data []byte) {
		for range elfNotes(data, 4, binary.LittleEndian) {
		}
		for range elfNotes(data, 8, binary.BigEndian) {
		}
	})
}

// A stripped file's internal functions are named from the .symtab of its
// debug file, found by build id.
func TestSymbolsFromDebugFile(t *testing.T) {
	for _, tool := range []string{"gcc", "objcopy", "nm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "inner.c")
	code := "__attribute__((noinline)) static int inner_work(int x) { return x * 3 + 1; }\n" +
		"int main(int argc, char **argv) { return inner_work(argc); }\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "inner")
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run("gcc", "-O1", "-Wl,--build-id", "-o", bin, src)
	var addr uint64
	for _, line := range strings.Split(run("nm", bin), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "inner_work" {
			addr, _ = strconv.ParseUint(f[0], 16, 64)
		}
	}
	if addr == 0 {
		t.Fatal("nm: no inner_work")
	}
	parse := func(dirs []string) *ELF {
		f, err := os.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		d, err := parseELF(f, bin, nil, dirs)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	debugDir := filepath.Join(dir, "debug")
	d := parse(nil)
	id := d.GNUBuildID
	debugFile := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
	if err := os.MkdirAll(filepath.Dir(debugFile), 0o755); err != nil {
		t.Fatal(err)
	}
	run("objcopy", "--only-keep-debug", bin, debugFile)
	run("objcopy", "--strip-all", bin)

	if name, _ := parse(nil).symbols.lookup(addr); name == "inner_work" {
		t.Fatal("stripped file still names inner_work")
	}
	if name, _ := parse([]string{debugDir}).symbols.lookup(addr); name != "inner_work" {
		t.Errorf("with its debug file: %#x named %q, want inner_work", addr, name)
	}
	// Another build's debug file under the same id is refused.
	if err := os.WriteFile(debugFile, []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if name, _ := parse([]string{debugDir}).symbols.lookup(addr); name == "inner_work" {
		t.Error("named from a file that is not its debug file")
	}
}

// Of a function's names in a debug file's .symtab, glibc's internal
// alias is the last choice.
func TestSymbolRankGlibcAlias(t *testing.T) {
	local := elf.ST_INFO(elf.STB_LOCAL, elf.STT_FUNC)
	var cands []symbolCandidate
	for _, s := range []elf.Symbol{
		{Name: "__GI___clone3", Info: local, Value: 0x1000, Size: 0x40},
		{Name: "__clone3", Info: local, Value: 0x1000, Size: 0x40},
	} {
		cands = append(cands, symbolCandidate{start: s.Value, size: s.Size, name: s.Name, rank: symbolRank(s)})
	}
	if name, _ := buildSymbolTable(cands).lookup(0x1010); name != "__clone3" {
		t.Errorf("named %q, want __clone3", name)
	}
}

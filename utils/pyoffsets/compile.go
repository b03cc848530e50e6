package main

import (
	"bytes"
	"debug/elf"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed c/pyoffsets.c
var cSource []byte

// toolchain is the C compiler that lays structs out for one GOARCH.
type toolchain struct {
	Arch    string
	CC      string
	Version string
}

var compilers = map[string]string{
	"amd64": "x86_64-linux-gnu-gcc",
	"arm64": "aarch64-linux-gnu-gcc",
}

func toolchainFor(arch string) (toolchain, error) {
	cc, ok := compilers[arch]
	if !ok {
		return toolchain{}, fmt.Errorf("no C compiler known for %q", arch)
	}
	path, err := exec.LookPath(cc)
	if err != nil {
		return toolchain{}, fmt.Errorf("%s layouts need %s (Debian: gcc for amd64; "+
			"gcc-aarch64-linux-gnu and libc6-dev-arm64-cross for arm64): %w", arch, cc, err)
	}
	v, err := exec.Command(path, "-dumpfullversion").Output()
	if err != nil {
		return toolchain{}, fmt.Errorf("%s -dumpfullversion: %w", cc, err)
	}
	return toolchain{Arch: arch, CC: path, Version: cc + " " + strings.TrimSpace(string(v))}, nil
}

// layout is what one release's headers say on one architecture.
type layout struct {
	Version  string   `json:"version"` // "3.11"
	Release  string   `json:"release"` // "3.11.7"
	Arch     string   `json:"arch"`
	Compiler string   `json:"compiler"`
	Origin   string   `json:"origin"`
	Includes []string `json:"includes"`
	Entries  []entry  `json:"entries"`
}

// entry is one value: Key is the Go field path in python.Offsets, CType
// and Member the C type and member measured. Kinds: o offsetof, s sizeof,
// m size of the member, e enumerator value, n absent, b bit-field shift,
// w bit-field width.
type entry struct {
	Key    string `json:"key"`
	CType  string `json:"ctype,omitempty"`
	Member string `json:"member,omitempty"`
	Kind   string `json:"kind"`
	Value  int64  `json:"value"`
}

func compileLayout(tc toolchain, r release) (layout, error) {
	dir, err := os.MkdirTemp("", "pyoffsets")
	if err != nil {
		return layout{}, err
	}
	defer os.RemoveAll(dir)
	src, obj := filepath.Join(dir, "pyoffsets.c"), filepath.Join(dir, "pyoffsets.o")
	if err := os.WriteFile(src, cSource, 0o644); err != nil {
		return layout{}, err
	}
	args := []string{"-c", "-O0", "-o", obj}
	for _, dir := range r.Includes {
		args = append(args, "-I", dir)
	}
	cmd := exec.Command(tc.CC, append(args, src)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return layout{}, fmt.Errorf("compiling against CPython %s for %s: %w\n%s", r.Name, tc.Arch, err, msg)
	}
	entries, err := readObject(obj)
	if err != nil {
		return layout{}, fmt.Errorf("CPython %s for %s: %w", r.Name, tc.Arch, err)
	}
	return layout{
		Version:  fmt.Sprintf("%d.%d", r.Major, r.Minor),
		Release:  r.Name,
		Arch:     tc.Arch,
		Compiler: tc.Version,
		Origin:   r.Origin,
		Includes: r.Includes,
		Entries:  entries,
	}, nil
}

// The C structs' layouts (pyoffsets.c): three name fields, then the kind
// and an int64 value, or an int64 word offset and the probe object.
const (
	keyLen, ctypeLen, memberLen = 48, 40, 48
	namesLen                    = keyLen + ctypeLen + memberLen
	entrySize                   = namesLen + 8 + 8 // kind padded to 8
	bitsObject                  = namesLen + 8
)

func readObject(path string) ([]entry, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, err
	}
	var entries []entry
	found := false
	for _, s := range syms {
		if s.Name != "pyoffsets" && !strings.HasPrefix(s.Name, "pyoffsets_bits_") {
			continue
		}
		b, err := symbolBytes(f, s)
		if err != nil {
			return nil, err
		}
		if s.Name == "pyoffsets" {
			found = true
			es, err := decodeEntries(b, f.ByteOrder)
			if err != nil {
				return nil, err
			}
			entries = append(entries, es...)
			continue
		}
		es, err := decodeBits(b, f.ByteOrder)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		entries = append(entries, es...)
	}
	if !found {
		return nil, errors.New("no pyoffsets symbol in the object")
	}
	return entries, nil
}

func symbolBytes(f *elf.File, s elf.Symbol) ([]byte, error) {
	if int(s.Section) >= len(f.Sections) {
		return nil, fmt.Errorf("%s: not in a section", s.Name)
	}
	data, err := f.Sections[s.Section].Data()
	if err != nil {
		return nil, err
	}
	if s.Value+s.Size > uint64(len(data)) {
		return nil, fmt.Errorf("%s: past the end of its section", s.Name)
	}
	return data[s.Value : s.Value+s.Size], nil
}

func decodeEntries(b []byte, bo binary.ByteOrder) ([]entry, error) {
	if len(b)%entrySize != 0 {
		return nil, fmt.Errorf("pyoffsets is %d bytes, not a multiple of %d", len(b), entrySize)
	}
	var es []entry
	for ; len(b) > 0; b = b[entrySize:] {
		e, err := names(b)
		if err != nil {
			return nil, err
		}
		e.Kind = string(b[namesLen])
		e.Value = int64(bo.Uint64(b[namesLen+8:]))
		es = append(es, e)
	}
	return es, nil
}

// decodeBits turns a bit-field probe into its shift and width entries.
func decodeBits(b []byte, bo binary.ByteOrder) ([]entry, error) {
	if len(b) < bitsObject {
		return nil, errors.New("too short")
	}
	word := bo.Uint64(b[namesLen:])
	if uint64(len(b)) < bitsObject+word+4 {
		return nil, errors.New("bit-field word past the object")
	}
	mask := bo.Uint32(b[bitsObject+word:])
	shift, width := bits.TrailingZeros32(mask), bits.OnesCount32(mask)
	if mask == 0 || mask>>shift != 1<<width-1 {
		return nil, fmt.Errorf("bit-field mask %#x is not one run of ones", mask)
	}
	n, err := names(b)
	if err != nil {
		return nil, err
	}
	return []entry{
		{Key: n.Key + "Shift", CType: n.CType, Member: n.Member, Kind: "b", Value: int64(shift)},
		{Key: n.Key + "Bits", CType: n.CType, Member: n.Member, Kind: "w", Value: int64(width)},
	}, nil
}

// names reads the three NUL-terminated name fields; one without a NUL was
// truncated by the C compiler.
func names(b []byte) (entry, error) {
	var f [3]string
	for i, r := range [][2]int{{0, keyLen}, {keyLen, keyLen + ctypeLen}, {keyLen + ctypeLen, namesLen}} {
		field := b[r[0]:r[1]]
		n := bytes.IndexByte(field, 0)
		if n < 0 {
			return entry{}, fmt.Errorf("name %q too long for its %d bytes", field, len(field))
		}
		f[i] = string(field[:n])
	}
	return entry{Key: f[0], CType: f[1], Member: f[2]}, nil
}

package libc

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// Code of pthread_getspecific, as bytes. The real ones are copied from
// Debian 12's libc6 2.36-9+deb12u14 (amd64), libc6-arm64-cross 2.36-8cross1
// and musl 1.2.3-1; the others were written for these tests and assembled
// with GNU as 2.40 (as --64, aarch64-linux-gnu-as), the source beside each.
var (
	tsdGlibcAMD64 = "83ff1f773b89f84883c03148c1e004644803042510000000488b50084885d2745789ff488d0d56af1400" +
		"488b3048c1e7044839343975394889d0c30f1f44000081ffff030000773089fa89f883e21fc1e80564488b04c510050000" +
		"4885c0741848c1e2044801d0ebaf0f1f800000000048c740080000000031d2ebbb"
	tsdGlibcARM64 = "e103002a1f7c007148020054207c7cd342d03bd500c018d14200008b400440f9400100b4217c7cd3030900d0" +
		"63602091440040f9616861f83f0004eb41000054c0035fd65f0400f9000080d2c0035fd61ffc0f71a8ffff54007c0553" +
		"42d03bd523100012400c008b000011d1020840f9c2feffb463107cd34200038be8ffff17"
	tsdMuslAMD64 = "64488b042500000000488b808000000089ff488b04f8c3"
	// The fast path of Debian 13's libc6 2.41-12+deb13u5 (arm64), up to
	// the test of the value read.
	tsdGlibc241ARM64 = "5f2403d5e103002a1f7c007148020054e0c1809242d03bd50050218b4200008b400440f9400100b4"
)

var (
	tsdGlibcLayoutAMD64 = TSDLayout{Libc: LibcGlibc, SelfDeref: true, SelfOffset: 0x10, FirstBlockOffset: 0x310,
		EntrySize: 16, DataOffset: 8, MaxFastKey: 32}
	tsdGlibcLayoutARM64 = TSDLayout{Libc: LibcGlibc, FirstBlockOffset: -0x630, EntrySize: 16, DataOffset: 8, MaxFastKey: 32}
	tsdMuslLayoutAMD64  = TSDLayout{Libc: LibcMusl, SelfDeref: true, SelfOffset: 0, FirstBlockOffset: 0x80, BlockDeref: true,
		EntrySize: 8, MaxFastKey: 128}
)

type tsdCase struct {
	name    string
	arch    elf.Machine
	code    string // hex
	want    TSDLayout
	errText string // set: decoding fails with ErrTSDCode and this text
}

var tsdCases = []tsdCase{
	{name: "glibc 2.36 x86_64", arch: elf.EM_X86_64, code: tsdGlibcAMD64, want: tsdGlibcLayoutAMD64},
	{name: "glibc 2.36 arm64", arch: elf.EM_AARCH64, code: tsdGlibcARM64, want: tsdGlibcLayoutARM64},
	{
		name: "glibc 2.41 arm64, offset from movn", arch: elf.EM_AARCH64, code: tsdGlibc241ARM64,
		want: TSDLayout{Libc: LibcGlibc, FirstBlockOffset: -0x610, EntrySize: 16, DataOffset: 8, MaxFastKey: 32},
	},
	// movz x0, #0x10, lsl #16; movk x0, #1, lsl #32
	{name: "arm64 movk", arch: elf.EM_AARCH64, code: "0002a0d22000c0f2", errText: "movk"},
	{name: "musl 1.2.3 x86_64", arch: elf.EM_X86_64, code: tsdMuslAMD64, want: tsdMuslLayoutAMD64},
	// The slow paths of these are outside the code (as in a .cold section).
	{name: "glibc x86_64 fast path alone", arch: elf.EM_X86_64, code: tsdGlibcAMD64[:2*0x1f], want: tsdGlibcLayoutAMD64},
	{name: "glibc arm64 fast path alone", arch: elf.EM_AARCH64, code: tsdGlibcARM64[:2*0x24], want: tsdGlibcLayoutARM64},
	{
		// endbr64; cmp $0x1f,%edi; jbe 1f; xchg %ax,%ax; ret
		// 1: mov %edi,%edi; shl $4,%rdi; mov %fs:0x10,%rax
		// mov 0x318(%rax,%rdi,1),%rax; test %rax,%rax
		name: "x86_64 CET, fast path at the branch target, SIB load", arch: elf.EM_X86_64,
		code: "f30f1efa83ff1f76036690c389ff48c1e70464488b042510000000488b8438180300004885c0",
		want: tsdGlibcLayoutAMD64,
	},
	{
		// cmp $0x20,%edi; jae 1f; mov %edi,%eax; shl $4,%rax; nopl (%rax)
		// mov %fs:0x318(%rax),%rdx; lea 0x10(%rip),%rcx; test %rdx,%rdx; 1: ret
		name: "x86_64 block at a fixed offset from fsbase", arch: elf.EM_X86_64,
		code: "83ff20731b89f848c1e0040f1f0064488b9018030000488d0d100000004885d2c3",
		want: TSDLayout{Libc: LibcGlibc, FirstBlockOffset: 0x310, EntrySize: 16, DataOffset: 8, MaxFastKey: 32},
	},
	{
		// mrs x1, tpidr_el0; ldur x1, [x1, #-88]; ldr x0, [x1, w0, uxtw #3]; ret
		name: "arm64 musl-like, array pointer below tp", arch: elf.EM_AARCH64,
		code: "41d03bd521805af8205860f8c0035fd6",
		want: TSDLayout{Libc: LibcMusl, FirstBlockOffset: -88, BlockDeref: true, EntrySize: 8, MaxFastKey: 128},
	},
	{
		// bti c; cmp w0, #0x1f; b.ls 1f; mov x0, #0; ret
		// 1: mrs x1, tpidr_el0; add x1, x1, w0, uxtw #4; sub x1, x1, #0x628
		// ldr x0, [x1]; cbnz x0, 2f; 2: ret
		name: "arm64 BTI, fast path at the branch target, extended add", arch: elf.EM_AARCH64,
		code: "5f2403d51f7c007169000054000080d2c0035fd641d03bd52150208b21a018d1200040f9200000b5c0035fd6",
		want: tsdGlibcLayoutARM64,
	},

	// Code the decoders must refuse.
	{
		// cmp $0x1f,%edi; ja 1f; shl $4,%rdi; add %fs:0x10,%rdi
		// mov 0x318(%rdi),%rax; test %rax,%rax; 1: ret
		name: "x86_64 key not zero-extended", arch: elf.EM_X86_64,
		code: "83ff1f771748c1e7046448033c2510000000488b87180300004885c0c3", errText: "upper 32 bits",
	},
	{
		name: "x86_64 glibc without the bound check", arch: elf.EM_X86_64,
		code: "89f84883c03148c1e004644803042510000000488b50084885d2", errText: "without a bound check",
	},
	{
		// test %edi,%edi; je 1f; mov %edi,%eax; 1: ret
		name: "x86_64 branch on a flag other than the bound", arch: elf.EM_X86_64,
		code: "85ff740289f8c3", errText: "other than the key",
	},
	{
		// mov %edi,%eax; mov %rax,(%rdx)
		name: "x86_64 store", arch: elf.EM_X86_64, code: "89f8488902", errText: "store",
	},
	{name: "x86_64 push", arch: elf.EM_X86_64, code: "53", errText: "opcode 0x53"},
	{
		// cmp $0x1f,%edi; ja 1f; mov %edi,%eax; shl $4,%rax
		// mov 0x1008(,%rax,1),%rdx; test %rdx,%rdx; 1: ret
		name: "x86_64 key-indexed load from a fixed address", arch: elf.EM_X86_64,
		code: "83ff1f771189f848c1e004488b1405081000004885d2c3", errText: "fixed address",
	},
	{
		name: "x86_64 value loaded but not returned", arch: elf.EM_X86_64,
		code: "83ff1f771789f84883c03148c1e004644803042510000000488b5008c3", errText: "returns without",
	},
	{
		name: "x86_64 value overwritten", arch: elf.EM_X86_64,
		code: "83ff1f771f89f84883c03148c1e004644803042510000000488b5008ba000000004885d2c3", errText: "overwritten",
	},
	{
		name: "x86_64 32-byte entries", arch: elf.EM_X86_64,
		code: "83ff1f771989f848c1e005644803042510000000488b90180300004885d2c3", errText: "neither glibc's nor musl's",
	},
	{
		name: "x86_64 second bound check", arch: elf.EM_X86_64,
		code: "83ff1f770583ff0f7700c3", errText: "second bound check",
	},
	{
		name: "x86_64 32-bit load of the value", arch: elf.EM_X86_64,
		code: "83ff1f771889f84883c03148c1e0046448030425100000008b500885d2c3", errText: "not 64 bits wide",
	},
	{name: "x86_64 jump out of the code", arch: elf.EM_X86_64, code: "e9f0ffffff", errText: "outside"},
	{name: "x86_64 gs segment", arch: elf.EM_X86_64, code: "65488b042500000000", errText: "opcode 0x65"},
	{name: "x86_64 endless jumps", arch: elf.EM_X86_64, code: "ebfe", errText: "no key-indexed load"},
	{name: "x86_64 empty", arch: elf.EM_X86_64, code: "", errText: "code ends"},
	{
		// cmp w0, #0x1f; b.hi 1f; mrs x2, tpidr_el0; add x2, x2, x0, lsl #4
		// ldr x0, [x2, #8]; cbz x0, 1f; 1: ret
		name: "arm64 key not zero-extended", arch: elf.EM_AARCH64,
		code: "1f7c0071a800005442d03bd54210008b400440f9200000b4c0035fd6", errText: "upper 32 bits",
	},
	{name: "arm64 stp", arch: elf.EM_AARCH64, code: "fd7bbfa9", errText: "instruction 0xa9bf7bfd"},
	{
		name: "arm64 cbz on another register", arch: elf.EM_AARCH64,
		code:    "e103002a1f7c0071e8000054207c7cd342d03bd500c018d14200008b400440f9220000b4c0035fd6",
		errText: "other than the key's value",
	},
	{
		// cmp w0, #0x1f; b.gt 1f; 1: ret
		name: "arm64 signed bound", arch: elf.EM_AARCH64, code: "1f7c00712c000054c0035fd6", errText: "not an unsigned compare",
	},
	{name: "arm64 far branch", arch: elf.EM_AARCH64, code: "00040014", errText: "outside"},
	{name: "arm64 half an instruction", arch: elf.EM_AARCH64, code: "e103", errText: "code ends"},
}

func tsdDecode(arch elf.Machine, code []byte) (TSDLayout, error) {
	if arch == elf.EM_AARCH64 {
		return decodeGetspecificARM64(code)
	}
	return decodeGetspecificAMD64(code)
}

func TestDecodeGetspecific(t *testing.T) {
	for _, tc := range tsdCases {
		t.Run(tc.name, func(t *testing.T) {
			code, err := hex.DecodeString(tc.code)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tsdDecode(tc.arch, code)
			if tc.errText != "" {
				if !errors.Is(err, ErrTSDCode) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("got %+v, %v; want an ErrTSDCode mentioning %q", got, err, tc.errText)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestDecodeGetspecificTruncated: every prefix of real code shorter than
// its fast path fails with ErrTSDCode, and none panics.
func TestDecodeGetspecificTruncated(t *testing.T) {
	for _, tc := range tsdCases[:3] { // the real ones
		code, _ := hex.DecodeString(tc.code)
		for n := range len(code) {
			_, err := tsdDecode(tc.arch, code[:n])
			if err != nil && !errors.Is(err, ErrTSDCode) {
				t.Errorf("%s cut to %d bytes: %v is not ErrTSDCode", tc.name, n, err)
			}
		}
	}
}

// TestTSDLayoutFromLibc decodes the C libraries on this machine: Debian's
// glibc for x86_64, the arm64 one of the cross toolchain, and musl's where
// it is installed (Debian's musl package).
func TestTSDLayoutFromLibc(t *testing.T) {
	for _, tc := range []struct {
		path     string
		want     TSDLayout
		optional bool
	}{
		{"/lib/x86_64-linux-gnu/libc.so.6", tsdGlibcLayoutAMD64, false},
		{"/usr/aarch64-linux-gnu/lib/libc.so.6", tsdGlibcLayoutARM64, false},
		{"/lib/x86_64-linux-musl/libc.so", tsdMuslLayoutAMD64, true},
	} {
		f, err := elf.Open(tc.path)
		if err != nil {
			if tc.optional {
				t.Logf("skipping %s: %v", tc.path, err)
				continue
			}
			t.Fatal(err)
		}
		got, err := TSDLayoutFromLibc(f)
		f.Close()
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.path, got, err, tc.want)
		}
	}
}

// TestTSDLayoutFromOtherFiles: a file without pthread_getspecific says so
// (ErrNoGetspecific, as the libc.so.6 of glibc before 2.34), and one whose
// pthread_getspecific is not the C library's is refused.
func TestTSDLayoutFromOtherFiles(t *testing.T) {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := TSDLayoutFromLibc(f); !errors.Is(err, ErrNoGetspecific) {
		t.Errorf("the test binary: %v, want ErrNoGetspecific", err)
	}

	data, err := os.ReadFile("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	code, _ := hex.DecodeString(tsdGlibcAMD64)
	at := bytes.Index(data, code)
	if at < 0 {
		t.Fatal("pthread_getspecific's code is not in libc.so.6")
	}
	mangled := bytes.Clone(data)
	mangled[at] = 0x53 // push %rbx
	mf, err := elf.NewFile(bytes.NewReader(mangled))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TSDLayoutFromLibc(mf); !errors.Is(err, ErrTSDCode) {
		t.Errorf("libc.so.6 with a push in pthread_getspecific: %v, want ErrTSDCode", err)
	}
	for _, n := range []int{64, 4096, len(data) / 2} {
		if f, err := elf.NewFile(bytes.NewReader(data[:n])); err == nil {
			_, _ = TSDLayoutFromLibc(f)
		}
	}
}

// tsdMemory is process memory for tests: little-endian words at addresses.
type tsdMemory map[uint64][]byte

func (m tsdMemory) ReadAt(p []byte, off int64) (int, error) {
	for at, b := range m {
		if uint64(off) >= at && uint64(off)+uint64(len(p)) <= at+uint64(len(b)) {
			return copy(p, b[uint64(off)-at:]), nil
		}
	}
	return 0, fmt.Errorf("no memory at %#x", off)
}

func tsdWord(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func TestSlotAddress(t *testing.T) {
	const tp = 0x7f0000001000
	mem := tsdMemory{
		tp:             tsdWord(0x7f0000009000), // musl's self, and glibc's would-be self
		tp + 0x10:      tsdWord(tp),             // glibc x86_64 header.self
		0x7f0000009080: tsdWord(0x7f000000a000),
	}
	for _, tc := range []struct {
		layout TSDLayout
		key    uint32
		want   uint64
	}{
		{tsdGlibcLayoutAMD64, 0, tp + 0x318},
		{tsdGlibcLayoutAMD64, 31, tp + 0x318 + 31*16},
		{tsdGlibcLayoutARM64, 3, tp - 0x630 + 3*16 + 8},
		{tsdMuslLayoutAMD64, 5, 0x7f000000a000 + 5*8},
	} {
		got, err := tc.layout.SlotAddress(mem, tp, tc.key)
		if err != nil || got != tc.want {
			t.Errorf("%v key %d: %#x, %v; want %#x", tc.layout.Libc, tc.key, got, err, tc.want)
		}
	}
	if _, err := tsdGlibcLayoutAMD64.SlotAddress(mem, tp, 32); err == nil {
		t.Error("key 32 is beyond glibc's first block")
	}
	if _, err := tsdGlibcLayoutAMD64.SlotAddress(mem, 0x1000, 0); err == nil {
		t.Error("no error reading the self pointer from unmapped memory")
	}
}

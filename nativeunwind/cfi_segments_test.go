package nativeunwind

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// TestNoSectionHeaders extracts real libraries whose section headers are
// dropped, as sstrip leaves them. The deltas must be the original's
// without entry points and an arm64 PLT's rule: markEntryPoints finds stop
// and signal symbols through .symtab and .dynsym, and pltLayer the .plt,
// which debug/elf locates only by section headers. The libraries have no .debug_frame, which no segment holds.
func TestNoSectionHeaders(t *testing.T) {
	for _, tt := range []struct{ name, path string }{
		{"amd64/libc", "/lib/x86_64-linux-gnu/libc.so.6"},
		{"amd64/libstdc++", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"},
		// Installed with gcc-aarch64-linux-gnu (package libc6-arm64-cross).
		{"arm64/libc", "/usr/aarch64-linux-gnu/lib/libc.so.6"},
		{"arm64/libgcc_s", "/usr/aarch64-linux-gnu/lib/libgcc_s.so.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			data, err := os.ReadFile(tt.path)
			if err != nil {
				t.Skip(err)
			}
			orig, err := elf.NewFile(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if orig.Section(".debug_frame") != nil {
				t.Fatalf("%s has a .debug_frame, which a copy without sections loses", tt.path)
			}
			want, wantSt, err := extractUnmarked(elfImage{f: orig}, true)
			if err != nil {
				t.Fatal(err)
			}
			marked, markedSt, err := ExtractWithStats(orig)
			if err != nil {
				t.Fatal(err)
			}

			stripped, err := elf.NewFile(bytes.NewReader(dropSectionHeaders(t, data)))
			if err != nil {
				t.Fatal(err)
			}
			if len(stripped.Sections) != 0 {
				t.Fatalf("the copy has %d sections", len(stripped.Sections))
			}
			got, st, err := ExtractWithStats(stripped)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 || !sameDeltas(got, want) {
				t.Errorf("%d deltas without sections, %d with (unmarked); first difference: %s",
					len(got), len(want), firstDifference(got, want))
			}
			if len(st.StopSymbols) != 0 {
				t.Errorf("stop symbols without sections: %v", st.StopSymbols)
			}
			st.StopSymbols = nil
			if !reflect.DeepEqual(st, wantSt) {
				t.Errorf("stats %+v, want %+v", st, wantSt)
			}
			t.Logf("%d deltas, %d FDEs; with sections, entry points %v change %s",
				len(got), st.FDEs, markedSt.StopSymbols, firstDifference(marked, want))
		})
	}
}

// firstDifference describes where two delta lists first differ.
func firstDifference(a, b Deltas) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("delta %d: %#x %v vs %#x %v", i, a[i].Address, a[i].Rule, b[i].Address, b[i].Rule)
		}
	}
	if len(a) != len(b) {
		return fmt.Sprintf("the lengths only: %d vs %d", len(a), len(b))
	}
	return "nothing"
}

// The layout of sectionlessELF: code at [0x1000, 0x2000) without file
// bytes; read-only data at 0x2000, file offset 0x100 (an address unlike
// its offset catches one used for the other).
const (
	segCode    = 0x1000
	segRO      = 0x2000
	segROOff   = 0x100
	segEhFrame = segRO + 0x10 // where segmentCFI puts .eh_frame
)

// sectionlessELF returns a little-endian x86_64 ELF file without section
// headers: an executable PT_LOAD, a read-only PT_LOAD of roSize bytes
// whose file bytes begin with ro, and, if hdrSize > 0, a PT_GNU_EH_FRAME
// of hdrSize bytes at its start.
func sectionlessELF(ro []byte, hdrSize, roSize uint64) []byte {
	le := binary.LittleEndian
	b := make([]byte, segROOff, segROOff+len(ro))
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	le.PutUint16(b[0x10:], uint16(elf.ET_DYN))
	le.PutUint16(b[0x12:], uint16(elf.EM_X86_64))
	le.PutUint32(b[0x14:], uint32(elf.EV_CURRENT))
	le.PutUint64(b[0x20:], 64) // e_phoff
	le.PutUint16(b[0x34:], 64) // e_ehsize
	le.PutUint16(b[0x36:], 56) // e_phentsize
	phdrs := []elf.Prog64{
		{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: segCode, Memsz: segRO - segCode},
		{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R), Off: segROOff, Vaddr: segRO, Filesz: roSize, Memsz: roSize},
	}
	if hdrSize > 0 {
		phdrs = append(phdrs, elf.Prog64{Type: uint32(elf.PT_GNU_EH_FRAME), Flags: uint32(elf.PF_R), Off: segROOff, Vaddr: segRO, Filesz: hdrSize, Memsz: hdrSize})
	}
	le.PutUint16(b[0x38:], uint16(len(phdrs))) // e_phnum
	for i, p := range phdrs {
		if _, err := binary.Encode(b[64+56*i:], le, p); err != nil {
			panic(err)
		}
	}
	return append(b, ro...)
}

// segmentCFI returns the read-only data of sectionlessELF: a 12-byte
// .eh_frame_hdr without a table, then at segEhFrame an .eh_frame with an
// FDE in the code and one outside, its terminator at ehEnd and 16 bytes
// that are not CFI, as .gcc_except_table follows it in linked files.
func segmentCFI() (ro []byte, ehEnd int) {
	ro = []byte{1, 0x1b, 0x03, 0x3b} // version, pcrel|sdata4, udata4, datarel|sdata4
	ro = binary.LittleEndian.AppendUint32(ro, uint32(segEhFrame-(segRO+4)))
	ro = binary.LittleEndian.AppendUint32(ro, 0) // fde_count
	ro = append(ro, 0, 0, 0, 0)
	b := &cfiBuilder{addr: segEhFrame}
	c := b.cie(amd64CIE("zR", []byte{0x1b}))
	b.fde(c, segCode, 0x40, 0x41, 0x0e, 16)
	b.fde(c, 0x5000, 0x40, 0x41, 0x0e, 16)
	ro = append(ro, b.buf...)
	ehEnd = len(ro)
	ro = append(ro, 0, 0, 0, 0)
	return append(ro, bytes.Repeat([]byte{0xff}, 16)...), ehEnd
}

func TestEhFrameFromSegments(t *testing.T) {
	base, ehEnd := segmentCFI()
	le := binary.LittleEndian
	withByte := func(i int, v byte) func([]byte) []byte {
		return func(ro []byte) []byte { ro[i] = v; return ro }
	}
	tests := []struct {
		name    string
		edit    func(ro []byte) []byte
		hdrSize uint64 // default 12
		noHdr   bool   // no PT_GNU_EH_FRAME
		roSize  uint64 // default len(ro)
		want    Deltas
		wantErr string
	}{
		{name: "well formed", want: Deltas{{segCode, spRule(8)}, {segCode + 1, spRule(16)}, {segCode + 0x40, unknown}}},
		{name: "no terminator at the segment's end",
			edit: func(ro []byte) []byte { return ro[:ehEnd] },
			want: Deltas{{segCode, spRule(8)}, {segCode + 1, spRule(16)}, {segCode + 0x40, unknown}}},
		{name: "empty .eh_frame",
			edit: func(ro []byte) []byte { return append(ro[:segEhFrame-segRO], 0, 0, 0, 0) }},
		{name: "no PT_GNU_EH_FRAME", noHdr: true},
		{name: "no terminator before other data",
			edit:    func(ro []byte) []byte { copy(ro[ehEnd:], []byte{0xff, 0xff, 0xff, 0xff}); return ro },
			wantErr: ".eh_frame+0x4a: entry length 18446744073709551615 overruns the section (8 bytes left)"},
		{name: "FDE length past the segment", // the first FDE follows the 22-byte CIE
			edit:    func(ro []byte) []byte { le.PutUint32(ro[segEhFrame-segRO+0x16:], 0x7fffff00); return ro },
			wantErr: ".eh_frame+0x1a: entry length 2147483392 overruns the section"},
		{name: "version 2", edit: withByte(0, 2),
			wantErr: ".eh_frame_hdr+0x4: version 2 not supported"},
		{name: "unknown eh_frame_ptr format", edit: withByte(1, 0x1f),
			wantErr: ".eh_frame_hdr+0x4: eh_frame_ptr: unknown pointer format 0x1f"},
		{name: "unknown eh_frame_ptr application", edit: withByte(1, 0x7b),
			wantErr: ".eh_frame_hdr+0x8: eh_frame_ptr: unknown pointer application 0x7b"},
		{name: "omitted eh_frame_ptr", edit: withByte(1, 0xff),
			wantErr: ".eh_frame_hdr+0x4: eh_frame_ptr: omitted pointer"},
		{name: "truncated header", hdrSize: 6,
			wantErr: ".eh_frame_hdr+0x4: eh_frame_ptr: 4 bytes needed, 2 left"},
		{name: "eh_frame_ptr into the code, which has no file bytes",
			edit: func(ro []byte) []byte {
				rel := int32(segCode - (segRO + 4))
				le.PutUint32(ro[4:], uint32(rel))
				return ro
			},
			wantErr: "eh_frame_ptr 0x1000 of .eh_frame_hdr: not in the file bytes of a loaded segment"},
		{name: "eh_frame_ptr far away",
			edit:    func(ro []byte) []byte { le.PutUint32(ro[4:], 0x7fff0000); return ro },
			wantErr: "eh_frame_ptr 0x7fff2004 of .eh_frame_hdr: not in the file bytes of a loaded segment"},
		{name: "PT_GNU_EH_FRAME larger than the file", hdrSize: 1 << 40,
			want: Deltas{{segCode, spRule(8)}, {segCode + 1, spRule(16)}, {segCode + 0x40, unknown}}},
		{name: "segment larger than the file", roSize: 1 << 40,
			wantErr: "segment at 0x2000: the file holds 82 of its 268435456 bytes from there"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ro := bytes.Clone(base)
			if tt.edit != nil {
				ro = tt.edit(ro)
			}
			hdrSize, roSize := cmp.Or(tt.hdrSize, 12), cmp.Or(tt.roSize, uint64(len(ro)))
			if tt.noHdr {
				hdrSize = 0
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			d, err := ExtractReader(bytes.NewReader(sectionlessELF(ro, hdrSize, roSize)))
			runtime.ReadMemStats(&after)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %v, want one with %q", err, tt.wantErr)
				}
			} else if err != nil || !sameDeltas(d, tt.want) {
				t.Errorf("got %v, %v; want %v", d, err, tt.want)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("%d bytes allocated", n)
			}
		})
	}
}

// FuzzEhFrameSegments feeds arbitrary read-only data, .eh_frame_hdr and
// segment sizes to extraction from a file without section headers.
func FuzzEhFrameSegments(f *testing.F) {
	ro, _ := segmentCFI()
	f.Add(ro, uint64(12), uint64(len(ro)))
	f.Add(ro, uint64(1<<40), uint64(1<<40))
	// The fixture's read-only segment: .eh_frame_hdr and .eh_frame, which
	// sectionlessELF puts at the fixture's addresses.
	if fx, err := elf.Open("testdata/cfi-arm64/fixture.so"); err == nil {
		for _, p := range fx.Progs {
			if p.Type == elf.PT_LOAD && p.Vaddr == segRO {
				data := make([]byte, p.Filesz)
				if _, err := p.ReadAt(data, 0); err == nil {
					f.Add(data, uint64(0x44), p.Filesz)
				}
			}
		}
		fx.Close()
	}
	f.Fuzz(func(t *testing.T, ro []byte, hdrSize, roSize uint64) {
		// debug/elf rejects segment sizes beyond an int64.
		hdrSize, roSize = hdrSize>>1, roSize>>1
		ef, err := elf.NewFile(bytes.NewReader(sectionlessELF(ro, hdrSize, roSize)))
		if err != nil {
			t.Fatal(err)
		}
		// Without extract's recover, which would hide a panic.
		d, _, err := extractUnmarked(elfImage{f: ef}, false)
		if err != nil {
			return
		}
		checkDeltas(t, d)
	})
}

// TestARM64PLT: an arm64 PLT's entries, which no CFI describes, unwind
// through the link register with sp and x29 unchanged; the first entry
// (the lazy-binding trampoline, which pushes) stays unknown.
func TestARM64PLT(t *testing.T) {
	f, d := openAndExtract(t, "testdata/cfi-arm64/fixture.so")
	plt := f.Section(".plt")
	if plt == nil || plt.Size <= arm64PLT0 {
		t.Fatal("the fixture has no PLT entries")
	}
	if r, ok := d.Lookup(plt.Addr + 4); ok {
		t.Errorf("PLT0+4: %v, want no rule", r)
	}
	for a := plt.Addr + arm64PLT0; a < plt.Addr+plt.Size; a += 4 {
		if r, ok := d.Lookup(a); !ok || r != (Rule{CFA: CFASP}) {
			t.Errorf("PLT+%#x: %v, want cfa=sp+0 fp=reg ra=reg", a-plt.Addr, r)
		}
	}
}

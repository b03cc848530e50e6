package debuginfo

import (
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"os/exec"
	"path/filepath"
	"testing"
)

// v5LineHeader is a DWARF 5 line table header whose directories have the
// given format and count, with no files.
func v5LineHeader(dirForms []byte, dirs uint64, entries []byte) []byte {
	var h []byte
	h = append(h, 1, 1, 1, 0xfb, 14, 13) // instruction length .. opcode base
	h = append(h, make([]byte, 12)...)   // standard opcode lengths
	h = append(h, byte(len(dirForms)/2))
	h = append(h, dirForms...)
	h = appendULEB(h, dirs)
	h = append(h, entries...)
	h = append(h, 0, 0) // no file format, no files
	var b []byte
	b = binary.LittleEndian.AppendUint16(b, 5)
	b = append(b, 8, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	b = append(b, h...)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func appendULEB(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		if v >>= 7; v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func TestCheckLineHeader(t *testing.T) {
	const lnctPath = 1
	for _, tt := range []struct {
		name string
		hdr  []byte
		ok   bool
	}{
		{"two directories as strings", v5LineHeader([]byte{lnctPath, formString}, 2, []byte("/a\x00/b\x00")), true},
		{"entries of no bytes", v5LineHeader(nil, 5_000_000, nil), false},
		{"entries of flag_present only", v5LineHeader([]byte{lnctPath, formFlagPresent}, 5_000_000, nil), false},
		{"more entries than bytes", v5LineHeader([]byte{lnctPath, formLineStrp}, 1000, make([]byte, 8)), false},
	} {
		if err := checkLineHeader(tt.hdr, 0); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if checkLineHeader(v5LineHeader(nil, 0, nil), 1<<20) == nil {
		t.Error("an offset past the section was taken")
	}

	// Every unit's header of a real DWARF 5 binary passes.
	bin := filepath.Join(t.TempDir(), "bin")
	if out, err := exec.Command("g++", "-O2", "-gdwarf-5", "-o", bin, cppChain).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, err := f.Section(".debug_line").Data()
	if err != nil {
		t.Fatal(err)
	}
	d, err := f.DWARF()
	if err != nil {
		t.Fatal(err)
	}
	units := 0
	for r := d.Reader(); ; {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		if stmt, ok := e.Val(dwarf.AttrStmtList).(int64); ok && e.Tag == dwarf.TagCompileUnit {
			units++
			if err := checkLineHeader(line, uint64(stmt)); err != nil {
				t.Errorf("unit at %#x: %v", e.Offset, err)
			}
		}
		r.SkipChildren()
	}
	if units == 0 {
		t.Fatal("no unit with a line table: the test checked nothing")
	}
}

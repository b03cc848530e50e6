package nativeunwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// cfiBuilder assembles .eh_frame or .debug_frame bytes for tests.
type cfiBuilder struct {
	buf     []byte
	addr    uint64 // section address, for pcrel pointers
	debug   bool   // .debug_frame: CIE id ~0, absolute CIE offsets and addresses
	dwarf64 bool
}

func (b *cfiBuilder) le32(v uint32) { b.buf = binary.LittleEndian.AppendUint32(b.buf, v) }
func (b *cfiBuilder) le64(v uint64) { b.buf = binary.LittleEndian.AppendUint64(b.buf, v) }

// entry appends an entry with the given id field and body, returning the
// entry's offset and the offset of its id field.
func (b *cfiBuilder) entry(id uint64, body []byte) (at, idAt int) {
	at = len(b.buf)
	idSize := 4
	if b.dwarf64 && b.debug {
		idSize = 8
	}
	n := uint64(idSize + len(body))
	if b.dwarf64 {
		b.le32(0xffffffff)
		b.le64(n)
	} else {
		b.le32(uint32(n))
	}
	idAt = len(b.buf)
	if idSize == 8 {
		b.le64(id)
	} else {
		b.le32(uint32(id))
	}
	b.buf = append(b.buf, body...)
	return at, idAt
}

// cie appends a CIE and returns its offset.
func (b *cfiBuilder) cie(body []byte) int {
	id := uint64(0)
	if b.debug {
		id = 0xffffffff
		if b.dwarf64 {
			id = ^uint64(0)
		}
	}
	at, _ := b.entry(id, body)
	return at
}

// fde appends an FDE pointing to the CIE at cieAt. For .eh_frame, start
// is written pcrel|sdata4 (the "zR" CIEs of these tests use 0x1b) and
// the length as udata4, followed by an empty augmentation; for
// .debug_frame both are 8-byte absolute words.
func (b *cfiBuilder) fde(cieAt int, start, length uint64, insns ...byte) int {
	at := len(b.buf)
	hdr := 8
	if b.dwarf64 {
		hdr = 16
		if b.debug {
			hdr = 20
		}
	}
	var body []byte
	if b.debug {
		body = binary.LittleEndian.AppendUint64(body, start)
		body = binary.LittleEndian.AppendUint64(body, length)
	} else {
		field := b.addr + uint64(at+hdr)
		body = binary.LittleEndian.AppendUint32(body, uint32(int32(int64(start-field))))
		body = binary.LittleEndian.AppendUint32(body, uint32(length))
		body = append(body, 0) // augmentation length
	}
	body = append(body, insns...)
	id := uint64(cieAt)
	if !b.debug {
		id = uint64(at + hdr - 4 - cieAt)
	}
	b.entry(id, body)
	return at
}

// cieBody builds a CIE body: version, augmentation, alignment factors,
// return address column, augmentation data (if aug starts with z) and
// initial instructions.
func cieBody(version uint8, aug string, codeAlign uint64, dataAlign int64, ra uint64, augData []byte, insns ...byte) []byte {
	b := []byte{version}
	b = append(b, aug...)
	b = append(b, 0)
	if version >= 4 {
		b = append(b, 8, 0) // address size, segment selector size
	}
	b = appendULEB(b, codeAlign)
	b = appendSLEB(b, dataAlign)
	if version == 1 {
		b = append(b, byte(ra))
	} else {
		b = appendULEB(b, ra)
	}
	if strings.HasPrefix(aug, "z") {
		b = appendULEB(b, uint64(len(augData)))
		b = append(b, augData...)
	}
	return append(b, insns...)
}

func appendULEB(b []byte, v uint64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if v == 0 {
			return b
		}
	}
}

func appendSLEB(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		done := v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0
		if !done {
			c |= 0x80
		}
		b = append(b, c)
		if done {
			return b
		}
	}
}

// The usual x86_64 CIE: "zR" pcrel|sdata4, CFA = rsp+8, ra at CFA-8.
func amd64CIE(aug string, augData []byte) []byte {
	return cieBody(1, aug, 1, -8, 16, augData, 0x0c, 7, 8, 0x90, 1)
}

// The usual arm64 CIE: CFA = sp+0, return address in x30.
func arm64CIE(aug string, augData []byte) []byte {
	return cieBody(1, aug, 4, -8, 30, augData, 0x0c, 31, 0)
}

const testAddr = 0x10000 // section address of the test sections

// setLoc returns DW_CFA_set_loc to target after `before` bytes of
// instructions of the FDE ehDeltas builds with amd64CIE("zR", ...): its
// pcrel operand follows the CIE entry, the FDE's 17 header bytes, those
// instructions and the opcode.
func setLoc(target uint64, before int) []byte {
	field := testAddr + uint64(8+len(amd64CIE("zR", []byte{0x1b}))+17+before+1)
	return append([]byte{0x01}, binary.LittleEndian.AppendUint32(nil, uint32(target-field))...)
}

// sameDeltas is reflect.DeepEqual that does not tell nil from empty.
func sameDeltas(a, b Deltas) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

var (
	spRule  = func(off int32) Rule { return Rule{CFA: CFASP, CFAOffset: off, RAOffset: -8} }
	unknown = Rule{}
)

func TestLEB128(t *testing.T) {
	tests := []struct {
		in      []byte
		u       uint64
		s       int64
		problem string
	}{
		{in: []byte{0}, u: 0, s: 0},
		{in: []byte{0x7f}, u: 127, s: -1},
		{in: []byte{0x80, 0x01}, u: 128, s: 128},
		{in: []byte{0xe5, 0x8e, 0x26}, u: 624485, s: 624485},
		{in: []byte{0xc0, 0xbb, 0x78}, u: 1973696, s: -123456},
		{in: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, u: 1<<64 - 1, problem: "s"},
		{in: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, problem: "u", s: -1},
		{in: []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f}, problem: "u", s: -1 << 63},
		{in: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, problem: "us"},
		{in: []byte{0x80}, problem: "us"},
		{in: []byte{}, problem: "us"},
	}
	for _, tt := range tests {
		r := &reader{data: tt.in, end: len(tt.in)}
		u := r.uleb("u")
		if strings.Contains(tt.problem, "u") != !r.ok() || r.ok() && u != tt.u {
			t.Errorf("uleb(% x) = %d, problem %q; want %d, failure %v", tt.in, u, r.problem, tt.u, strings.Contains(tt.problem, "u"))
		}
		r = &reader{data: tt.in, end: len(tt.in)}
		s := r.sleb("s")
		if strings.Contains(tt.problem, "s") != !r.ok() || r.ok() && s != tt.s {
			t.Errorf("sleb(% x) = %d, problem %q; want %d, failure %v", tt.in, s, r.problem, tt.s, strings.Contains(tt.problem, "s"))
		}
		if r.ok() && !r.atEnd() {
			t.Errorf("sleb(% x) left %d bytes", tt.in, r.remaining())
		}
	}
	for _, v := range []int64{0, 1, -1, 63, 64, -64, -65, 1 << 40, -1 << 63, 1<<63 - 1} {
		b := appendSLEB(nil, v)
		r := &reader{data: b, end: len(b)}
		if got := r.sleb("s"); got != v || !r.ok() {
			t.Errorf("sleb(appendSLEB(%d)) = %d (%s)", v, got, r.problem)
		}
	}
}

func TestPointerEncodings(t *testing.T) {
	mem := map[uint64]uint64{0x5000: 0xabcdef}
	bases := pointerBases{
		section: 0x1000, text: 0x2000, data: 0x3000, fn: 0x4000,
		deref: func(a uint64) (uint64, bool) { v, ok := mem[a]; return v, ok },
	}
	tests := []struct {
		name    string
		enc     byte
		ptrSize int
		pre     int // bytes before the field, for pcrel and aligned
		in      []byte
		want    uint64
		fail    bool
	}{
		{name: "absptr", enc: 0x00, ptrSize: 8, in: []byte{1, 2, 3, 4, 5, 6, 7, 8}, want: 0x0807060504030201},
		{name: "absptr4", enc: 0x00, ptrSize: 4, in: []byte{1, 2, 3, 4}, want: 0x04030201},
		{name: "udata2", enc: 0x02, in: []byte{0xfe, 0xff}, want: 0xfffe},
		{name: "udata4", enc: 0x03, in: []byte{0xfe, 0xff, 0xff, 0xff}, want: 0xfffffffe},
		{name: "udata8", enc: 0x04, in: []byte{1, 0, 0, 0, 0, 0, 0, 0x80}, want: 0x8000000000000001},
		{name: "sdata2", enc: 0x0a, in: []byte{0xfe, 0xff}, want: ^uint64(1)},
		{name: "sdata4", enc: 0x0b, in: []byte{0xfe, 0xff, 0xff, 0xff}, want: ^uint64(1)},
		{name: "sdata8", enc: 0x0c, in: []byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, want: ^uint64(1)},
		{name: "uleb128", enc: 0x01, in: []byte{0x80, 0x01}, want: 128},
		{name: "sleb128", enc: 0x09, in: []byte{0x7f}, want: ^uint64(0)},
		{name: "signed4", enc: 0x08, ptrSize: 4, in: []byte{0xff, 0xff, 0xff, 0xff}, want: 0xffffffff},
		{name: "pcrel sdata4", enc: 0x1b, pre: 4, in: []byte{0xfc, 0xff, 0xff, 0xff}, want: 0x1000},
		{name: "pcrel wraps 32-bit", enc: 0x1b, ptrSize: 4, pre: 0, in: []byte{0x00, 0xf0, 0xff, 0xff}, want: 0},
		{name: "textrel udata4", enc: 0x23, in: []byte{0x10, 0, 0, 0}, want: 0x2010},
		{name: "datarel sdata4", enc: 0x3b, in: []byte{0xf0, 0xff, 0xff, 0xff}, want: 0x2ff0},
		{name: "funcrel uleb", enc: 0x41, in: []byte{0x08}, want: 0x4008},
		{name: "aligned", enc: 0x50, pre: 3, in: []byte{0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, want: 1},
		{name: "indirect pcrel", enc: 0x9b, in: []byte{0x00, 0x40, 0, 0}, want: 0xabcdef},
		{name: "indirect unreadable", enc: 0x9b, in: []byte{0x00, 0x50, 0, 0}, fail: true},
		{name: "omit", enc: 0xff, in: []byte{0, 0, 0, 0}, fail: true},
		{name: "unknown format", enc: 0x05, in: []byte{0, 0, 0, 0}, fail: true},
		{name: "unknown application", enc: 0x63, in: []byte{0, 0, 0, 0}, fail: true},
		{name: "truncated", enc: 0x03, in: []byte{0, 0}, fail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := append(make([]byte, tt.pre), tt.in...)
			r := &reader{data: data, pos: tt.pre, end: len(data), order: binary.LittleEndian}
			size := tt.ptrSize
			if size == 0 {
				size = 8
			}
			got := r.pointer(tt.enc, size, &bases, "p")
			if tt.fail {
				if r.ok() {
					t.Errorf("got %#x, want failure", got)
				}
				return
			}
			if !r.ok() || got != tt.want {
				t.Errorf("got %#x (%s), want %#x", got, r.problem, tt.want)
			}
			if !r.atEnd() {
				t.Errorf("%d bytes left", r.remaining())
			}
		})
	}
}

// ehDeltas builds an .eh_frame with one CIE and an FDE for
// [0x1000, 0x1100) running insns, and extracts it.
func ehDeltas(t *testing.T, a *archInfo, cie []byte, insns ...byte) (Deltas, Stats, error) {
	t.Helper()
	b := &cfiBuilder{addr: testAddr}
	c := b.cie(cie)
	b.fde(c, 0x1000, 0x100, insns...)
	return sectionDeltas(".eh_frame", b.buf, testAddr, a)
}

func TestCFAOpcodesAMD64(t *testing.T) {
	stdCIE := amd64CIE("zR", []byte{0x1b})
	fp := func(r Rule, cfa CFABase, off, fpOff int32) Rule {
		r.CFA, r.CFAOffset, r.FPOffset = cfa, off, fpOff
		return r
	}
	plt := func(lit byte) []byte {
		return []byte{0x0f, 11, 0x77, 8, 0x80, 0, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22}
	}
	tests := []struct {
		name  string
		cie   []byte
		insns []byte
		want  Deltas
		why   string // expected Stats.Unsupported key
	}{
		{name: "CIE rule only", want: Deltas{{0x1000, spRule(8)}, {0x1100, unknown}}},
		{name: "push rbp frame",
			insns: []byte{0x41, 0x0e, 16, 0x86, 2, 0x43, 0x0d, 6, 0x50, 0x0c, 7, 8, 0xc6},
			want: Deltas{{0x1000, spRule(8)}, {0x1001, fp(spRule(0), CFASP, 16, -16)},
				{0x1004, fp(spRule(0), CFAFP, 16, -16)}, {0x1014, spRule(8)}, {0x1100, unknown}}},
		{name: "advance_loc1/2/4",
			insns: []byte{0x02, 0x10, 0x0e, 16, 0x03, 0x10, 0x00, 0x0e, 24, 0x04, 0x10, 0, 0, 0, 0x0e, 32},
			want:  Deltas{{0x1000, spRule(8)}, {0x1010, spRule(16)}, {0x1020, spRule(24)}, {0x1030, spRule(32)}, {0x1100, unknown}}},
		{name: "MIPS advance_loc8",
			insns: []byte{0x1d, 0x20, 0, 0, 0, 0, 0, 0, 0, 0x0e, 16},
			want:  Deltas{{0x1000, spRule(8)}, {0x1020, spRule(16)}, {0x1100, unknown}}},
		{name: "set_loc pcrel",
			insns: append(setLoc(0x1040, 0), 0x0e, 16),
			want:  Deltas{{0x1000, spRule(8)}, {0x1040, spRule(16)}, {0x1100, unknown}}},
		{name: "def_cfa_sf, def_cfa_offset_sf",
			insns: []byte{0x41, 0x12, 7, 0x7e, 0x41, 0x13, 0x7d},
			want:  Deltas{{0x1000, spRule(8)}, {0x1001, spRule(16)}, {0x1002, spRule(24)}, {0x1100, unknown}}},
		{name: "offset_extended, offset_extended_sf, GNU_negative_offset_extended",
			insns: []byte{0x05, 6, 3, 0x41, 0x11, 6, 0x7c, 0x41, 0x2f, 6, 1},
			want: Deltas{{0x1000, fp(spRule(0), CFASP, 8, -24)}, {0x1001, fp(spRule(0), CFASP, 8, 32)},
				{0x1002, fp(spRule(0), CFASP, 8, 8)}, {0x1100, unknown}}},
		{name: "remember, restore state",
			insns: []byte{0x41, 0x0e, 16, 0x86, 2, 0x0a, 0x41, 0x0e, 8, 0xc6, 0x41, 0x0b},
			want: Deltas{{0x1000, spRule(8)}, {0x1001, fp(spRule(0), CFASP, 16, -16)}, {0x1002, spRule(8)},
				{0x1003, fp(spRule(0), CFASP, 16, -16)}, {0x1100, unknown}}},
		{name: "restore_extended",
			insns: []byte{0x86, 2, 0x41, 0x06, 6},
			want:  Deltas{{0x1000, fp(spRule(0), CFASP, 8, -16)}, {0x1001, spRule(8)}, {0x1100, unknown}}},
		{name: "undefined return address: stop",
			insns: []byte{0x44, 0x07, 16},
			want:  Deltas{{0x1000, spRule(8)}, {0x1004, Rule{CFA: CFAStop}}, {0x1100, unknown}}},
		{name: "same_value rbp",
			insns: []byte{0x86, 2, 0x41, 0x08, 6},
			want:  Deltas{{0x1000, fp(spRule(0), CFASP, 8, -16)}, {0x1001, spRule(8)}, {0x1100, unknown}}},
		{name: "rbp in a register", insns: []byte{0x09, 6, 3}, want: Deltas{{0x1000, unknown}}, why: "frame pointer rule"},
		{name: "rbp val_offset", insns: []byte{0x14, 6, 2}, want: Deltas{{0x1000, unknown}}, why: "frame pointer rule"},
		{name: "rbp val_offset_sf", insns: []byte{0x15, 6, 0x7e}, want: Deltas{{0x1000, unknown}}, why: "frame pointer rule"},
		{name: "rbp expression", insns: []byte{0x10, 6, 2, 0x77, 0}, want: Deltas{{0x1000, unknown}}, why: "frame pointer rule"},
		{name: "rbp val_expression", insns: []byte{0x16, 6, 2, 0x77, 0}, want: Deltas{{0x1000, unknown}}, why: "frame pointer rule"},
		{name: "other registers ignored",
			insns: []byte{0x83, 2, 0x09, 12, 13, 0x10, 3, 1, 0x30, 0x07, 5, 0x08, 4},
			want:  Deltas{{0x1000, spRule(8)}, {0x1100, unknown}}},
		{name: "CFA on another register", insns: []byte{0x0d, 3}, want: Deltas{{0x1000, unknown}}, why: "CFA based on a register other than SP or FP"},
		{name: "return address in a register", insns: []byte{0x09, 16, 5}, want: Deltas{{0x1000, unknown}}, why: "return address rule"},
		{name: "CFA offset beyond 32 bits", insns: []byte{0x0e, 0x80, 0x80, 0x80, 0x80, 0x10}, want: Deltas{{0x1000, unknown}}, why: "offset beyond 32 bits"},
		{name: "PLT expression", insns: plt(0x3b), want: Deltas{{0x1000, Rule{CFA: CFAPLT, CFAOffset: 11, RAOffset: -8}}, {0x1100, unknown}}},
		{name: "IBT PLT expression", insns: plt(0x3a), want: Deltas{{0x1000, Rule{CFA: CFAPLT, CFAOffset: 10, RAOffset: -8}}, {0x1100, unknown}}},
		{name: "other CFA expression", insns: plt(0x3c), want: Deltas{{0x1000, unknown}}, why: "CFA expression"},
		{name: "sigcontext CFA expression", insns: []byte{0x0f, 4, 0x77, 0xa0, 0x01, 0x06},
			want: Deltas{{0x1000, Rule{CFA: CFASignal}}, {0x1100, unknown}}},
		{name: "S augmentation", cie: amd64CIE("zRS", []byte{0x1b}), insns: []byte{0x0e, 16},
			want: Deltas{{0x1000, Rule{CFA: CFASignal}}, {0x1100, unknown}}},
		{name: "GNU_args_size and nops", insns: []byte{0x2e, 0x10, 0, 0, 0x41, 0x2e, 0},
			want: Deltas{{0x1000, spRule(8)}, {0x1100, unknown}}},
		{name: "advance past the end stops", insns: []byte{0x02, 0xff, 0x0e, 16, 0x03, 0x00, 0x01, 0x0e, 24, 0xff},
			want: Deltas{{0x1000, spRule(8)}, {0x10ff, spRule(16)}, {0x1100, unknown}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cie := tt.cie
			if cie == nil {
				cie = stdCIE
			}
			d, st, err := ehDeltas(t, &archAMD64, cie, tt.insns...)
			if err != nil {
				t.Fatal(err)
			}
			if tt.why != "" {
				if st.Unsupported[tt.why] == 0 {
					t.Errorf("unsupported %v, want %q counted", st.Unsupported, tt.why)
				}
				d = d[:1]
			}
			if !sameDeltas(d, tt.want) {
				t.Errorf("got  %v\nwant %v", d, tt.want)
			}
		})
	}
}

func TestCFAOpcodesARM64(t *testing.T) {
	lr := func(off int32, signed bool) Rule {
		return Rule{CFA: CFASP, CFAOffset: off, RASigned: signed}
	}
	framed := func(cfa CFABase, signed bool) Rule {
		return Rule{CFA: cfa, CFAOffset: 16, FPOffset: -16, RAOffset: -8, RASigned: signed}
	}
	tests := []struct {
		name  string
		aug   string
		insns []byte
		want  Deltas
	}{
		{name: "leaf: return address in LR", aug: "zR",
			want: Deltas{{0x1000, lr(0, false)}, {0x1100, unknown}}},
		{name: "pac-ret prologue and epilogue", aug: "zRB",
			insns: []byte{0x41, 0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1, 0x41, 0x0d, 29, 0x41,
				0xde, 0xdd, 0x0c, 31, 0, 0x41, 0x2d},
			want: Deltas{{0x1000, lr(0, false)}, {0x1004, lr(0, true)}, {0x1008, framed(CFASP, true)},
				{0x100c, framed(CFAFP, true)}, {0x1010, lr(0, true)}, {0x1014, lr(0, false)}, {0x1100, unknown}}},
		{name: "signing state is part of the remembered state", aug: "zRG",
			insns: []byte{0x0a, 0x2d, 0x41, 0x0b},
			want:  Deltas{{0x1000, lr(0, true)}, {0x1004, lr(0, false)}, {0x1100, unknown}}},
		{name: "undefined LR: stop", aug: "zR", insns: []byte{0x07, 30},
			want: Deltas{{0x1000, Rule{CFA: CFAStop}}, {0x1100, unknown}}},
		{name: "LR saved in LR", aug: "zR", insns: []byte{0x09, 30, 30},
			want: Deltas{{0x1000, lr(0, false)}, {0x1100, unknown}}},
		{name: "signal frame", aug: "zRS", insns: []byte{0x0c, 29, 0, 0x9d, 0},
			want: Deltas{{0x1000, Rule{CFA: CFASignal}}, {0x1100, unknown}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, _, err := ehDeltas(t, &archARM64, arm64CIE(tt.aug, []byte{0x1b}), tt.insns...)
			if err != nil {
				t.Fatal(err)
			}
			if !sameDeltas(d, tt.want) {
				t.Errorf("got  %v\nwant %v", d, tt.want)
			}
		})
	}
}

func TestCFAProgramErrors(t *testing.T) {
	nested := make([]byte, maxRememberDepth+1)
	for i := range nested {
		nested[i] = 0x0a
	}
	tests := []struct {
		name  string
		arch  *archInfo
		insns []byte
		want  string
	}{
		{"restore_state without remember", &archAMD64, []byte{0x0b}, "without DW_CFA_remember_state"},
		{"remember_state too deep", &archAMD64, nested, "nested deeper"},
		{"unknown opcode", &archAMD64, []byte{0x3f}, "unknown DW_CFA opcode 0x3f"},
		{"truncated operand", &archAMD64, []byte{0x0c, 7}, "truncated"},
		{"truncated expression", &archAMD64, []byte{0x0f, 20, 0x77}, "CFA expression"},
		{"negate_ra_state on x86_64", &archAMD64, []byte{0x2d}, "AArch64 only"},
		{"set_loc backwards", &archAMD64, append([]byte{0x44}, setLoc(0x1002, 1)...), "moves back"},
		{"offset overflow", &archAMD64, []byte{0x86, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}, "overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ehDeltas(t, tt.arch, amd64CIE("zR", []byte{0x1b}), tt.insns...)
			var fe *FormatError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a FormatError with %q", err, tt.want)
			}
			fdeAt := 8 + len(amd64CIE("zR", []byte{0x1b}))
			if fe.Section != ".eh_frame" || fe.Offset < fdeAt || fe.Offset > fdeAt+17+len(tt.insns) {
				t.Errorf("error at %s+%#x, want inside the FDE at .eh_frame+%#x", fe.Section, fe.Offset, fdeAt)
			}
		})
	}
}

func TestEntries(t *testing.T) {
	tests := []struct {
		name  string
		build func(b *cfiBuilder)
		debug bool
		want  Deltas
		skip  int    // SkippedFDEs
		err   string // substring of the error
	}{
		{name: "CIE version 3 with ULEB return column", build: func(b *cfiBuilder) {
			c := b.cie(cieBody(3, "zR", 1, -8, 16, []byte{0x1b}, 0x0c, 7, 8, 0x90, 1))
			b.fde(c, 0x1000, 0x10)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}}},
		{name: "two FDEs, a gap and a zero terminator", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			b.fde(c, 0x1000, 0x10)
			b.le32(0)
			b.fde(c, 0x1020, 0x10, 0x0e, 16)
			b.fde(c, 0x1030, 0x10, 0x0e, 16)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}, {0x1020, spRule(16)}, {0x1040, unknown}}},
		{name: "zPLR augmentation with an indirect personality", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zPLR", []byte{0x9b, 0, 0, 0, 0, 0x1b, 0x1b}))
			b.fde(c, 0x1000, 0x10)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}}},
		{name: "old eh augmentation", build: func(b *cfiBuilder) {
			body := []byte{1, 'e', 'h', 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x78, 16, 0x0c, 7, 8, 0x90, 1}
			c := b.cie(body)
			// No R: absolute 8-byte addresses.
			at := len(b.buf)
			fdeBody := binary.LittleEndian.AppendUint64(nil, 0x1000)
			fdeBody = binary.LittleEndian.AppendUint64(fdeBody, 0x10)
			b.entry(uint64(at+4-c), fdeBody)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}}},
		{name: "unknown augmentation: FDE skipped", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zRX", []byte{0x1b, 0}))
			b.fde(c, 0x1000, 0x10)
		}, skip: 1},
		{name: "augmentation without z: FDE skipped", build: func(b *cfiBuilder) {
			c := b.cie(cieBody(1, "Q", 1, -8, 16, nil))
			b.entry(uint64(len(b.buf)+4-c), make([]byte, 16))
		}, skip: 1},
		{name: "empty FDE skipped", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			b.fde(c, 0x1000, 0)
		}, skip: 1},
		{name: "overlapping FDEs: first wins", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			b.fde(c, 0x1000, 0x20, 0x48, 0x0e, 16)
			b.fde(c, 0x1010, 0x20, 0x0e, 32)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1008, spRule(16)}, {0x1020, spRule(32)}, {0x1030, unknown}}},
		{name: "64-bit lengths in .eh_frame", build: func(b *cfiBuilder) {
			b.dwarf64 = true
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			b.fde(c, 0x1000, 0x10)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}}},
		{name: ".debug_frame version 4", debug: true, build: func(b *cfiBuilder) {
			c := b.cie(cieBody(4, "", 1, -8, 16, nil, 0x0c, 7, 8, 0x90, 1))
			b.fde(c, 0x1000, 0x10, 0x41, 0x0e, 16)
		}, want: Deltas{{0x1000, spRule(8)}, {0x1001, spRule(16)}, {0x1010, unknown}}},
		{name: ".debug_frame 64-bit DWARF, CIE after its FDE", debug: true, build: func(b *cfiBuilder) {
			b.dwarf64 = true
			b.fde(0x24, 0x1000, 0x10) // the CIE follows this 36-byte FDE
			b.cie(cieBody(1, "", 1, -8, 16, nil, 0x0c, 7, 8, 0x90, 1))
		}, want: Deltas{{0x1000, spRule(8)}, {0x1010, unknown}}},
		{name: "length overruns the section", build: func(b *cfiBuilder) {
			b.le32(100)
			b.le32(0)
		}, err: ".eh_frame+0x4: entry length 100 overruns"},
		{name: "truncated length", build: func(b *cfiBuilder) {
			b.buf = append(b.buf, 1, 2)
		}, err: ".eh_frame+0x0: entry length: 4 bytes needed"},
		{name: "CIE pointer outside", build: func(b *cfiBuilder) {
			b.entry(0x100, make([]byte, 8))
		}, err: "CIE pointer out of the section"},
		{name: "CIE pointer to an FDE", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			f := b.fde(c, 0x1000, 0x10)
			b.entry(uint64(len(b.buf)+4-f), make([]byte, 9))
		}, err: "does not point to a CIE"},
		{name: "bad CIE version", build: func(b *cfiBuilder) {
			b.cie(cieBody(2, "", 1, -8, 16, nil))
		}, err: "CIE version 2"},
		{name: "FDE range wraps", build: func(b *cfiBuilder) {
			c := b.cie(amd64CIE("zR", []byte{0x1b}))
			b.fde(c, 0x1000, 0xffffffff)
			b.buf[len(b.buf)-5] = 0xff
			c2 := b.cie(cieBody(1, "zR", 1, -8, 16, []byte{0x04}, 0x0c, 7, 8))
			at := len(b.buf)
			body := binary.LittleEndian.AppendUint64(nil, 0xfffffffffffffff0)
			body = binary.LittleEndian.AppendUint64(body, 0x20)
			b.entry(uint64(at+4-c2), append(body, 0))
		}, err: "wraps around"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &cfiBuilder{addr: testAddr, debug: tt.debug}
			tt.build(b)
			name := ".eh_frame"
			if tt.debug {
				name = ".debug_frame"
			}
			d, st, err := sectionDeltas(name, b.buf, testAddr, &archAMD64)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want error %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.SkippedFDEs != tt.skip {
				t.Errorf("skipped %d FDEs, want %d", st.SkippedFDEs, tt.skip)
			}
			if !sameDeltas(d, tt.want) {
				t.Errorf("got  %v\nwant %v", d, tt.want)
			}
		})
	}
}

// FDEs are taken in address order whatever their order in the section;
// one overlapping the one before starts where that ends, with the row in
// force there, and one covered entirely is dropped. The rows are then the
// deltas as they are: the same as merging the layer.
func TestFDEsInAddressOrder(t *testing.T) {
	b := &cfiBuilder{addr: testAddr}
	c := b.cie(amd64CIE("zR", []byte{0x1b}))
	b.fde(c, 0x2000, 0x100, 0x02, 0x40, 0x0e, 16)                       // sp+16 from 0x2040
	b.fde(c, 0x1000, 0x100)                                             // before it, in another object
	b.fde(c, 0x2080, 0x180, 0x02, 0x20, 0x0e, 24, 0x02, 0x80, 0x0e, 32) // cut at 0x2100: sp+24 in force there, sp+32 from 0x2120
	b.fde(c, 0x2010, 0x10)                                              // inside the first: dropped
	arch := archFor(elf.EM_X86_64)
	st := Stats{Unsupported: map[string]int{}}
	sec := newCFISection(".eh_frame", b.buf, binary.LittleEndian, arch)
	sec.bases.section = testAddr
	l, err := sec.layer(&st, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Deltas{{0x1000, spRule(8)}, {0x1100, unknown}, {0x2000, spRule(8)}, {0x2040, spRule(16)},
		{0x2100, spRule(24)}, {0x2120, spRule(32)}, {0x2200, unknown}}
	if got := compact(slices.Clone(l.alone)); !sameDeltas(got, want) {
		t.Errorf("as parsed:\ngot  %v\nwant %v", got, want)
	}
	merged, err := mergeLayers([]layer{l}, &st)
	if err != nil || !sameDeltas(merged, want) {
		t.Errorf("merged: %v, %v\nwant %v", merged, err, want)
	}
	if st.Overlaps != 2 || st.FDEs != 4 {
		t.Errorf("overlaps %d, FDEs %d; want 2, 4", st.Overlaps, st.FDEs)
	}
}

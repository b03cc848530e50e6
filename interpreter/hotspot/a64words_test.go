package hotspot

import (
	"encoding/binary"
	"os"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/arch/arm64/arm64asm"
)

// TestA64Words: the instruction words jvm.ebpf.c recognises on arm64 are
// the instructions its comments and internals.md (arm64 A.8) name, checked
// with an independent decoder; a masked pattern with an example field.
func TestA64Words(t *testing.T) {
	src, err := os.ReadFile("../../support/ebpf/jvm.ebpf.c")
	if err != nil {
		t.Fatal(err)
	}
	words := map[string]uint64{}
	for _, m := range regexp.MustCompile(`(?m)^#\s*define (A64_\w+)\s+0x([0-9a-f]+)U?L*`).FindAllStringSubmatch(string(src), -1) {
		v, err := strconv.ParseUint(m[2], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		words[m[1]] = v
	}
	for _, c := range []struct {
		name  string
		field uint64 // ORed in: an example of the masked-out operand
		want  string // GNU syntax, one per word
	}{
		{"A64_RET", 0, "ret"},
		{"A64_AUTIAZ", 0, "hint #0x1c"},
		{"A64_CMP_SP_X8", 0, "cmp sp, x8"},
		{"A64_STP_FP_LR_PRE16", 0, "stp x29, x30, [sp,#-16]!"},
		{"A64_LDP_FP_LR_POST16", 0, "ldp x29, x30, [sp],#16"},
		{"A64_LDP_FP_LR_SP", 3 << 15, "ldp x29, x30, [sp,#24]"},
		{"A64_SUB_SP_IMM", 0x40 << 10, "sub sp, sp, #0x40"},
		{"A64_ADD_SP_IMM", 0x40 << 10, "add sp, sp, #0x40"},
		{"A64_LDR_X8_X28", 2 << 10, "ldr x8, [x28,#16]"},
		{"A64_LDR_WZR_X8", 0, "ldr wzr, [x8]"},
		{"A64_B_HI", 4 << 5, "b.hi .+0x10"},
		{"A64_BREADCRUMB_CALL", 0, "stp xzr, x9, [sp,#-16]!"},
	} {
		w, ok := words[c.name]
		if !ok {
			t.Errorf("%s: not defined in jvm.ebpf.c", c.name)
			continue
		}
		w |= c.field
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], w)
		inst, err := arm64asm.Decode(b[:4])
		if got := arm64asm.GNUSyntax(inst); err != nil || got != c.want {
			t.Errorf("%s (%#x): decodes to %q (%v), want %q", c.name, w, got, err, c.want)
		}
		if w>>32 != 0 {
			if inst, err := arm64asm.Decode(b[4:]); err != nil || arm64asm.GNUSyntax(inst) != "blr x8" {
				t.Errorf("%s: second word decodes to %q (%v), want blr x8", c.name, arm64asm.GNUSyntax(inst), err)
			}
		}
	}
}

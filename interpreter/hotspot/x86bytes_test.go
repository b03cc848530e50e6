package hotspot

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

// TestX86Bytes: the prologue and epilogue bytes jvm.ebpf.c recognises on
// x86_64 (x86_prologue, jvm_top_frame) decode, with an independent decoder,
// to the instructions its comments name.
func TestX86Bytes(t *testing.T) {
	src, err := os.ReadFile("../../support/ebpf/jvm.ebpf.c")
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]uint64{}
	for _, m := range regexp.MustCompile(`(?m)^#\s*define (X86_\w+)\s+0x([0-9a-f]+)U?`).FindAllStringSubmatch(string(src), -1) {
		n, err := strconv.ParseUint(m[2], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		v[m[1]] = n
	}
	b := func(names ...string) []byte {
		var out []byte
		for _, n := range names {
			x, ok := v[n]
			if !ok {
				t.Fatalf("%s: not defined in jvm.ebpf.c", n)
			}
			out = append(out, byte(x))
		}
		return out
	}
	mov := v["X86_MOV_RBP"]
	for _, c := range []struct {
		code []byte
		want string // GNU syntax
	}{
		{b("X86_PUSH_RBP"), "push %rbp"},
		{b("X86_POP_RBP"), "pop %rbp"},
		{b("X86_RET"), "retq"},
		{append(b("X86_REX_W", "X86_SUB_IMM8", "X86_MODRM_RSP"), 0x30), "sub $0x30,%rsp"},
		{append(b("X86_REX_W", "X86_SUB_IMM32", "X86_MODRM_RSP"), 0x28, 0, 0, 0), "sub $0x28,%rsp"},
		{[]byte{byte(mov >> 8), byte(mov >> 16), byte(mov >> 24)}, "mov %rsp,%rbp"},
	} {
		inst, err := x86asm.Decode(c.code, 64)
		if got := x86asm.GNUSyntax(inst, 0, nil); err != nil || got != c.want || inst.Len != len(c.code) {
			t.Errorf("% x: decodes to %q (%d bytes, %v), want %q", c.code, got, inst.Len, err, c.want)
		}
	}
}

package ruby

import (
	"fmt"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/internal/dwarftest"
	"github.com/hostprof/ebpf-profiler/utils/rubyfetch"
)

// TestLayoutFromDWARF checks the offset tables of 3.3 and 3.4 against the
// DWARF of libruby built from their release sources with debug
// information (utils/rubyfetch/build-ruby-yjit.sh): Debian's debug
// packages are not reachable here, and a struct's layout is the
// release's, not the build's.
func TestLayoutFromDWARF(t *testing.T) {
	for _, v := range []string{"3.3", "3.4"} {
		t.Run(v, func(t *testing.T) { checkLayoutFromDWARF(t, v) })
	}
}

func checkLayoutFromDWARF(t *testing.T, v string) {
	lib, err := rubyfetch.LibrubyYJIT(v)
	if err != nil {
		t.Fatal(err)
	}
	structs, err := dwarftest.Load(lib)
	if err != nil {
		t.Fatal(err)
	}
	var minor int
	fmt.Sscanf(v, "3.%d", &minor)
	l, err := LayoutFor(interpreter.Version{Major: 3, Minor: minor})
	if err != nil {
		t.Fatal(err)
	}
	// The class and its classext share one slot (RClass_and_rb_classext_t).
	classext, err := structs.Offset("RClass_and_rb_classext_t", "classext")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		want       uint64
	}{
		{"rb_control_frame_struct", "sizeof", l.CFPSize},
		{"rb_control_frame_struct", "pc", l.CFPPC},
		{"rb_control_frame_struct", "iseq", l.CFPISeq},
		{"rb_control_frame_struct", "ep", l.CFPEP},
		{"rb_execution_context_struct", "vm_stack", l.ECVMStack},
		{"rb_execution_context_struct", "vm_stack_size", l.ECVMStackSize},
		{"rb_execution_context_struct", "cfp", l.ECCFP},
		{"rb_iseq_struct", "body", l.ISeqBody},
		{"rb_iseq_constant_body", "iseq_encoded", l.BodyEncoded},
		{"rb_iseq_constant_body", "iseq_size", l.BodyEncoded - 4},
		{"rb_iseq_constant_body", "location.pathobj", l.BodyPathObj},
		{"rb_iseq_constant_body", "location.label", l.BodyLabel},
		{"rb_iseq_constant_body", "location.first_lineno", l.BodyFirstLine},
		{"rb_iseq_constant_body", "insns_info", l.BodyInsnsInfo},
		{"iseq_insn_info_entry", "sizeof", l.InsnInfoSize},
		{"iseq_insn_info_entry", "line_no", 0},
		{"RString", "len", l.StrLen},
		{"RString", "as.heap.ptr", l.StrPtr},
		{"RString", "as.embed.ary", l.StrEmbedded},
		{"RArray", "as.heap.len", l.AryLen},
		{"RArray", "as.heap.ptr", l.AryPtr},
		{"RArray", "as.ary", l.AryEmbedded},
		{"rb_method_entry_struct", "def", l.MEDef},
		{"rb_method_entry_struct", "owner", l.MEOwner},
		{"rb_method_definition_struct", "body", defBody},
		{"rb_method_definition_struct", "original_id", l.DefOriginalID},
		{"rb_classext_struct", "classpath", l.ClassPath - classext},
		{"rb_classext_struct", "as.singleton_class.attached_object", l.SingletonAttached - classext},
		{"RMoved", "destination", movedDestination},
	} {
		got, err := structs.Offset(c.name, c.path)
		switch {
		case err != nil:
			t.Errorf("%s.%s: %v", c.name, c.path, err)
		case got != c.want:
			t.Errorf("%s.%s is at %d in DWARF, the table says %d", c.name, c.path, got, c.want)
		}
	}
}

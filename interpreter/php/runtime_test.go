package php

import (
	"slices"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirrors of the PHP unwinder's structs have
// their C layouts, and its frames are read where PHP keeps them.
func TestUnwinderStructs(t *testing.T) {
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	for name, mirror := range map[string]any{"php_proc": UnwinderProc{}, "php_execute_data": unwinderExecuteData{},
		"php_function_head": unwinderFunctionHead{}} {
		if err := shared.CheckMirror(name, mirror); err != nil {
			t.Error(err)
		}
	}
	if !readsExecuteData() {
		t.Error("the unwinder reads zend_execute_data's opline, func and prev_execute_data elsewhere than PHP keeps them")
	}
}

// TestJITAreas: OPcache's JIT buffer (the executable end of its anonymous
// shared memory, a deleted /dev/zero) is claimed, nothing else; and it
// stays claimed while OPcache has it writable to compile into, merged
// with the rest of its shared memory, until that is gone.
func TestJITAreas(t *testing.T) {
	exe := interpreter.Mapping{Start: 0x1000, End: 0x2000, Path: "/usr/bin/php8.2", Executable: true}
	anon := interpreter.Mapping{Start: 0x7f0000000000, End: 0x7f0000001000, Executable: true}
	ms := []interpreter.Mapping{
		exe,
		{Start: 0x40000000, End: 0x48000000, Path: "/dev/zero"},
		{Start: 0x48000000, End: 0x4c000000, Path: "/dev/zero", Executable: true},
		anon,
	}
	want := []interpreter.Region{{Start: 0x48000000, End: 0x4c000000, Unwind: true}}
	got := jitAreas(ms, nil)
	if !slices.Equal(got, want) {
		t.Errorf("jitAreas = %v, want %v", got, want)
	}
	compiling := []interpreter.Mapping{exe, {Start: 0x40000000, End: 0x4c000000, Path: "/dev/zero"}, anon}
	if got := jitAreas(compiling, want); !slices.Equal(got, want) {
		t.Errorf("while compiling: jitAreas = %v, want %v", got, want)
	}
	if got := jitAreas(compiling, nil); len(got) != 0 {
		t.Errorf("writable shared memory never seen executable: jitAreas = %v, want none", got)
	}
	if got := jitAreas([]interpreter.Mapping{exe, anon}, want); len(got) != 0 {
		t.Errorf("shared memory unmapped: jitAreas = %v, want none", got)
	}
}

package php

import (
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
// shared memory, a deleted /dev/zero) is claimed, nothing else.
func TestJITAreas(t *testing.T) {
	ms := []interpreter.Mapping{
		{Start: 0x1000, End: 0x2000, Path: "/usr/bin/php8.2", Executable: true},
		{Start: 0x40000000, End: 0x48000000, Path: "/dev/zero"},
		{Start: 0x48000000, End: 0x4c000000, Path: "/dev/zero", Executable: true},
		{Start: 0x7f0000000000, End: 0x7f0000001000, Executable: true},
	}
	got := jitAreas(ms)
	want := []interpreter.Region{{Start: 0x48000000, End: 0x4c000000, Unwind: true}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("jitAreas = %v, want %v", got, want)
	}
}

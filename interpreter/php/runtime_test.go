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

// TestJITAreas: OPcache's shared memory (a deleted /dev/zero), whose
// executable end is the JIT buffer, is claimed whole, nothing else; the
// same while OPcache has the buffer writable to compile into, merged with
// the rest into one mapping.
func TestJITAreas(t *testing.T) {
	exe := interpreter.Mapping{Start: 0x1000, End: 0x2000, Path: "/usr/bin/php8.2", Executable: true}
	anon := interpreter.Mapping{Start: 0x7f0000000000, End: 0x7f0000001000, Executable: true}
	want := []interpreter.Region{{Start: 0x40000000, End: 0x4c000000, Unwind: true}}
	running := []interpreter.Mapping{exe,
		{Start: 0x40000000, End: 0x48000000, Path: "/dev/zero"},
		{Start: 0x48000000, End: 0x4c000000, Path: "/dev/zero", Executable: true},
		anon}
	compiling := []interpreter.Mapping{exe, {Start: 0x40000000, End: 0x4c000000, Path: "/dev/zero"}, anon}
	for name, ms := range map[string][]interpreter.Mapping{"running": running, "compiling": compiling} {
		if got := jitAreas(ms); !slices.Equal(got, want) {
			t.Errorf("%s: jitAreas = %v, want %v", name, got, want)
		}
	}
	if got := jitAreas([]interpreter.Mapping{exe, anon}); len(got) != 0 {
		t.Errorf("no shared memory: jitAreas = %v, want none", got)
	}
}

// mappingsHost is a process whose maps are all (ReadMappings) or only the
// executable ones (Mappings), and records the regions claimed.
type mappingsHost struct {
	interpreter.Host
	all     []interpreter.Mapping
	regions []interpreter.Region
}

func (h *mappingsHost) Mappings() []interpreter.Mapping {
	return slices.DeleteFunc(slices.Clone(h.all), func(m interpreter.Mapping) bool { return !m.Executable })
}
func (h *mappingsHost) ReadMappings() ([]interpreter.Mapping, error) { return h.all, nil }
func (h *mappingsHost) SetRegions(rs []interpreter.Region) error {
	h.regions = rs
	return nil
}

// TestUpdateWhileCompiling: an update while OPcache compiles, when no
// /dev/zero mapping is executable, keeps the JIT buffer claimed.
func TestUpdateWhileCompiling(t *testing.T) {
	exe := interpreter.Mapping{Start: 0x1000, End: 0x2000, Path: "/usr/bin/php8.2", Executable: true}
	want := []interpreter.Region{{Start: 0x40000000, End: 0x4c000000, Unwind: true}}
	h := &mappingsHost{all: []interpreter.Mapping{exe,
		{Start: 0x40000000, End: 0x48000000, Path: "/dev/zero"},
		{Start: 0x48000000, End: 0x4c000000, Path: "/dev/zero", Executable: true}}}
	p := &process{}
	if _, err := p.Update(h); err != nil || !slices.Equal(h.regions, want) {
		t.Fatalf("running: Update = %v, claimed %v, want %v", err, h.regions, want)
	}
	h.all = []interpreter.Mapping{exe, {Start: 0x40000000, End: 0x4c000000, Path: "/dev/zero"}}
	if _, err := p.Update(h); err != nil || !slices.Equal(h.regions, want) {
		t.Errorf("compiling: Update = %v, claimed %v, want %v", err, h.regions, want)
	}
}

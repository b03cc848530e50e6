package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestDropReadOnlyPages: the read-only mappings of the running test binary
// lose their resident pages and the process goes on running; its
// writable mappings keep theirs (the data below is intact). A malformed
// maps line is an error.
func TestDropReadOnlyPages(t *testing.T) {
	data := strings.Repeat("kept", 1000)
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := dropReadOnlyPages("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if dropped == 0 {
		t.Errorf("no read-only mapping of %s dropped", exe)
	}
	if strings.Count(data, "kept") != 1000 {
		t.Error("data changed")
	}
	bad := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(bad, []byte("zz-yy r--p 00000000 00:00 0 "+exe+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dropReadOnlyPages(bad); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed line: %v", err)
	}
}

// TestIdleHeap: garbage collected but not yet returned counts as idle heap,
// and FreeOSMemory, which returnIdleHeap calls above maxIdleHeap, returns it.
func TestIdleHeap(t *testing.T) {
	garbage := make([][]byte, 64)
	for i := range garbage {
		garbage[i] = make([]byte, 1<<20)
		garbage[i][0] = 1
	}
	garbage = nil
	runtime.GC()
	before := idleHeap()
	debug.FreeOSMemory()
	if after := idleHeap(); after > maxIdleHeap || after > before {
		t.Errorf("idle heap %d MiB before, %d MiB after FreeOSMemory", before>>20, after>>20)
	}
}

// TestLimitStartupMemory: the start-up limit applies only below the one
// set, and the set one comes back.
func TestLimitStartupMemory(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	for _, set := range []int64{math.MaxInt64, 1 << 30, 10 << 20} {
		debug.SetMemoryLimit(set)
		end := limitStartupMemory()
		if got := debug.SetMemoryLimit(-1); got != min(set, startupMemoryLimit) {
			t.Errorf("limit %d: %d during start-up, want %d", set, got, min(set, startupMemoryLimit))
		}
		end()
		if got := debug.SetMemoryLimit(-1); got != set {
			t.Errorf("limit %d: %d after start-up", set, got)
		}
	}
}

package main

import (
	"os"
	"path/filepath"
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

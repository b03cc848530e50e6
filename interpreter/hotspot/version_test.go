package hotspot

import (
	"errors"
	"strings"
	"testing"
)

func TestVMReleaseUpdate(t *testing.T) {
	for _, c := range []struct {
		rel  string
		want int32
	}{
		{"25.504-b01", 504},
		{"25.402-b06", 402},
		{"25.0-b70", 0},
		{"25.71", 71},
		{"", 0},
		{"25", 0},
		{"25.x-b01", 0},
		{"25.99999999999-b1", 0},
	} {
		if got := vmReleaseUpdate(c.rel); got != c.want {
			t.Errorf("vmReleaseUpdate(%q) = %d, want %d", c.rel, got, c.want)
		}
	}
}

// TestLayoutRefusesUnknownFrames: a JDK whose interpreter frame layout is
// not known (7, 9, 10) is refused with its version in the error, even where
// its tables have every field.
func TestLayoutRefusesUnknownFrames(t *testing.T) {
	for _, c := range []struct {
		major int32
		arch  string
		slot  uint8
		ok    bool
	}{
		{7, "amd64", 0, false},
		{8, "amd64", 7, true},
		{8, "arm64", 7, true},
		{9, "amd64", 0, false},
		{10, "arm64", 0, false},
		{11, "amd64", 8, true},
		{11, "arm64", 9, true},
		{26, "amd64", 8, true},
		{26, "arm64", 9, true},
		{26, "riscv64", 0, false},
	} {
		slot, ok := bcpSlot(c.major, c.arch)
		if slot != c.slot || ok != c.ok {
			t.Errorf("bcpSlot(%d, %s) = %d, %v, want %d, %v", c.major, c.arch, slot, ok, c.slot, c.ok)
		}
	}
	_, err := NewLayout(&VMStructs{}, [4]int32{9, 0, 4, 1})
	if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "JDK 9.0.4 ") ||
		!strings.Contains(err.Error(), "interpreter's frame layout") {
		t.Errorf("NewLayout of JDK 9 without tables: %v", err)
	}
}

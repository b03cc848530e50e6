package interpreter

import "testing"

func TestVersionStrings(t *testing.T) {
	for _, tt := range []struct {
		v                Version
		full, majorMinor string
	}{
		{Version{Major: 5, Minor: 36}, "5.36.0", "5.36"},
		{Version{Major: 8, Minor: 2, Patch: 36}, "8.2.36", "8.2"},
	} {
		if got := tt.v.String(); got != tt.full {
			t.Errorf("%#v.String() = %q, want %q", tt.v, got, tt.full)
		}
		if got := tt.v.MajorMinor(); got != tt.majorMinor {
			t.Errorf("%#v.MajorMinor() = %q, want %q", tt.v, got, tt.majorMinor)
		}
	}
}

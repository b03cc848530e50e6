package execinfo

import "testing"

// TestDemangle: Itanium C++ and Rust (legacy and v0) names read as their
// sources spell them, simplified or full; other names and names that do
// not demangle stay as they are, the latter counted.
func TestDemangle(t *testing.T) {
	tests := []struct {
		sym              string
		simplified, full string
		failure          bool
	}{
		{"_ZN4cfso10cf_so_leafEm", "cfso::cf_so_leaf", "cfso::cf_so_leaf(unsigned long)", false},
		{"_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector::push_back", "std::vector<int, std::allocator<int> >::push_back(int const&)", false},
		{"_ZN2ns1SplERKS0_", "ns::S::operator+", "ns::S::operator+(ns::S const&)", false},
		{"_ZZ4mainENKUlvE_clEv", "main::{lambda()#1}::operator()", "main::{lambda()#1}::operator()() const", false},
		{"_ZN9rustchain4leaf17h0123456789abcdefE", "rustchain::leaf", "rustchain::leaf", false},
		{"_RNvCs1234_9rustchain4leaf", "rustchain::leaf", "rustchain::leaf", false},
		{"main.leaf", "main.leaf", "main.leaf", false},
		{"memcpy", "memcpy", "memcpy", false},
		{"_Zgarbage", "_Zgarbage", "_Zgarbage", true},
	}
	simple, full, none := NewDemangler(DemangleSimplified), NewDemangler(DemangleFull), NewDemangler(DemangleNone)
	failures := uint64(0)
	for _, tt := range tests {
		if got, _ := simple.Name(tt.sym); got != tt.simplified {
			t.Errorf("simplified %s = %q, want %q", tt.sym, got, tt.simplified)
		}
		if got, _ := full.Name(tt.sym); got != tt.full {
			t.Errorf("full %s = %q, want %q", tt.sym, got, tt.full)
		}
		if got, changed := none.Name(tt.sym); got != tt.sym || changed {
			t.Errorf("none %s = %q, %v", tt.sym, got, changed)
		}
		if tt.failure {
			failures++
		}
		// Cached: the same answer, not counted again.
		if got, _ := simple.Name(tt.sym); got != tt.simplified {
			t.Errorf("simplified %s again = %q", tt.sym, got)
		}
	}
	if simple.failures != failures || full.failures != failures {
		t.Errorf("failures %d (simplified), %d (full), want %d", simple.failures, full.failures, failures)
	}
}

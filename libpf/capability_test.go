package libpf

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestCapabilitySet(t *testing.T) {
	s := CapabilitySet(1<<CapBPF | 1<<CapSysPtrace)
	if !s.Has(CapBPF) || s.Has(CapPerfmon) || !s.HasAny(CapPerfmon, CapSysPtrace) || s.HasAny(CapSysAdmin) {
		t.Errorf("set %b: wrong membership", s)
	}
	if got := s.Missing(CapBPF, CapPerfmon, CapSyslog); got != "CAP_PERFMON and CAP_SYSLOG" {
		t.Errorf("Missing = %q", got)
	}
	if got := Capability(63).String(); got != "capability 63" {
		t.Errorf("unnamed capability: %q", got)
	}
}

// TestEffectiveCapabilities checks the 64-bit assembly of the kernel's two
// 32-bit words against /proc/self/status.
func TestEffectiveCapabilities(t *testing.T) {
	s, err := EffectiveCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	want := procStatusCapEff(t)
	if uint64(s) != want {
		t.Errorf("EffectiveCapabilities = %x, /proc/self/status CapEff %x", uint64(s), want)
	}
}

func procStatusCapEff(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return 0
}

package libpf

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Capability is a Linux capability number (include/uapi/linux/capability.h).
type Capability uint

// The capabilities the daemon uses.
const (
	CapDACOverride       Capability = 1
	CapDACReadSearch     Capability = 2
	CapSysPtrace         Capability = 19
	CapSysAdmin          Capability = 21
	CapSysResource       Capability = 24
	CapSyslog            Capability = 34
	CapPerfmon           Capability = 38
	CapBPF               Capability = 39
	CapCheckpointRestore Capability = 40
)

var capabilityNames = map[Capability]string{
	CapDACOverride: "CAP_DAC_OVERRIDE", CapDACReadSearch: "CAP_DAC_READ_SEARCH", CapSysPtrace: "CAP_SYS_PTRACE",
	CapSysAdmin: "CAP_SYS_ADMIN", CapSysResource: "CAP_SYS_RESOURCE", CapSyslog: "CAP_SYSLOG",
	CapPerfmon: "CAP_PERFMON", CapBPF: "CAP_BPF", CapCheckpointRestore: "CAP_CHECKPOINT_RESTORE",
}

func (c Capability) String() string {
	if n, ok := capabilityNames[c]; ok {
		return n
	}
	return fmt.Sprintf("capability %d", uint(c))
}

// CapabilitySet is a set of capabilities, bit c for capability c.
type CapabilitySet uint64

// EffectiveCapabilities returns the calling thread's effective set.
func EffectiveCapabilities() (CapabilitySet, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, fmt.Errorf("reading capabilities: %w", err)
	}
	return CapabilitySet(data[0].Effective) | CapabilitySet(data[1].Effective)<<32, nil
}

// Has reports whether the set holds c.
func (s CapabilitySet) Has(c Capability) bool { return s&(1<<c) != 0 }

// HasAny reports whether the set holds one of cs.
func (s CapabilitySet) HasAny(cs ...Capability) bool {
	for _, c := range cs {
		if s.Has(c) {
			return true
		}
	}
	return false
}

// Missing lists the capabilities of cs the set lacks, " and "-joined.
func (s CapabilitySet) Missing(cs ...Capability) string {
	var names []string
	for _, c := range cs {
		if !s.Has(c) {
			names = append(names, c.String())
		}
	}
	return strings.Join(names, " and ")
}

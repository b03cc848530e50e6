package main

import (
	"strings"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/tracer"
)

// usefulCapability is a capability beyond BPF and perf events (which the
// tracer requires) that makes the output complete; any of anyOf will do.
type usefulCapability struct {
	anyOf []libpf.Capability
	lost  string
	// minKernel is the oldest kernel that knows anyOf[0] ("" = all).
	minKernel string
	// maxKernel: only kernels older than this need it ("" = all).
	maxKernel string
}

// usefulCapabilities are what a daemon with fewer privileges than root
// loses, as documented in docs/install.md and granted by the systemd unit.
var usefulCapabilities = []usefulCapability{
	{anyOf: []libpf.Capability{libpf.CapSysPtrace},
		lost: "user frames cannot be attributed to files, nor runtime frames read (/proc/PID/maps, /proc/PID/mem)"},
	{anyOf: []libpf.Capability{libpf.CapDACReadSearch, libpf.CapDACOverride},
		lost: "files other users may not read cannot be opened (/proc/PID/map_files, /proc/PID/root)"},
	{anyOf: []libpf.Capability{libpf.CapCheckpointRestore, libpf.CapSysAdmin}, minKernel: "5.9",
		lost: "deleted and other-namespace files cannot be opened (/proc/PID/map_files)"},
	{anyOf: []libpf.Capability{libpf.CapSysAdmin}, maxKernel: "5.9",
		lost: "deleted and other-namespace files cannot be opened (/proc/PID/map_files)"},
	{anyOf: []libpf.Capability{libpf.CapSyslog},
		lost: "kernel frames cannot be symbolized (/proc/kallsyms shows no addresses)"},
	{anyOf: []libpf.Capability{libpf.CapSysResource}, maxKernel: "5.11",
		lost: "the BPF maps may not fit the memlock limit (kernels before 5.11 charge them to it)"},
}

// warnMissingCapabilities says what a daemon started with reduced
// capabilities will not report, instead of silently leaving it out.
func warnMissingCapabilities(release string) {
	caps, err := libpf.EffectiveCapabilities()
	if err != nil {
		log.Warn(err)
		return
	}
	for _, c := range usefulCapabilities {
		if (c.minKernel != "" && !tracer.KernelAtLeast(release, c.minKernel)) ||
			(c.maxKernel != "" && tracer.KernelAtLeast(release, c.maxKernel)) || caps.HasAny(c.anyOf...) {
			continue
		}
		names := make([]string, len(c.anyOf))
		for i, cp := range c.anyOf {
			names[i] = cp.String()
		}
		log.Warnf("Without %s %s", strings.Join(names, " or "), c.lost)
	}
}

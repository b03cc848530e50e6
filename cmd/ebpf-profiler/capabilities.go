package main

import (
	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Capabilities beyond BPF and perf events (which the tracer checks) that
// make the output complete, from include/uapi/linux/capability.h.
var usefulCapabilities = []struct {
	bit  uint
	name string
	lost string
}{
	{19, "CAP_SYS_PTRACE", "user frames cannot be attributed to files (/proc/PID/maps, /proc/PID/root)"},
	{21, "CAP_SYS_ADMIN", "deleted and other-namespace files cannot be opened (/proc/PID/map_files)"},
	{34, "CAP_SYSLOG", "kernel frames cannot be symbolized (/proc/kallsyms shows no addresses)"},
}

// warnMissingCapabilities says what a daemon started with reduced
// capabilities will not report, instead of silently leaving it out.
func warnMissingCapabilities() {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		log.Warnf("Reading capabilities: %v", err)
		return
	}
	for _, c := range usefulCapabilities {
		if data[c.bit/32].Effective&(1<<(c.bit%32)) == 0 {
			log.Warnf("Without %s %s", c.name, c.lost)
		}
	}
}

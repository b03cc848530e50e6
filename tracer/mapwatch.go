package tracer

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"
	log "github.com/sirupsen/logrus"
)

// Executable mappings are reported as they are made (EVENT_EXEC_MAPPED) by
// one of two programs: an fexit program on mmap_region, which needs BPF
// trampolines (x86_64 5.5, arm64 6.0) and the function in the kernel's BTF,
// or a kprobe on perf_event_mmap, which needs CONFIG_KPROBES. The fexit
// program names its target at load time, so it is loaded on its own after
// the collection and a kernel without it still loads everything else.
const MapWatchFexit = "exec_mapped_fexit"

// attachMapWatch attaches whichever mapping watch the kernel supports.
// Without one, new mappings are found from samples (EVENT_UNKNOWN_PC), so a
// process's first samples may be incomplete: that is logged, not fatal.
func (t *Tracer) attachMapWatch() {
	var errs []error
	if t.mapWatch != nil {
		l, err := link.AttachTracing(link.TracingOptions{Program: t.mapWatch})
		if err == nil {
			t.procLinks = append(t.procLinks, l)
			t.mapWatchMode = "fexit on mmap_region"
			return
		}
		errs = append(errs, fmt.Errorf("fexit on mmap_region: %w", rootCause(err)))
	} else {
		errs = append(errs, fmt.Errorf("fexit on mmap_region: %w", rootCause(t.mapWatchErr)))
	}
	l, err := link.Kprobe("perf_event_mmap", t.progs.MapWatchKprobe, nil)
	if err == nil {
		t.procLinks = append(t.procLinks, l)
		t.mapWatchMode = "kprobe on perf_event_mmap"
		return
	}
	errs = append(errs, fmt.Errorf("kprobe on perf_event_mmap: %w", rootCause(err)))
	t.mapWatchMode = "none"
	log.Warnf("Not watching new executable mappings (%v; %v): new processes and libraries are "+
		"found from exec events and samples instead", errs[0], errs[1])
}

// rootCause is the innermost error of a chain: the kernel's answer rather
// than the loader's layers around it.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

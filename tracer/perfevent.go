package tracer

import (
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// perfEvent is one CPU's cpu-clock sampling event with the entry program
// attached.
type perfEvent struct {
	fd   int
	cpu  int
	link link.Link // nil when attached with the ioctl of kernels before 5.15
}

// openPerfEvent opens a cpu-clock event sampling cpu every 1/hz seconds of
// CPU time and runs prog on each sample, enabled or not. A fixed period
// (not a frequency) keeps the sampling interval exact: the period type is
// cpu/nanoseconds.
func openPerfEvent(cpu, hz int, prog *ebpf.Program, enabled bool) (*perfEvent, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_CPU_CLOCK,
		Sample: uint64(time.Second) / uint64(hz),
		Bits:   unix.PerfBitDisabled,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, perfEventError(cpu, err)
	}
	pe := &perfEvent{fd: fd, cpu: cpu}
	pe.link, err = link.AttachRawLink(link.RawLinkOptions{
		Target:  fd,
		Program: prog,
		Attach:  ebpf.AttachPerfEvent,
	})
	if err != nil {
		pe.link = nil
		if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_SET_BPF, prog.FD()); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("attaching the sampling program to CPU %d: %w", cpu, err)
		}
	}
	if err := pe.enable(enabled); err != nil {
		pe.close()
		return nil, err
	}
	return pe, nil
}

// enable starts or stops the event's sampling.
func (pe *perfEvent) enable(on bool) error {
	req, what := uint(unix.PERF_EVENT_IOC_DISABLE), "disabling"
	if on {
		req, what = unix.PERF_EVENT_IOC_ENABLE, "enabling"
	}
	if err := unix.IoctlSetInt(pe.fd, req, 0); err != nil {
		return fmt.Errorf("%s sampling on CPU %d: %w", what, pe.cpu, err)
	}
	return nil
}

func perfEventError(cpu int, err error) error {
	switch {
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("opening a perf event on CPU %d: %w (needs root or CAP_PERFMON; check kernel.perf_event_paranoid)", cpu, err)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.EOPNOTSUPP):
		return fmt.Errorf("opening a cpu-clock perf event on CPU %d: %w (perf events unavailable on this kernel or in this VM)", cpu, err)
	default:
		return fmt.Errorf("opening a perf event on CPU %d: %w", cpu, err)
	}
}

func (pe *perfEvent) attachMode() string {
	if pe.link != nil {
		return "bpf_link"
	}
	return "ioctl"
}

func (pe *perfEvent) close() {
	_ = unix.IoctlSetInt(pe.fd, unix.PERF_EVENT_IOC_DISABLE, 0)
	if pe.link != nil {
		pe.link.Close()
	}
	unix.Close(pe.fd)
}

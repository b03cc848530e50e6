package tracer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// checkPrivileges fails early, naming what is missing, where BPF or perf
// events would be refused.
func checkPrivileges() error {
	caps, err := libpf.EffectiveCapabilities()
	if err != nil {
		return err
	}
	if caps.Has(libpf.CapSysAdmin) || (caps.Has(libpf.CapBPF) && caps.Has(libpf.CapPerfmon)) {
		return nil
	}
	advice := "run it as root, or grant the capabilities (the systemd unit in support/systemd does)"
	if os.Geteuid() != 0 && caps == 0 {
		advice = "try sudo"
	}
	return fmt.Errorf("ebpf-profiler lacks %s: it needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load BPF "+
		"programs and open perf events on every CPU; %s", caps.Missing(libpf.CapBPF, libpf.CapPerfmon), advice)
}

type kernelFeatures struct {
	taskPtRegs bool
	// findVMA: bpf_find_vma (5.17), whose callback is a BPF subprogram in
	// programs that also tail call, which the arm64 JIT allows from 6.0.
	findVMA bool
	// onDemandHash: perf_event programs may use hash maps that allocate
	// their elements on update (BPF_F_NO_PREALLOC), from 6.1 on.
	onDemandHash bool
}

// probeFeatures checks what the programs need and what they can use.
func probeFeatures() (kernelFeatures, error) {
	var f kernelFeatures
	if err := features.HaveProgramType(ebpf.PerfEvent); err != nil {
		return f, fmt.Errorf("BPF perf_event programs are unavailable on kernel %s: %w", KernelRelease(), err)
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return f, fmt.Errorf("BPF ring buffers are unavailable on kernel %s (kernel >= 5.8 needed): %w", KernelRelease(), err)
	}
	if err := features.HaveProgramHelper(ebpf.PerfEvent, asm.FnGetStack); err != nil {
		return f, fmt.Errorf("bpf_get_stack is unavailable on kernel %s: %w", KernelRelease(), err)
	}
	f.taskPtRegs = features.HaveProgramHelper(ebpf.PerfEvent, asm.FnTaskPtRegs) == nil
	f.findVMA = features.HaveProgramHelper(ebpf.PerfEvent, asm.FnFindVma) == nil &&
		(runtime.GOARCH != "arm64" || KernelAtLeast(KernelRelease(), "6.0"))
	f.onDemandHash = probeOnDemandHash()
	return f, nil
}

// probeOnDemandHash loads a perf_event program that refers to a hash map
// without preallocation: kernels before 6.1 refuse it ("perf_event
// programs can only use preallocated hash map").
func probeOnDemandHash() bool {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1, Flags: unix.BPF_F_NO_PREALLOC})
	if err != nil {
		return false
	}
	defer m.Close()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.PerfEvent, License: "GPL", Instructions: asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	}})
	if err != nil {
		return false
	}
	p.Close()
	return true
}

// preallocateHashMaps clears BPF_F_NO_PREALLOC from the hash maps of spec,
// for kernels whose perf_event programs cannot use them otherwise. They
// then take their full size in memory at load (tries always allocate on
// demand and are left alone).
func preallocateHashMaps(spec *ebpf.CollectionSpec) {
	var names []string
	for name, ms := range spec.Maps {
		if ms.Type == ebpf.Hash && ms.Flags&unix.BPF_F_NO_PREALLOC != 0 {
			ms.Flags &^= unix.BPF_F_NO_PREALLOC
			names = append(names, fmt.Sprintf("%s (%d entries)", name, ms.MaxEntries))
		}
	}
	sort.Strings(names)
	log.Infof("Kernel %s: BPF perf_event programs can use hash maps allocated on demand from 6.1 on; "+
		"preallocating %s", KernelRelease(), strings.Join(names, ", "))
}

// MinKernel is the oldest kernel release supported: the BPF ring buffer
// (5.8), BTF and CO-RE, and 5.10 is the oldest long-term release our kernel
// matrix runs.
const MinKernel = "5.10"

// CheckKernelVersion refuses a kernel release older than MinKernel. A
// release that does not parse passes: loading reports what is missing.
func CheckKernelVersion(release string) error {
	v, err := parseRelease(release)
	if err != nil || !olderThan(v, MinKernel) {
		return nil
	}
	return fmt.Errorf("kernel %s is older than %s, the oldest ebpf-profiler supports "+
		"(BPF ring buffer, BTF): upgrade the kernel", release, MinKernel)
}

// KernelAtLeast reports whether a kernel release ("6.1.0-18-amd64") is at
// least version ("6.1"); an unparsable release is not.
func KernelAtLeast(release, version string) bool {
	v, err := parseRelease(release)
	return err == nil && !olderThan(v, version)
}

// olderThan reports whether major.minor v is older than version, a
// constant "major.minor".
func olderThan(v [2]int, version string) bool {
	w, err := parseRelease(version)
	if err != nil {
		panic(err) // a constant of ours
	}
	return v[0] < w[0] || (v[0] == w[0] && v[1] < w[1])
}

// parseRelease returns the major and minor version of a kernel release.
func parseRelease(release string) ([2]int, error) {
	var v [2]int
	if _, err := fmt.Sscanf(release, "%d.%d", &v[0], &v[1]); err != nil {
		return v, fmt.Errorf("kernel release %q: %w", release, err)
	}
	return v, nil
}

const onlineCPUsPath = "/sys/devices/system/cpu/online"

func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile(onlineCPUsPath)
	if err != nil {
		return nil, fmt.Errorf("listing online CPUs: %w", err)
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", onlineCPUsPath, err)
	}
	return cpus, nil
}

// parseCPUList parses the kernel's cpu list format ("0-3,5,7-8").
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad cpu %q", part)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil || last < first {
				return nil, fmt.Errorf("bad cpu range %q", part)
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("no CPUs")
	}
	return cpus, nil
}

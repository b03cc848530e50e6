// Command vminit is PID 1 of a kernel-matrix VM (see utils/kernelmatrix).
// It mounts the file systems the profiler uses, runs the command in
// /vmtest.args (one argument per line, with -test.run= and the kernel
// command line's vmtest.run added when it has one) with the environment
// in /vmtest.env, prints one "kernel-matrix init: exit=..." line for the
// runner and powers the VM off.
//
// The tests run as a child, not in this process, because cilium/ebpf probes
// the kernel in package initialisers: before /proc was mounted, that probe
// fails and its failure is cached for the life of the process.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	for _, m := range []struct{ fstype, dir string }{
		{"proc", "/proc"},
		{"sysfs", "/sys"},
		{"devtmpfs", "/dev"},
		{"tmpfs", "/tmp"},
		{"bpf", "/sys/fs/bpf"},
		{"tracefs", "/sys/kernel/tracing"},
		{"debugfs", "/sys/kernel/debug"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			fmt.Printf("kernel-matrix init: %v\n", err)
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			fmt.Printf("kernel-matrix init: mounting %s on %s: %v\n", m.fstype, m.dir, err)
		}
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	unlimited := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unlimited); err != nil {
		fmt.Printf("kernel-matrix init: raising RLIMIT_MEMLOCK: %v\n", err)
	}

	var uts unix.Utsname
	_ = unix.Uname(&uts)
	fmt.Printf("kernel-matrix init: kernel=%s machine=%s cpus=%d uptime=%s\n",
		unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Machine[:]), runtime.NumCPU(), uptime())

	start := time.Now()
	code := run()
	fmt.Printf("kernel-matrix init: exit=%d test_wall=%.1fs uptime=%s\n", code, time.Since(start).Seconds(), uptime())
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Printf("kernel-matrix init: power off: %v\n", err)
	}
	// PID 1 must not exit (the kernel would panic); the runner's timeout
	// ends a VM that did not power off.
	select {}
}

// run runs the test command and returns its exit code (-1 when it could
// not start or was killed).
func run() int {
	args, err := lines("/vmtest.args")
	if err == nil && len(args) == 0 {
		err = errors.New("/vmtest.args is empty")
	}
	if err != nil {
		fmt.Printf("kernel-matrix init: %v\n", err)
		return -1
	}
	if run := cmdlineParam("vmtest.run"); run != "" {
		args = append(args, "-test.run="+run)
	}
	env, err := lines("/vmtest.env")
	if err != nil {
		fmt.Printf("kernel-matrix init: %v\n", err)
		return -1
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Dir = "/tmp"
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		fmt.Printf("kernel-matrix init: %s: %v\n", args[0], err)
		return exit.ExitCode()
	default:
		fmt.Printf("kernel-matrix init: %v\n", err)
		return -1
	}
}

// lines reads a file's non-empty lines.
func lines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

// uptime is the guest's uptime in seconds, as the kernel counts it.
func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0] + "s"
	}
	return "?"
}

// cmdlineParam returns the value of name=value on the kernel's command
// line ("" without one).
func cmdlineParam(name string) string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		fmt.Printf("kernel-matrix init: %v\n", err)
		return ""
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

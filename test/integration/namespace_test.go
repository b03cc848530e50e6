package integration

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// nsInitEnv marks the test binary started as the first process of a new
// pid and mount namespace (namespacedCommand). The VMs have no shell and
// no unshare(1), so the test binary sets the namespace up itself.
const nsInitEnv = "EBPF_PROFILER_TEST_NS_INIT"

func TestMain(m *testing.M) {
	if os.Getenv(nsInitEnv) != "" {
		err := namespaceInit(os.Args[1:])
		fmt.Fprintf(os.Stderr, "namespace init %q: %v\n", os.Args[1:], err)
		os.Exit(127)
	}
	os.Exit(m.Run())
}

// namespacedCommand is a command that runs argv as pid 1 of a pid
// namespace of its own, in a mount namespace of its own where a tmpfs
// hides /tmp (what was there stays reachable under /mnt) and /proc is
// the new pid namespace's, as unshare --mount --pid --fork --mount-proc
// and two mounts would.
func namespacedCommand(argv ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, argv...)
	cmd.Env = append(os.Environ(), nsInitEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	return cmd, nil
}

// namespaceInit mounts what namespacedCommand promises and executes argv
// in place of the test binary, which stays pid 1.
func namespaceInit(argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("no command")
	}
	// Private first: the host's / is often shared (systemd), and the
	// mounts below must not reach the host's namespace.
	mounts := []struct {
		source, target, fstype string
		flags                  uintptr
	}{
		{"", "/", "", syscall.MS_REC | syscall.MS_PRIVATE},
		{"/tmp", "/mnt", "", syscall.MS_BIND | syscall.MS_REC},
		{"tmpfs", "/tmp", "tmpfs", 0},
		{"proc", "/proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC},
	}
	if err := os.MkdirAll("/mnt", 0o755); err != nil {
		return err
	}
	for _, m := range mounts {
		if err := syscall.Mount(m.source, m.target, m.fstype, m.flags, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.source, m.target, err)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, nsInitEnv+"=") })
	return syscall.Exec(path, argv, env)
}

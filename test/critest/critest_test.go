package critest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRunPod starts a containerd, runs a pod whose container sleeps, and
// checks that its process runs in the cgroup the kubelet would give it.
func TestRunPod(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (containerd)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "pause.c")
	if err := os.WriteFile(src, []byte("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pause")
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pause, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	c := Start(t, pause)
	c.Import(t, "hostprof.test/sleeper:1", Image{"/sleeper": pause}, []string{"/sleeper"})
	id := c.Run(t, Pod{Name: "p1", Namespace: "ns1", UID: "1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b", ContainerName: "c1",
		Image: "hostprof.test/sleeper:1"})
	pid := c.PID(t, id)
	cg, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("container %s, pid %d, cgroup:\n%s", id, pid, cg)
	if want := "/kubepods/besteffort/pod1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b/" + id + "\n"; !strings.Contains(string(cg), want) {
		t.Errorf("the container's cgroup is not %s", want)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

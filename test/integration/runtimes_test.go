package integration

import (
	"os/exec"
	"testing"
	"time"
)

// bpfEntries is what the BPF maps hold for one process: its runtime
// configurations and its mapping trie entries.
type bpfEntries struct{ configs, mappings int }

func (s *session) bpfEntries(t *testing.T, pid int) bpfEntries {
	t.Helper()
	configs, err := s.tr.RuntimeConfigs()
	if err != nil {
		t.Fatal(err)
	}
	mappings, err := s.tr.PidMappingPIDs()
	if err != nil {
		t.Fatal(err)
	}
	return bpfEntries{configs[uint32(pid)], mappings[uint32(pid)]}
}

// waitEntries polls until ok accepts the process's BPF entries (the process
// manager writes them asynchronously) or fails after a while.
func (s *session) waitEntries(t *testing.T, pid int, what string, ok func(bpfEntries) bool) bpfEntries {
	t.Helper()
	var e bpfEntries
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if e = s.bpfEntries(t, pid); ok(e) {
			return e
		}
	}
	t.Fatalf("process %d: BPF entries %+v, want %s", pid, e, what)
	return e
}

// TestRuntimeDetachFreesEntries: a runtime's per-process BPF entries (its
// configuration in runtime_procs, its claimed code in pid_mappings) are
// there while the process runs the runtime and gone after it exits or
// execs something else; so are the process manager's.
func TestRuntimeDetachFreesEntries(t *testing.T) {
	requireRoot(t)
	py := pythonInterpreters(t)[0]
	s := startSession(t, testHz)
	before := s.pm.Stats().RuntimeProcesses["cpython"]

	// CPython for 1.5 s, then exec: the pid stays, the runtime goes.
	script := `import os, time
def spin():
    t = time.time() + 1.5
    while time.time() < t:
        pass
spin()
os.execv("/bin/sleep", ["sleep", "1.5"])`
	cmd := exec.Command(py.path, "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	running := s.waitEntries(t, pid, "a CPython configuration", func(e bpfEntries) bool { return e.configs == 1 })
	if n := s.pm.Stats().RuntimeProcesses["cpython"]; n != before+1 {
		t.Errorf("CPython processes %d while it runs, want %d", n, before+1)
	}
	execed := s.waitEntries(t, pid, "no configuration after the exec", func(e bpfEntries) bool { return e.configs == 0 })
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	s.waitExited(t, pid)
	gone := s.waitEntries(t, pid, "none after the exit", func(e bpfEntries) bool { return e == bpfEntries{} })
	t.Logf("CPython process %d: %+v while it runs, %+v after its exec, %+v after its exit",
		pid, running, execed, gone)

	// A perf map's claimed JIT code: a mapping entry of the process that
	// goes with it.
	if s.pm.Stats().RuntimeProcesses["perfmap"] != 0 {
		t.Fatalf("perf map processes before the JIT workload: %v", s.pm.Stats().RuntimeProcesses)
	}
	bin := buildWorkload(t, "jitmap", "-O2")
	r := startPerfMapWorkload(t, false, bin, "1")
	for deadline := time.Now().Add(10 * time.Second); s.pm.Stats().RuntimeProcesses["perfmap"] != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the JIT workload did not attach the perf map reader: %v", s.pm.Stats().RuntimeProcesses)
		}
	}
	withMap := s.waitEntries(t, r.pid, "its mappings", func(e bpfEntries) bool { return e.mappings > 0 })
	r.wait(t)
	s.waitExited(t, r.pid)
	gone = s.waitEntries(t, r.pid, "none after the exit", func(e bpfEntries) bool { return e == bpfEntries{} })
	if n := s.pm.Stats().RuntimeProcesses["perfmap"]; n != 0 {
		t.Errorf("perf map processes after the exit: %d", n)
	}
	t.Logf("JIT process %d: %+v while it runs, %+v after its exit", r.pid, withMap, gone)
}

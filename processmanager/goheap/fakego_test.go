package goheap

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// A C program dressed as Go (testdata/fakego: Go's build information and
// the runtime's heap-profile symbols, the bucket list's head pointing at
// garbage, no pclntab) passes IsGo but is never read: its profile cannot
// be symbolized, which Collect counts as unsupported and logs once.
func TestFakeGoProgram(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fakego")
	if out, err := exec.Command("gcc", "-O1", "-no-pie", "-o", bin, "testdata/fakego/fakego.c").CombinedOutput(); err != nil {
		t.Fatalf("building fakego: %v\n%s", err, out)
	}
	pid, _ := startHeapprog(t, bin)
	r := NewReader()
	defer r.Close()
	if !r.IsGo(pid) {
		t.Fatal("IsGo: false for a program with Go's build information")
	}
	log, hook := logtest.NewNullLogger()
	target := Target{PID: libpf.PID(pid), Process: &libpf.ProcessInfo{PID: libpf.PID(pid), ExecutablePath: bin}}
	for range 2 {
		if got := r.Collect(context.Background(), []Target{target}, logrus.NewEntry(log)); len(got) != 0 {
			t.Fatalf("read %d profiles of a fake", len(got))
		}
	}
	if st := r.Stats(); st.Unsupported != 2 || st.Reads != 0 || st.Damaged != 0 || st.Errors != 0 {
		t.Errorf("stats %+v, want 2 unsupported reads", st)
	}
	if n := len(hook.AllEntries()); n != 1 {
		t.Errorf("%d log entries, want 1", n)
	} else {
		t.Logf("logged: %s: %v", hook.LastEntry().Message, hook.LastEntry().Data[logrus.ErrorKey])
	}
}

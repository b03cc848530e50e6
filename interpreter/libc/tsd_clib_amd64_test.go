//go:build linux

package libc_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/interpreter/libc/libctest"
)

// TestTSDLayoutLive checks the decoded layouts on processes of both C
// libraries with keys other than CPython's: testdata/tsd/keys.c, built
// with gcc (glibc) and, where Debian's musl-tools is installed, musl-gcc,
// binds a marker of each thread to a key of its choice; the slot the
// layout computes from the thread's fsbase must hold that thread's marker.
// glibc's key 32 is past the first block: the layout must refuse it.
func TestTSDLayoutLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ptrace of the test processes needs root")
	}
	for _, cc := range []struct {
		compiler string
		keys     []uint32
		optional bool
	}{
		{"gcc", []uint32{3, 31, 32}, false},
		{"musl-gcc", []uint32{3, 31, 100}, true},
	} {
		t.Run(cc.compiler, func(t *testing.T) {
			if _, err := exec.LookPath(cc.compiler); err != nil && cc.optional {
				t.Skipf("%s is not installed (Debian's musl-tools)", cc.compiler)
			}
			bin := filepath.Join(t.TempDir(), "keys")
			args := []string{"-O2", "-pthread", "-o", bin, filepath.Join("testdata", "tsd", "keys.c")}
			if out, err := exec.Command(cc.compiler, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s %s: %v\n%s", cc.compiler, strings.Join(args, " "), err, out)
			}
			for _, key := range cc.keys {
				t.Run(fmt.Sprint("key ", key), func(t *testing.T) { tsdCheckKeys(t, bin, key) })
			}
		})
	}
}

func tsdCheckKeys(t *testing.T, bin string, want uint32) {
	cmd := exec.Command(bin, fmt.Sprint(want))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
	t.Cleanup(func() { timer.Stop(); _ = cmd.Process.Kill(); _ = cmd.Wait() })

	var key uint32
	markers := map[int]uint64{}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "ready" {
		var tid int
		var marker uint64
		if _, err := fmt.Sscanf(lines.Text(), "thread %d 0x%x", &tid, &marker); err == nil {
			markers[tid] = marker
		} else if _, err := fmt.Sscanf(lines.Text(), "key %d", &key); err != nil {
			t.Fatalf("%s said %q", bin, lines.Text())
		}
	}
	if len(markers) != 4 || key != want {
		t.Fatalf("%s: key %d, %d threads (%v)", bin, key, len(markers), lines.Err())
	}
	pid := cmd.Process.Pid
	lib, layout := libctest.ProcessLayout(t, pid)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for tid, marker := range markers {
		tp, err := libctest.FSBase(tid)
		if err != nil {
			t.Fatalf("thread %d: %v", tid, err)
		}
		slot, err := layout.SlotAddress(mem, tp, key)
		if key >= layout.MaxFastKey {
			if err == nil {
				t.Errorf("%s: key %d is past the layout's %d keys, but SlotAddress gave %#x", lib, key, layout.MaxFastKey, slot)
			}
			continue
		}
		if err != nil {
			t.Fatalf("thread %d: %v", tid, err)
		}
		got, err := libc.ReadPointer(mem, slot)
		if err != nil || got != marker {
			t.Errorf("%s, thread %d (fsbase %#x): key %d's slot %#x holds %#x (%v), want %#x", lib, tid, tp, key, slot, got, err, marker)
			continue
		}
		t.Logf("%s, thread %d: fsbase %#x, key %d's slot %#x holds the marker %#x", lib, tid, tp, key, slot, marker)
	}
}

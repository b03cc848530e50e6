package goheap

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// stackKey is a sample's frame addresses: equal for equal stacks.
func stackKey(tr *libpf.Trace) string {
	var k []byte
	for _, f := range tr.Frames {
		k = fmt.Appendf(k, "%x,", f.Address)
	}
	return string(k)
}

// TestCollect reads a running heapprog (every allocation sampled) through
// Collect: one heap profile of the target's process whose frames are
// native frames of the target's executable mapping, with the counts of
// retainLeaf's bucket the program's own runtime.MemProfile reported, and
// trace hashes that are equal exactly for equal stacks, in one read and
// the next.
func TestCollect(t *testing.T) {
	bin := buildHeapprog(t, runtime.GOARCH)
	pid, lines := startHeapprog(t, bin, "all")
	var wantObjects, wantInUse, wantAlloc int64
	if _, err := fmt.Sscanf(lines[0], "want %d %d %d", &wantObjects, &wantInUse, &wantAlloc); err != nil {
		t.Fatalf("heapprog printed %q", lines)
	}
	r := NewReader()
	defer r.Close()
	log, hook := logtest.NewNullLogger()
	proc := &libpf.ProcessInfo{PID: libpf.PID(pid), ExecutableName: "heapprog", ExecutablePath: bin}
	exe := &libpf.Mapping{FileID: libpf.FileID{0x6e, 0x01}, Path: bin, Start: 0x400000, End: 0x800000}
	target := Target{PID: libpf.PID(pid), Process: proc, Executable: exe}

	before := time.Now()
	hps := r.Collect(context.Background(), []Target{target}, logrus.NewEntry(log))
	if len(hps) != 1 {
		t.Fatalf("Collect returned %d heap profiles, want 1", len(hps))
	}
	hp := hps[0]
	if hp.Process != proc || hp.Period != 1 || hp.Time.Before(before) || hp.Time.After(time.Now()) {
		t.Errorf("profile of %p, period %d, at %v; want the target's process %p, period 1 (heapprog all), read after %v",
			hp.Process, hp.Period, hp.Time, proc, before)
	}
	st := r.Stats()
	if st.Reads != 1 || st.Sites != uint64(len(hp.Samples)) || st.Unsupported+st.Vanished+st.Errors+st.Damaged+st.ProfilingOff != 0 {
		t.Errorf("stats %+v, want one read of %d sites and no failure", st, len(hp.Samples))
	}
	if n := len(hook.AllEntries()); n != 0 {
		t.Errorf("a good read logged %d entries", n)
	}

	hashes := map[string]libpf.TraceHash{}
	var retained bool
	// churnLeaf's allocations (2048 of 32 KiB, all sampled) are garbage;
	// the runtime now and then charges it a small allocation of its own.
	var churned [4]int64
	for i, s := range hp.Samples {
		tr := hp.Trace(i)
		if len(tr.Frames) == 0 {
			t.Fatal("sample without frames")
		}
		for _, f := range tr.Frames {
			if f.Kind != libpf.FrameNative || f.Mapping != exe {
				t.Fatalf("frame %+v: want a native frame of the target's executable mapping", f)
			}
		}
		h := tr.Hash
		if h == (libpf.TraceHash{}) {
			t.Errorf("stack %s has a zero hash", stackKey(tr))
		}
		k := stackKey(tr)
		if old, ok := hashes[k]; ok && old != h {
			t.Errorf("equal stacks %s hash to %x and %x", k, old, h)
		}
		hashes[k] = h
		if tr.Frames[0].FunctionName == "main.churnLeaf" {
			for i, v := range []int64{s.AllocObjects, s.AllocBytes, s.InUseObjects, s.InUseBytes} {
				churned[i] += v
			}
		}
		if tr.Frames[0].FunctionName == "main.retainLeaf" && s.AllocBytes >= 200<<16 {
			retained = true
			if s.InUseObjects != wantObjects || s.InUseBytes != wantInUse || s.AllocBytes != wantAlloc {
				t.Errorf("retainLeaf's site: %d objects, %d bytes in use, %d allocated; runtime.MemProfile said %d, %d, %d",
					s.InUseObjects, s.InUseBytes, s.AllocBytes, wantObjects, wantInUse, wantAlloc)
			}
		}
	}
	if !retained {
		t.Errorf("no site with leaf main.retainLeaf holding its 200 allocations of 64 KiB among %d", len(hp.Samples))
	}
	t.Logf("%d sites, %d distinct stacks; churnLeaf's %v", len(hp.Samples), len(hashes), churned)
	if churned[0] < 2048 || churned[1] < 64<<20 || churned[1] > 65<<20 || churned[3] > 1<<20 {
		t.Errorf("churnLeaf's sites: %d objects, %d bytes allocated, %d bytes in use; want 2048, 64 MiB, (almost) none",
			churned[0], churned[1], churned[3])
	}
	seen := map[libpf.TraceHash]string{}
	for k, h := range hashes {
		if other, ok := seen[h]; ok {
			t.Errorf("different stacks %s and %s hash to %x", k, other, h)
		}
		seen[h] = k
	}

	// The next read finds the same stacks and hashes them alike.
	again := r.Collect(context.Background(), []Target{target}, logrus.NewEntry(log))
	if len(again) != 1 {
		t.Fatalf("second Collect returned %d heap profiles", len(again))
	}
	for i := range again[0].Samples {
		tr := again[0].Trace(i)
		if h, ok := hashes[stackKey(tr)]; ok && h != tr.Hash {
			t.Errorf("stack %s hashed to %x, then %x", stackKey(tr), h, tr.Hash)
		}
	}
}

// TestCollectFailures: a process that is gone counts as vanished, without
// a log; a program that is not Go counts as unsupported and is logged
// once for its executable. Neither gives a profile.
func TestCollectFailures(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })

	tests := []struct {
		name     string
		pid      int
		path     string
		want     Stats
		wantLogs int
	}{
		{"exited", gone.Process.Pid, gone.Path, Stats{Vanished: 2}, 0},
		{"not Go", sleep.Process.Pid, sleep.Path, Stats{Unsupported: 2}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader()
			defer r.Close()
			log, hook := logtest.NewNullLogger()
			target := Target{PID: libpf.PID(tt.pid),
				Process: &libpf.ProcessInfo{PID: libpf.PID(tt.pid), ExecutablePath: tt.path}}
			for range 2 {
				if got := r.Collect(context.Background(), []Target{target}, logrus.NewEntry(log)); len(got) != 0 {
					t.Fatalf("Collect returned %d heap profiles", len(got))
				}
			}
			st := r.Stats()
			st.ReadTime = 0
			if st != tt.want {
				t.Errorf("stats %+v, want %+v", st, tt.want)
			}
			if n := len(hook.AllEntries()); n != tt.wantLogs {
				t.Errorf("%d log entries, want %d", n, tt.wantLogs)
			}
		})
	}
}

func TestIsGo(t *testing.T) {
	heapprog, _ := startHeapprog(t, buildHeapprog(t, runtime.GOARCH))
	sleep := exec.Command("/bin/sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	r := NewReader()
	defer r.Close()
	// Twice: the second answer is the remembered one.
	for range 2 {
		got := []bool{r.IsGo(heapprog), r.IsGo(sleep.Process.Pid)}
		if !slices.Equal(got, []bool{true, false}) {
			t.Errorf("IsGo(heapprog), IsGo(sleep) = %v, want [true false]", got)
		}
	}
}

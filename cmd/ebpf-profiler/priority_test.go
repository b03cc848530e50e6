package main

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// threadNices returns the nice value of each of the process's threads.
func threadNices(t *testing.T) map[int]int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, e := range tasks {
		tid, _ := strconv.Atoi(e.Name())
		if n, err := niceOf(tid); err == nil {
			out[tid] = n
		}
	}
	return out
}

// TestStartupBoost: the boost raises every thread, and ending it returns
// them all to the default priority; a process started niced is left alone.
func TestStartupBoost(t *testing.T) {
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, -1); errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		t.Skip("needs root or CAP_SYS_NICE")
	}
	t.Cleanup(func() { _ = setNice(0) })
	if err := setNice(0); err != nil {
		t.Fatal(err)
	}
	b := boostPriority(-5)
	if b == nil {
		t.Fatal("no boost at the default priority")
	}
	for tid, n := range threadNices(t) {
		if n != -5 {
			t.Errorf("thread %d at nice %d while boosted, want -5", tid, n)
		}
	}
	calls := 0
	if !waitStartup(context.Background(), func() bool { calls++; return calls > 1 }) || calls != 2 {
		t.Errorf("waitStartup: done called %d times", calls)
	}
	b.end()
	for tid, n := range threadNices(t) {
		if n != 0 {
			t.Errorf("thread %d at nice %d after the boost, want 0", tid, n)
		}
	}

	if err := setNice(3); err != nil {
		t.Fatal(err)
	}
	if b := boostPriority(-5); b != nil {
		t.Error("a process started niced was boosted")
	}
	if n, _ := niceOf(0); n != 3 {
		t.Errorf("nice %d, want 3 left alone", n)
	}
	if b := boostPriority(0); b != nil {
		t.Error("boosted with -startup-nice=0")
	}
}

//go:build linux

package python

import (
	"bufio"
	"debug/elf"
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

// tsdThreadsScript starts three threads that each note their kernel TID and
// threading.get_ident() (pthread_self(), what PyThreadState.thread_id
// holds), prints them with the main thread's and sleeps. Before 3.8 there
// is no threading.get_native_id: gettid is syscall 186 on x86_64.
const tsdThreadsScript = `
import ctypes, sys, threading, time
def tid():
    if hasattr(threading, 'get_native_id'):
        return threading.get_native_id()
    return ctypes.CDLL(None).syscall(186)
seen = []
lock = threading.Lock()
ready = threading.Barrier(4)
def work():
    with lock:
        seen.append((tid(), threading.get_ident()))
    ready.wait()
    time.sleep(120)
for _ in range(3):
    threading.Thread(target=work, daemon=True).start()
ready.wait()
seen.append((tid(), threading.get_ident()))
for t, ident in seen:
    print('thread %d %d' % (t, ident))
print('ready', flush=True)
time.sleep(120)
`

// tsdThread is a thread of a test process: its kernel TID and its
// pthread_self().
type tsdThread struct {
	tid   int
	ident uint64
}

// TestThreadStateFromTSD finds, in a running process of every pyenv
// CPython, the PyThreadState of each thread the way the BPF unwinder will:
// the thread pointer (fsbase, read here with ptrace), the C library's
// TSD layout decoded from its pthread_getspecific and the interpreter's
// key give the slot; the thread state there must be that thread's own
// (thread_id, and native_thread_id from 3.11).
func TestThreadStateFromTSD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("ptrace of the test processes needs root")
	}
	pythons, _ := filepath.Glob("/root/.pyenv/versions/3.*/bin/python3")
	if len(pythons) == 0 {
		t.Fatal("no pyenv CPython 3 in /root/.pyenv/versions")
	}
	for _, python := range pythons {
		name := filepath.Base(filepath.Dir(filepath.Dir(python)))
		t.Run(name, func(t *testing.T) { tsdCheckProcess(t, python) })
	}
}

func tsdCheckProcess(t *testing.T, python string) {
	pid, threads := tsdStartThreads(t, python)
	libpython, pyBias, err := libctest.Mapped(pid, func(base string) bool {
		return strings.HasPrefix(base, "libpython3") && strings.Contains(base, ".so")
	})
	if err != nil {
		t.Fatal(err)
	}
	in, off, loc := tsdInterpreter(t, libpython)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	key, err := ThreadStateKey(loc, mem, pyBias)
	if err != nil {
		t.Fatalf("%s (bias %#x): %v", libpython, pyBias, err)
	}
	libcPath, layout := libctest.ProcessLayout(t, pid)
	t.Logf("CPython %v (%s): key %d; %s: %+v", in.Version.MajorMinor(), libpython, key, libcPath, layout)

	for _, th := range threads {
		tp, err := libctest.FSBase(th.tid)
		if err != nil {
			t.Errorf("thread %d: %v", th.tid, err)
			continue
		}
		slot, err := layout.SlotAddress(mem, tp, key)
		if err != nil {
			t.Errorf("thread %d (fsbase %#x): %v", th.tid, tp, err)
			continue
		}
		tstate, err := libc.ReadPointer(mem, slot)
		if err != nil || tstate == 0 {
			t.Errorf("thread %d: thread state pointer at %#x: %#x, %v", th.tid, slot, tstate, err)
			continue
		}
		ident, err := libc.ReadPointer(mem, tstate+uint64(off.ThreadState.ThreadID))
		if err != nil || ident != th.ident {
			t.Errorf("thread %d: the thread state at %#x has thread_id %#x (%v), want %#x", th.tid, tstate, ident, err, th.ident)
			continue
		}
		msg := fmt.Sprintf("thread %d: fsbase %#x, slot %#x, PyThreadState %#x, thread_id %#x", th.tid, tp, slot, tstate, ident)
		if off.ThreadState.NativeThreadID != NoField {
			native, err := libc.ReadPointer(mem, tstate+uint64(off.ThreadState.NativeThreadID))
			if err != nil || native != uint64(th.tid) {
				t.Errorf("thread %d: the thread state at %#x has native_thread_id %d (%v)", th.tid, tstate, native, err)
				continue
			}
			msg += fmt.Sprintf(", native_thread_id %d", native)
		}
		t.Log(msg)
	}
}

// tsdStartThreads runs the script under python until its threads are up;
// the process is killed when the test ends, or after a minute.
func tsdStartThreads(t *testing.T, python string) (int, []tsdThread) {
	t.Helper()
	cmd := exec.Command(python, "-c", tsdThreadsScript)
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
	var threads []tsdThread
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "ready" {
		var th tsdThread
		if _, err := fmt.Sscanf(lines.Text(), "thread %d %d", &th.tid, &th.ident); err != nil {
			t.Fatalf("%s said %q: %v", python, lines.Text(), err)
		}
		threads = append(threads, th)
	}
	if len(threads) != 4 {
		t.Fatalf("%s reported %d threads, want 4 (%v)", python, len(threads), lines.Err())
	}
	return cmd.Process.Pid, threads
}

// tsdInterpreter detects the interpreter in the file at path and finds its
// key.
func tsdInterpreter(t *testing.T, path string) (*Interpreter, *Offsets, ThreadStateKeyLocation) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := Detect(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	off, err := OffsetsFor(in.Version)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := FindThreadStateKey(f, in, off)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return in, off, loc
}

//go:build linux

package python

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	libpython, pyBias, err := tsdMapped(pid, func(base string) bool {
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
	libc, layout := tsdProcessLayout(t, pid)
	t.Logf("CPython %v (%s): key %d; %s: %+v", in.Version, libpython, key, libc, layout)

	for _, th := range threads {
		tp, err := tsdFSBase(th.tid)
		if err != nil {
			t.Errorf("thread %d: %v", th.tid, err)
			continue
		}
		slot, err := layout.SlotAddress(mem, tp, key)
		if err != nil {
			t.Errorf("thread %d (fsbase %#x): %v", th.tid, tp, err)
			continue
		}
		tstate, err := tsdReadPointer(mem, slot)
		if err != nil || tstate == 0 {
			t.Errorf("thread %d: thread state pointer at %#x: %#x, %v", th.tid, slot, tstate, err)
			continue
		}
		ident, err := tsdReadPointer(mem, tstate+uint64(off.ThreadState.ThreadID))
		if err != nil || ident != th.ident {
			t.Errorf("thread %d: the thread state at %#x has thread_id %#x (%v), want %#x", th.tid, tstate, ident, err, th.ident)
			continue
		}
		msg := fmt.Sprintf("thread %d: fsbase %#x, slot %#x, PyThreadState %#x, thread_id %#x", th.tid, tp, slot, tstate, ident)
		if off.ThreadState.NativeThreadID != NoField {
			native, err := tsdReadPointer(mem, tstate+uint64(off.ThreadState.NativeThreadID))
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

// tsdProcessLayout decodes the TSD layout of the C library pid maps:
// libpthread.so.0's pthread_getspecific before glibc 2.34, libc's after.
func tsdProcessLayout(t *testing.T, pid int) (string, TSDLayout) {
	t.Helper()
	for _, prefix := range []string{"libc.so", "libc-", "libpthread", "ld-musl"} {
		path, _, err := tsdMapped(pid, func(base string) bool { return strings.HasPrefix(base, prefix) })
		if err != nil {
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		layout, err := TSDLayoutFromLibc(f)
		f.Close()
		if errors.Is(err, ErrNoGetspecific) {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return path, layout
	}
	t.Fatalf("pid %d maps no C library with pthread_getspecific", pid)
	return "", TSDLayout{}
}

// tsdMapped finds the first file pid maps whose base name matches, and its
// load bias.
func tsdMapped(pid int, match func(base string) bool) (string, uint64, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return "", 0, err
	}
	for line := range strings.SplitSeq(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[2] != "00000000" || !strings.HasPrefix(f[5], "/") || !match(filepath.Base(f[5])) {
			continue
		}
		startHex, _, _ := strings.Cut(f[0], "-")
		start, err := strconv.ParseUint(startHex, 16, 64)
		if err != nil {
			return "", 0, err
		}
		ef, err := elf.Open(f[5])
		if err != nil {
			return "", 0, err
		}
		defer ef.Close()
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && p.Off == 0 {
				return f[5], start - p.Vaddr, nil
			}
		}
		return "", 0, fmt.Errorf("%s: no PT_LOAD at offset 0", f[5])
	}
	return "", 0, fmt.Errorf("pid %d maps no such file", pid)
}

// tsdFSBase reads the fsbase of thread tid: seize it, interrupt it, read
// its registers, detach. The tracer is an OS thread of its own that exits
// with the goroutine, which detaches the tracee even where PTRACE_DETACH
// failed: no thread stays traced or stopped.
func tsdFSBase(tid int) (uint64, error) {
	type result struct {
		fs  uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fs, err := tsdPtraceFSBase(tid)
		done <- result{fs, err}
	}()
	r := <-done
	return r.fs, r.err
}

func tsdPtraceFSBase(tid int) (fs uint64, err error) {
	if err := unix.PtraceSeize(tid); err != nil {
		return 0, fmt.Errorf("PTRACE_SEIZE: %w", err)
	}
	defer func() {
		if derr := unix.PtraceDetach(tid); derr != nil && err == nil {
			err = fmt.Errorf("PTRACE_DETACH: %w", derr)
		}
	}()
	if err := unix.PtraceInterrupt(tid); err != nil {
		return 0, fmt.Errorf("PTRACE_INTERRUPT: %w", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		return 0, fmt.Errorf("waiting for the stop: %w", err)
	}
	if !ws.Stopped() {
		return 0, fmt.Errorf("thread did not stop: status %#x", ws)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		return 0, fmt.Errorf("PTRACE_GETREGS: %w", err)
	}
	return regs.Fs_base, nil
}

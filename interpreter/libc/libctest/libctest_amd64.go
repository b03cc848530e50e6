// Package libctest helps tests check thread-specific data layouts against
// live processes: which C library a process maps, and a thread's fsbase.
package libctest

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/interpreter/libc"
)

// ProcessLayout decodes the TSD layout of the C library pid maps:
// libpthread.so.0's pthread_getspecific before glibc 2.34, libc's after.
func ProcessLayout(t testing.TB, pid int) (string, libc.TSDLayout) {
	t.Helper()
	for _, prefix := range []string{"libc.so", "libc-", "libpthread", "ld-musl"} {
		path, _, err := Mapped(pid, func(base string) bool { return strings.HasPrefix(base, prefix) })
		if err != nil {
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		layout, err := libc.TSDLayoutFromLibc(f)
		f.Close()
		if errors.Is(err, libc.ErrNoGetspecific) {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return path, layout
	}
	t.Fatalf("pid %d maps no C library with pthread_getspecific", pid)
	return "", libc.TSDLayout{}
}

// Mapped finds the first file pid maps whose base name matches, and its
// load bias.
func Mapped(pid int, match func(base string) bool) (string, uint64, error) {
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

// FSBase reads the fsbase of thread tid: seize it, interrupt it, read
// its registers, detach. The tracer is an OS thread of its own that exits
// with the goroutine, which detaches the tracee even where PTRACE_DETACH
// failed: no thread stays traced or stopped.
func FSBase(tid int) (uint64, error) {
	type result struct {
		fs  uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fs, err := ptraceFSBase(tid)
		done <- result{fs, err}
	}()
	r := <-done
	return r.fs, r.err
}

func ptraceFSBase(tid int) (fs uint64, err error) {
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

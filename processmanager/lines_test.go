package processmanager

import (
	"debug/elf"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// linesTestTarget is a function whose frames the test below symbolizes.
//
//go:noinline
func linesTestTarget() int { return 42 }

// ownText is the mapping of this test binary's code, as a process that
// runs it would have it, and the address and line of linesTestTarget.
func ownText(t *testing.T) (mp fakeMapping, pc uint64, fn *runtime.Func, file string, line int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	var text *elf.Prog
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	if text == nil || ef.Type != elf.ET_EXEC {
		t.Skip("the test binary is not a position-dependent executable") // go test builds one on linux/amd64
	}
	page := uint64(os.Getpagesize())
	mp = fakeMapping{start: text.Vaddr &^ (page - 1), end: (text.Vaddr + text.Memsz + page - 1) &^ (page - 1),
		offset: text.Off &^ (page - 1), file: exe}
	pc = uint64(reflect.ValueOf(linesTestTarget).Pointer())
	fn = runtime.FuncForPC(uintptr(pc))
	file, line = fn.FileLine(uintptr(pc))
	return mp, pc, fn, file, line
}

// TestLinesArriveOnceOpened: a trace converted while its file's lines are
// being read is converted again as soon as they are read, not after a
// fixed delay (the clock does not move here).
func TestLinesArriveOnceOpened(t *testing.T) {
	text, pc, fn, file, line := ownText(t)
	fs := newFakeProcFS(t)
	fs.setProcess(100, 1, text.file, text)
	h, rep := newLinesHandler(t, fs)
	clock := h.m.now()
	h.m.now = func() time.Time { return clock }

	raw := &support.Trace{PID: 100, TID: 100, Hash: 0x11e5, KTime: monotonicNow(t),
		Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: pc}}}
	h.handleNow(raw)
	if f := rep.last(t).trace.Frames[0]; f.SourceLine != 0 {
		t.Fatalf("a line before the file was read: %+v", f)
	}
	h.m.lines.wait()
	h.handleNow(raw)
	f := rep.last(t).trace.Frames[0]
	if f.FunctionName != fn.Name() || !strings.HasSuffix(f.SourceFile, "lines_test.go") || f.SourceLine != uint32(line) {
		t.Errorf("frame after the file was read: %s %s:%d, want %s %s:%d", f.FunctionName, f.SourceFile, f.SourceLine, fn.Name(), file, line)
	}
	h.handleNow(raw)
	if s := h.Stats(); s.TraceCacheMisses != 2 || s.TraceCacheHits != 1 {
		t.Errorf("%d conversions and %d cache hits, want 2 and 1", s.TraceCacheMisses, s.TraceCacheHits)
	}
}

// TestLinesAfterProcessExited: a file first seen in a trace of a process
// that exited before its file could be opened gets its lines through the
// next process that maps it.
func TestLinesAfterProcessExited(t *testing.T) {
	text, pc, _, _, line := ownText(t)
	fs := newFakeProcFS(t)
	lib := newFakeLib(t, fs)
	libMapping, fnAbs := lib.mapAt(0x7f0000000000)
	fs.setProcess(100, 1, text.file, text, libMapping)
	h, rep := newLinesHandler(t, fs)

	// The mappings are read at the first trace; the process exits before
	// the second, the first in the test binary's code.
	h.handleNow(&support.Trace{PID: 100, TID: 100, Hash: 1, KTime: monotonicNow(t),
		Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: fnAbs}}})
	fs.removeProcess(100)
	inText := []support.Frame{{Kind: libpf.FrameNative, Addr: pc}}
	h.handleNow(&support.Trace{PID: 100, TID: 100, Hash: 2, KTime: monotonicNow(t), Frames: inText})
	if f := rep.last(t).trace.Frames[0]; f.SourceLine != 0 || f.Mapping == nil {
		t.Fatalf("frame of the exited process: %+v", f)
	}
	h.m.lines.wait() // its file's open failed: the process is gone

	fs.setProcess(200, 2, text.file, text)
	raw := &support.Trace{PID: 200, TID: 200, Hash: 3, KTime: monotonicNow(t), Frames: inText}
	h.handleNow(raw)
	h.m.lines.wait()
	h.handleNow(raw)
	if f := rep.last(t).trace.Frames[0]; f.SourceLine != uint32(line) {
		t.Errorf("line %d in the next process, want %d (%+v)", f.SourceLine, line, h.Stats().Native)
	}
}

// TestDropMappedDebugInfo: the pages a lookup touched in the mapped debug
// information leave the resident set when dropped, and lookups go on.
func TestDropMappedDebugInfo(t *testing.T) {
	text, pc, fn, _, line := ownText(t)
	fs := newFakeProcFS(t)
	fs.setProcess(100, 1, text.file, text)
	h, rep := newLinesHandler(t, fs)
	st, err := os.Stat(text.file)
	if err != nil {
		t.Fatal(err)
	}
	// The debug information's mappings of the test binary (all of the
	// file), by address: resident KiB.
	wholeMappings := func() map[string]int {
		b, err := os.ReadFile("/proc/self/smaps")
		if err != nil {
			t.Fatal(err)
		}
		page := int64(os.Getpagesize())
		out := map[string]int{}
		whole := ""
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			lo, hi, header := strings.Cut(f[0], "-")
			switch {
			case header && len(f) >= 5: // start-end perms offset dev inode [path]
				start, _ := strconv.ParseUint(lo, 16, 64)
				end, _ := strconv.ParseUint(hi, 16, 64)
				whole = ""
				if len(f) == 6 && f[5] == text.file && f[2] == "00000000" && int64(end-start) == (st.Size()+page-1)/page*page {
					whole = f[0]
					out[whole] = 0
				}
			case len(f) == 3 && f[0] == "Rss:" && whole != "":
				n, _ := strconv.Atoi(f[1])
				out[whole] += n
			}
		}
		return out
	}
	// Earlier tests' handlers may still map the file.
	before := wholeMappings()
	resident := func() (kib int) {
		found := false
		for m, n := range wholeMappings() {
			if _, old := before[m]; !old {
				kib += n
				found = true
			}
		}
		if !found {
			t.Fatal("no new mapping of the whole test binary")
		}
		return kib
	}
	for hash := uint64(1); hash <= 2; hash++ {
		h.handleNow(&support.Trace{PID: 100, TID: 100, Hash: 0xd0 + hash, KTime: monotonicNow(t),
			Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: pc + hash}}})
		h.m.lines.wait()
	}
	touched := resident()
	h.m.DropMappedDebugInfo()
	if after := resident(); touched == 0 || after != 0 {
		t.Errorf("resident pages of the mapped debug information: %d KiB after a lookup, %d KiB after dropping", touched, after)
	}
	h.handleNow(&support.Trace{PID: 100, TID: 100, Hash: 0xd5, KTime: monotonicNow(t),
		Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: pc}}})
	if f := rep.last(t).trace.Frames[0]; f.FunctionName != fn.Name() || f.SourceLine != uint32(line) {
		t.Errorf("frame after dropping: %s:%d, want %s:%d", f.FunctionName, f.SourceLine, fn.Name(), line)
	}
}

//go:build linux && amd64

package nativeunwind

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestGoUnwindSingleStep is the end-to-end check of the Go deltas: it
// runs the test program, attaches to its main thread with ptrace and
// single-steps the workload (calls through frames of all sizes, stack
// growth through runtime.morestack and copystack, fmt and the allocator,
// a cgo call), and at every instruction unwinds the real stack with the
// deltas the way the BPF unwinder does. Every unwind must reach a stop
// rule through Go functions; chains through the program's functions must
// be exactly its call graph; and every saved frame pointer recovered by a
// rule must equal what the caller's own CFA says its frame pointer is.
// The runtime's monitor thread is kept stopped meanwhile, so that it does
// not preempt the (slow) stepped goroutine every 10 ms.
func TestGoUnwindSingleStep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for ptrace")
	}
	set := newGoBuildSet(t)
	// External linking, PIE and cgo with this toolchain; internal linking
	// and an older runtime with Go 1.21.
	names := []string{"amd64-cgo-pie", "amd64-go1.21"}
	if testing.Short() {
		names = names[:1]
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			stepAndUnwind(t, set.path(t, name))
		})
	}
}

// progCallers are the program's functions and who may call them; the chain
// from main.work outwards is fixed.
var progCallers = map[string][]string{
	"main.leaf":                  {"main.mid"},
	"main.mid":                   {"main.top"},
	"main.top":                   {"main.work"},
	"main.grow":                  {"main.grow", "main.work"},
	"main.format":                {"main.work"},
	"main.cgoWork":               {"main.work"},
	"main.generic[go.shape.int]": {"main.leaf"},
	"main.(*counter).add":        {"main.leaf"},
	"main.(*counter).add.func1":  {"main.(*counter).add"},
	"main.work":                  {"main.main"},
	"main.main":                  {"runtime.main"},
	"runtime.main":               {"runtime.goexit"},
}

const maxSingleSteps = 300_000

type stepper struct {
	t       *testing.T
	tid     int
	mem     *os.File
	bias    uint64
	syms    *GoSymbols
	deltas  Deltas
	names   map[uint64]string
	stats   map[string]int
	inner   map[string]int // steps by innermost function
	failed  map[string]int
	covered map[uint64]bool
	pages   map[uint64][]byte // stack pages read at this step
	seized  []int             // threads ever attached to
}

func stepAndUnwind(t *testing.T, path string) {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := &stepper{t: t, names: map[uint64]string{}, stats: map[string]int{}, inner: map[string]int{}, failed: map[string]int{}, covered: map[uint64]bool{}, pages: map[uint64][]byte{}}
	if s.syms, err = ReadGoSymbols(f, nil); err != nil {
		t.Fatal(err)
	}
	if s.deltas, err = goDeltas(elfImage{f: f}); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(path, "step")
	cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	var flag uint64
	line, err := bufio.NewReader(out).ReadString('\n')
	if err == nil {
		_, err = fmt.Sscanf(line, "tid %d flag %v", &s.tid, &flag)
	}
	if err != nil {
		t.Fatalf("reading the program's first line %q: %v", line, err)
	}
	if s.mem, err = os.Open(fmt.Sprintf("/proc/%d/mem", cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	defer s.mem.Close()
	if s.bias, err = exeLoadBias(cmd.Process.Pid, path, f); err != nil {
		t.Fatal(err)
	}

	// ptrace requests must come from the thread that attached.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(s.tid); err != nil {
		t.Fatalf("PTRACE_SEIZE: %v", err)
	}
	if err := unix.PtraceInterrupt(s.tid); err != nil {
		t.Fatalf("PTRACE_INTERRUPT: %v", err)
	}
	s.wait(s.tid)
	s.seized = append(s.seized, s.tid)
	defer s.release(cmd)
	// Nothing here may hang the test: a stuck step ends with the child.
	watchdog := time.AfterFunc(3*time.Minute, func() { _ = cmd.Process.Kill() })
	defer watchdog.Stop()
	s.stopSysmon(cmd.Process.Pid)
	if _, err := unix.PtracePokeData(s.tid, uintptr(flag), []byte{1, 0, 0, 0}); err != nil {
		t.Fatalf("setting the start flag: %v", err)
	}
	s.run()
}

// release kills the child and reaps the other threads it traced: a
// traced thread's exit goes to its tracer, and the process's exit (which
// cmd.Wait reaps) only comes after that.
func (s *stepper) release(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	for _, tid := range s.seized {
		if tid != cmd.Process.Pid {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(tid, &ws, unix.WALL, nil)
		}
	}
}

func (s *stepper) wait(tid int) {
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		s.t.Fatalf("wait4: %v", err)
	}
	if ws.Exited() || ws.Signaled() {
		s.t.Fatalf("the program ended: %v", ws)
	}
}

// stopSysmon keeps the runtime's monitor thread stopped while the
// workload is stepped. Otherwise it asks the slow stepped goroutine to
// yield every 10 ms of wall time, and stepping through the scheduler
// would take most of the steps. It finds the thread by unwinding every
// thread with the deltas under test: the one in runtime.usleep called by
// runtime.sysmon, which holds no lock there.
func (s *stepper) stopSysmon(pid int) {
	t := s.t
	var seen []string
	for attempt := 0; attempt < 200; attempt++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil || tid == s.tid {
				continue
			}
			if !slices.Contains(s.seized, tid) {
				s.seized = append(s.seized, tid)
			}
			if unix.PtraceSeize(tid) != nil || unix.PtraceInterrupt(tid) != nil {
				continue
			}
			s.wait(tid)
			var regs unix.PtraceRegs
			if err := unix.PtraceGetRegs(tid, &regs); err == nil {
				clear(s.pages)
				frames, err := s.unwind(regs)
				if err == nil && len(frames) > 1 && inSysmonSleep(frames) {
					t.Logf("stopped runtime.sysmon's thread %d: %s", tid, frameChain(frames))
					return
				}
				seen = append(seen, fmt.Sprintf("%d: %s (%v)", tid, frameChain(frames), err))
			}
			if err := unix.PtraceDetach(tid); err != nil {
				t.Fatalf("PTRACE_DETACH %d: %v", tid, err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("found no thread sleeping in runtime.sysmon; last seen:\n%s", strings.Join(seen[max(len(seen)-8, 0):], "\n"))
}

// inSysmonSleep says whether a stack is runtime.sysmon sleeping, between
// rounds (usleep) or until there is work again (notetsleep on a futex).
func inSysmonSleep(frames []unwoundFrame) bool {
	for i, f := range frames {
		switch f.name {
		case "runtime.usleep", "runtime.futex", "runtime.futexsleep", "runtime.notetsleep_internal", "runtime.notetsleep":
			continue
		case "runtime.sysmon":
			return i > 0
		}
		return false
	}
	return false
}

func (s *stepper) run() {
	t := s.t
	deadline := time.Now().Add(2 * time.Minute)
	steps := 0
	for ; steps < maxSingleSteps && time.Now().Before(deadline); steps++ {
		var regs unix.PtraceRegs
		if err := unix.PtraceGetRegs(s.tid, &regs); err != nil {
			t.Fatalf("PTRACE_GETREGS: %v", err)
		}
		if s.name(regs.Rip-s.bias) == "main.done" {
			break
		}
		s.check(regs)
		if err := unix.PtraceSingleStep(s.tid); err != nil {
			t.Fatalf("PTRACE_SINGLESTEP: %v", err)
		}
		s.wait(s.tid)
	}
	if steps == maxSingleSteps || time.Now().After(deadline) {
		t.Errorf("the workload did not reach main.done in %d steps", steps)
	}
	s.report(steps)
}

// report fails the test for failed unwinds and for parts of the workload
// no step reached.
func (s *stepper) report(steps int) {
	t := s.t
	for _, key := range sortedCounts(s.failed) {
		t.Errorf("%d unwinds failed: %s", s.failed[key], key)
	}
	t.Logf("%d steps in %d functions, %d distinct PCs; %v", steps, len(s.inner), len(s.covered), s.stats)
	top := sortedCounts(s.inner)
	sort.SliceStable(top, func(i, j int) bool { return s.inner[top[i]] > s.inner[top[j]] })
	for _, k := range top[:min(len(top), 15)] {
		t.Logf("%7d steps in %s", s.inner[k], k)
	}
	for _, must := range []string{"through runtime.morestack", "through runtime.systemstack", "frame pointer rules", "frame pointers checked"} {
		if s.stats[must] == 0 {
			t.Errorf("no step %s: the workload no longer covers it", must)
		}
	}
	for _, must := range []string{"main.leaf", "main.grow", "main.format"} {
		if s.inner[must] == 0 {
			t.Errorf("no step in %s: the workload no longer covers it", must)
		}
	}
}

// unwoundFrame is one frame of an unwound stack.
type unwoundFrame struct {
	pc, cfa uint64
	name    string
	rule    Rule
}

// check unwinds at the current instruction and records what it saw.
func (s *stepper) check(regs unix.PtraceRegs) {
	pc := regs.Rip - s.bias
	inner := s.name(pc)
	if inner == "" {
		s.stats["in native code"]++
		return
	}
	s.covered[pc] = true
	clear(s.pages)
	frames, err := s.unwind(regs)
	if err == nil {
		err = s.checkChain(frames)
	}
	if err != nil {
		r, _ := s.deltas.Lookup(pc)
		if r.CFA == CFAUnknown {
			// Stack switchers and code that pops its return address
			// have no rule: the frame pointer fallback may go wrong
			// while they are the innermost frame.
			s.stats["innermost without rule, unwind failed"]++
			return
		}
		s.failed[fmt.Sprintf("innermost %s (%v): %v", inner, r, err)]++
		return
	}
	s.inner[inner]++
	for _, fr := range frames[1:] {
		switch fr.name {
		case "runtime.systemstack", "runtime.asmcgocall":
			s.stats["through "+fr.name]++
		}
		if fr.rule.CFA == CFAFP {
			s.stats["frame pointer rules"]++
		}
	}
}

// unwind follows the rules from the registers to a stop rule; with no
// rule it uses the frame pointer, as the BPF unwinder does.
func (s *stepper) unwind(regs unix.PtraceRegs) ([]unwoundFrame, error) {
	pc, sp, fp := regs.Rip-s.bias, regs.Rsp, regs.Rbp
	var frames []unwoundFrame
	for depth := 0; depth < 128; depth++ {
		look := pc
		if depth > 0 {
			look-- // a return address is after the call
		}
		fr := unwoundFrame{pc: pc, name: s.name(look)}
		if fr.name == "" {
			// A C caller (cgo's _cgo_topofstack is called from C):
			// .eh_frame, not the pclntab, goes on from here.
			return append(frames, fr), nil
		}
		r, ok := s.deltas.Lookup(look)
		if !ok && r.CFA == CFAUnknown {
			r = Rule{CFA: CFAFP, CFAOffset: 16, FPOffset: -16, RAOffset: -8}
			s.stats["frame pointer fallbacks"]++
		}
		fr.rule = r
		switch r.CFA {
		case CFAStop:
			return append(frames, fr), nil
		case CFASP:
			fr.cfa = sp + uint64(int64(r.CFAOffset))
		case CFAFP:
			fr.cfa = fp + uint64(int64(r.CFAOffset))
		default:
			return frames, fmt.Errorf("frame %d (%s): rule %v", depth, fr.name, r)
		}
		ra, err := s.read(fr.cfa + uint64(int64(r.RAOffset)))
		if err != nil {
			return frames, fmt.Errorf("frame %d (%s): %w", depth, fr.name, err)
		}
		if r.FPOffset != 0 {
			if fp, err = s.read(fr.cfa + uint64(int64(r.FPOffset))); err != nil {
				return frames, fmt.Errorf("frame %d (%s): %w", depth, fr.name, err)
			}
		}
		frames = append(frames, fr)
		pc, sp = ra-s.bias, fr.cfa
	}
	return frames, errors.New("no stop rule within 128 frames")
}

// checkChain compares the program's part of the chain with its call
// graph and the recovered frame pointers with the callers' CFAs.
func (s *stepper) checkChain(frames []unwoundFrame) error {
	last := frames[len(frames)-1].name
	switch last {
	case "runtime.goexit", "runtime.mstart", "runtime.rt0_go":
	case "":
		s.stats["into a C caller"]++
	case "runtime.morestack":
		s.stats["through runtime.morestack"]++
	case "runtime.mcall":
		// The scheduler runs on the system stack under mcall (a
		// goroutine parks or yields); the native part ends there, as
		// goStopFuncs says. Whether a step lands there is timing.
		s.stats["under runtime.mcall"]++
	default:
		return fmt.Errorf("ends in %s", last)
	}
	for i := 0; i+1 < len(frames); i++ {
		callee, caller := frames[i], frames[i+1]
		if want, ok := progCallers[callee.name]; ok && !slices.Contains(want, caller.name) {
			return fmt.Errorf("%s called by %s, want one of %v (chain %s)", callee.name, caller.name, want, frameChain(frames))
		}
		// A caller with a frame set BP = its CFA-16 before calling, so
		// the BP the callee's rule recovered must be that.
		if callee.rule.FPOffset != 0 && caller.rule.CFA == CFASP && caller.rule.FPOffset == -16 {
			fp, _ := s.read(callee.cfa + uint64(int64(callee.rule.FPOffset)))
			if fp != caller.cfa-16 {
				return fmt.Errorf("%s: recovered BP %#x, but %s's frame pointer is %#x (chain %s)", callee.name, fp, caller.name, caller.cfa-16, frameChain(frames))
			}
			s.stats["frame pointers checked"]++
		}
	}
	return nil
}

func (s *stepper) name(pc uint64) string {
	if n, ok := s.names[pc]; ok {
		return n
	}
	fr, err := s.syms.Lookup(pc)
	n := ""
	if err == nil {
		n = strings.TrimSuffix(fr.Func.Name, ".abi0")
	}
	s.names[pc] = n
	return n
}

// read reads a word of the stopped thread's memory, a page at a time.
func (s *stepper) read(addr uint64) (uint64, error) {
	const page = 4096
	base := addr &^ (page - 1)
	if addr-base > page-8 {
		base = addr // a word across pages
	}
	b, ok := s.pages[base]
	if !ok {
		b = make([]byte, page)
		n, err := s.mem.ReadAt(b, int64(base))
		if n < 8 {
			return 0, fmt.Errorf("reading stack at %#x: %w", addr, err)
		}
		s.pages[base] = b[:n]
	}
	if off := addr - base; off+8 <= uint64(len(b)) {
		return binary.LittleEndian.Uint64(b[off:]), nil
	}
	return 0, fmt.Errorf("reading stack at %#x: short read", addr)
}

// loadBias is where the executable's first segment is mapped minus its
// virtual address (0 for position-dependent executables).
func exeLoadBias(pid int, path string, f *elf.File) (uint64, error) {
	var first *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Off == 0 {
			first = p
			break
		}
	}
	if first == nil {
		return 0, errors.New("no PT_LOAD at file offset 0")
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(maps), "\n") {
		var start, end, off uint64
		var perms, dev, inode, file string
		if n, _ := fmt.Sscanf(line, "%x-%x %s %x %s %s %s", &start, &end, &perms, &off, &dev, &inode, &file); n == 7 && off == 0 && file == path {
			return start - first.Vaddr&^0xfff, nil
		}
	}
	return 0, fmt.Errorf("%s is not mapped in process %d", path, pid)
}

func frameChain(frames []unwoundFrame) string {
	names := make([]string, len(frames))
	for i, f := range frames {
		names[i] = f.name
	}
	return strings.Join(names, " <- ")
}

func sortedCounts(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

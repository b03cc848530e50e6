package nativeunwind

import (
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestGoPclntab checks every build variant three ways:
//   - the function table and PC → function, file:line against the
//     standard library's debug/gosym on the same bytes (or, for files
//     without symbols or sections, against the twin build they were
//     made from);
//   - the SP deltas against the instruction stream: `go tool objdump`
//     disassembles every function, and replaying each instruction's
//     effect on SP (PUSHQ, SUBQ $n, SP, MOVD.W R30, -n(RSP), ...) from 0
//     at the entry must give our delta at every instruction;
//   - structural invariants of the deltas.
func TestGoPclntab(t *testing.T) {
	set := newGoBuildSet(t)
	for _, b := range goBuilds {
		t.Run(b.name, func(t *testing.T) {
			path := set.path(t, b.name)
			syms, deltas := readGoFile(t, path)
			if got := syms.Layout(); got != "go1.20" {
				t.Errorf("layout %s, want go1.20", got)
			}
			checkDeltaInvariants(t, syms, deltas)
			if b.twin != "" {
				twinSyms, twinDeltas := readGoFile(t, set.path(t, b.twin))
				checkSameTable(t, syms, twinSyms, deltas, twinDeltas)
				return
			}
			checkAgainstGosym(t, path, syms)
			if !b.noReplay {
				checkAgainstObjdump(t, path, b.goarch, syms, deltas)
			}
		})
	}
}

// TestGoPclntabNotGo: files the Go linker did not write are told apart
// by ErrNoGoPclntab, without scanning them.
func TestGoPclntabNotGo(t *testing.T) {
	for _, path := range []string{"/bin/sh", "/usr/bin/gcc"} {
		f, err := elf.Open(path)
		if err != nil {
			t.Logf("skipping %s: %v", path, err)
			continue
		}
		if _, err := goDeltas(elfImage{f: f}); !errors.Is(err, ErrNoGoPclntab) {
			t.Errorf("goDeltas(%s): %v, want ErrNoGoPclntab", path, err)
		}
		if _, err := ReadGoSymbols(f, nil); !errors.Is(err, ErrNoGoPclntab) {
			t.Errorf("ReadGoSymbols(%s): %v, want ErrNoGoPclntab", path, err)
		}
		f.Close()
	}
}

func readGoFile(t *testing.T, path string) (*GoSymbols, Deltas) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := ReadGoSymbols(f, nil)
	if err != nil {
		t.Fatalf("ReadGoSymbols: %v", err)
	}
	deltas, err := goDeltas(elfImage{f: f})
	if err != nil {
		t.Fatalf("goDeltas: %v", err)
	}
	return syms, deltas
}

func checkDeltaInvariants(t *testing.T, syms *GoSymbols, d Deltas) {
	t.Helper()
	for i := 1; i < len(d); i++ {
		if d[i].Address <= d[i-1].Address || d[i].Rule == d[i-1].Rule {
			t.Fatalf("deltas %d and %d: %#x %v, %#x %v: not sorted or not distinct", i-1, i, d[i-1].Address, d[i-1].Rule, d[i].Address, d[i].Rule)
		}
	}
	last, _ := syms.Func(syms.Len() - 1)
	if r, ok := d.Lookup(last.End); ok {
		t.Errorf("rule %v past the last function's end %#x", r, last.End)
	}
	stops := map[string]bool{}
	for i := 0; i < syms.Len(); i++ {
		fn, err := syms.Func(i)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := d.Lookup(fn.Entry)
		if r.CFA == CFAStop {
			stops[fn.Name] = true
		}
	}
	for _, name := range []string{"runtime.goexit", "runtime.mstart", "runtime.rt0_go"} {
		if !stops[name] {
			t.Errorf("%s has no stop rule; stops: %v", name, stops)
		}
	}
	t.Logf("%d functions, %d deltas, stops %v", syms.Len(), len(d), stops)
}

func checkSameTable(t *testing.T, a, b *GoSymbols, da, db Deltas) {
	t.Helper()
	if a.Len() != b.Len() {
		t.Fatalf("%d functions, twin has %d", a.Len(), b.Len())
	}
	for i := 0; i < a.Len(); i++ {
		fa, err := a.Func(i)
		if err != nil {
			t.Fatal(err)
		}
		fb, err := b.Func(i)
		if err != nil {
			t.Fatal(err)
		}
		if fa != fb {
			t.Fatalf("function %d: %+v, twin has %+v", i, fa, fb)
		}
	}
	if len(da) != len(db) {
		t.Fatalf("%d deltas, twin has %d", len(da), len(db))
	}
	for i := range da {
		if da[i] != db[i] {
			t.Fatalf("delta %d: %#x %v, twin has %#x %v", i, da[i].Address, da[i].Rule, db[i].Address, db[i].Rule)
		}
	}
}

// gosymTable reads the file with debug/gosym, the text start taken from
// the runtime.text symbol as cmd/internal/objfile does.
func gosymTable(t *testing.T, path string) *gosym.Table {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := elfImage{f: f}
	text, ok := m.symbol("runtime.text")
	start, ok1 := m.symbol("runtime.pclntab")
	end, ok2 := m.symbol("runtime.epclntab")
	if !ok || !ok1 || !ok2 {
		t.Fatal("no runtime.text, runtime.pclntab or runtime.epclntab symbol")
	}
	data, err := m.read(start, end-start)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func checkAgainstGosym(t *testing.T, path string, syms *GoSymbols) {
	t.Helper()
	tab := gosymTable(t, path)
	if len(tab.Funcs) != syms.Len() {
		t.Fatalf("%d functions, debug/gosym has %d", syms.Len(), len(tab.Funcs))
	}
	lookups := 0
	for i, gf := range tab.Funcs {
		fn, err := syms.Func(i)
		if err != nil {
			t.Fatal(err)
		}
		want := GoFunc{Name: gf.Name, Entry: gf.Entry, End: gf.End}
		if fn != want {
			t.Fatalf("function %d: %+v, debug/gosym has %+v", i, fn, want)
		}
		if strings.HasPrefix(fn.Name, "go:") {
			// Linker markers (go:textfipsstart) have no line tables:
			// offset 0, which debug/gosym decodes as if it were one.
			continue
		}
		for _, pc := range samplePCs(fn, 16) {
			lookups++
			file, line, gfn := tab.PCToLine(pc)
			fr, err := syms.Lookup(pc)
			if err != nil {
				t.Fatalf("Lookup(%#x) in %s: %v", pc, fn.Name, err)
			}
			if line == -1 { // debug/gosym's "not covered"
				line = 0
			}
			if gfn == nil || fr.Func.Name != gfn.Name || fr.File != file || fr.Line != line {
				t.Fatalf("Lookup(%#x) = %s %s:%d, debug/gosym has %v %s:%d", pc, fr.Func.Name, fr.File, fr.Line, gfn, file, line)
			}
		}
	}
	first, _ := syms.Func(0)
	last, _ := syms.Func(syms.Len() - 1)
	for _, pc := range []uint64{first.Entry - 1, last.End, 0} {
		if _, err := syms.Lookup(pc); !errors.Is(err, ErrNotGoCode) {
			t.Errorf("Lookup(%#x) outside the text: %v, want ErrNotGoCode", pc, err)
		}
	}
	t.Logf("%d functions and %d PC lookups agree with debug/gosym", len(tab.Funcs), lookups)
}

// samplePCs returns the entry, the last byte and n evenly spaced addresses
// of fn.
func samplePCs(fn GoFunc, n int) []uint64 {
	pcs := []uint64{fn.Entry, fn.End - 1}
	size := fn.End - fn.Entry
	for i := 1; i < n && size > uint64(n); i++ {
		pcs = append(pcs, fn.Entry+size*uint64(i)/uint64(n))
	}
	return pcs
}

// objdumpFunc is one function as `go tool objdump` prints it.
type objdumpFunc struct {
	name  string
	insns []objdumpInsn
}

type objdumpInsn struct {
	pc   uint64
	size uint64
	asm  string
}

func goObjdump(t *testing.T, path string) []objdumpFunc {
	t.Helper()
	out, err := exec.Command("go", "tool", "objdump", path).Output()
	if err != nil {
		t.Fatalf("go tool objdump: %v", err)
	}
	var funcs []objdumpFunc
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(line, "TEXT "); ok {
			name, _, _ = strings.Cut(name, "(SB)")
			funcs = append(funcs, objdumpFunc{name: name})
			continue
		}
		var fields []string
		for _, f := range strings.Split(line, "\t") {
			if f = strings.TrimSpace(f); f != "" {
				fields = append(fields, f)
			}
		}
		if len(fields) < 4 || len(funcs) == 0 {
			continue
		}
		pc, err := strconv.ParseUint(fields[1], 0, 64)
		if err != nil {
			continue
		}
		fn := &funcs[len(funcs)-1]
		fn.insns = append(fn.insns, objdumpInsn{pc: pc, size: uint64(len(fields[2]) / 2), asm: fields[3]})
	}
	return funcs
}

// spEffect is what one instruction does to the SP delta.
type spEffect struct {
	add     int64
	writes  bool   // changes SP in a way we do not replay
	jumpEnd bool   // control does not fall through
	target  uint64 // the stack check's branch to the morestack call
	useR20  bool   // arm64 large frames: SUB $n, RSP, R20; MOVD R20, RSP
}

// replayState is what the replay knows about registers: constants moved
// into them, and R20 = RSP - n for arm64 large frames.
type replayState struct {
	consts   map[string]int64
	r20      int64
	deferred int64
}

// checkAgainstObjdump replays each function's SP adjustments. Control
// flow is followed only by falling through: after an instruction that
// does not fall through, the next block's delta is taken from the deltas
// (it must then be 0 or the function's frame size), and the morestack
// block at the stack check's branch target must be at 0. Functions that
// write SP otherwise, or have no plain SP rules, are counted, not
// replayed.
func checkAgainstObjdump(t *testing.T, path, goarch string, syms *GoSymbols, d Deltas) {
	t.Helper()
	effect := amd64SPEffect
	spOf := func(r Rule) int64 { return int64(r.CFAOffset) - 8 }
	variableLen := true
	if goarch == "arm64" {
		effect = arm64SPEffect
		spOf = func(r Rule) int64 { return int64(r.CFAOffset) }
		variableLen = false
	}
	replayed, skipped, insns := 0, map[string]string{}, 0
	for _, fn := range goObjdump(t, path) {
		why, n := replayFunc(fn, d, effect, spOf, variableLen)
		switch {
		case strings.HasPrefix(why, "mismatch"):
			t.Errorf("%s: %s", fn.name, why)
		case why != "":
			skipped[fn.name] = why
		default:
			replayed++
			insns += n
		}
	}
	if replayed < syms.Len()*9/10 {
		t.Errorf("replayed only %d of %d functions; skipped: %v", replayed, syms.Len(), skipped)
	} else if testing.Verbose() {
		t.Logf("skipped: %v", skipped)
	}
	t.Logf("replayed SP through %d instructions of %d functions; skipped %d", insns, replayed, len(skipped))
}

func replayFunc(fn objdumpFunc, d Deltas, effect func(asm, next string, pc uint64, st *replayState) spEffect, spOf func(Rule) int64, variableLen bool) (string, int) {
	var sp, frame int64
	st := &replayState{consts: map[string]int64{}}
	known := true
	var stackCheck uint64
	morestack := -1
	for i, in := range fn.insns {
		if in.asm == "?" && variableLen {
			// Not decoded (AVX-512): the rest is out of step.
			return "not disassembled", 0
		}
		if strings.HasPrefix(in.asm, "CALL runtime.morestack") {
			morestack = i
		}
	}
	for i, in := range fn.insns {
		r, ok := d.Lookup(in.pc)
		if r.CFA == CFAFP {
			// Stack switchers: the single-step test covers them.
			return "frame pointer rules", 0
		}
		if !ok || r.CFA != CFASP {
			if i == 0 {
				return "rule " + r.String(), 0
			}
			if !known {
				// Padding after the last block.
				return "", i
			}
			if sp >= 0 || r.CFA != CFAUnknown {
				return fmt.Sprintf("mismatch: rule %v at %#x (+%#x) %s", r, in.pc, in.pc-fn.insns[0].pc, in.asm), i
			}
			// The return address is popped off the stack: no rule.
		}
		got := sp
		if r.CFA == CFASP {
			got = spOf(r)
		}
		switch {
		case in.pc == stackCheck:
			sp, known = 0, true
		case !known:
			if got != 0 && got != frame && frame != 0 {
				return fmt.Sprintf("mismatch: block at %#x starts at SP delta %d, frame is %d", in.pc, got, frame), i
			}
			sp, known = got, true
		}
		if got != sp {
			return fmt.Sprintf("mismatch: SP delta %d at %#x (+%#x) %s, replay says %d", got, in.pc, in.pc-fn.insns[0].pc, in.asm, sp), i
		}
		next := ""
		if i+1 < len(fn.insns) {
			next = fn.insns[i+1].asm
		}
		e := effect(in.asm, next, in.pc, st)
		if e.writes {
			return "writes SP: " + in.asm, i
		}
		if e.target != 0 && stackCheck == 0 && i < 6 && isStackCheck(fn, morestack, e.target) {
			stackCheck = e.target
		}
		if e.useR20 {
			sp += st.r20
		}
		sp += e.add
		frame = max(frame, sp)
		if e.jumpEnd {
			known = false
		}
	}
	return "", len(fn.insns)
}

// isStackCheck says whether a prologue branch goes to the block that
// calls runtime.morestack, a few instructions before the call.
func isStackCheck(fn objdumpFunc, morestack int, target uint64) bool {
	if morestack < 0 {
		return false
	}
	// Between the branch target and the call there are only register
	// spills.
	for i := morestack; i >= 0; i-- {
		in := fn.insns[i]
		if in.pc == target {
			return true
		}
		if i < morestack && (strings.HasPrefix(in.asm, "CALL") || strings.HasPrefix(in.asm, "J") || strings.HasPrefix(in.asm, "B") || in.asm == "RET") {
			return false
		}
	}
	return false
}

func amd64SPEffect(asm, _ string, pc uint64, _ *replayState) spEffect {
	op, args, _ := strings.Cut(asm, " ")
	switch {
	case op == "PUSHQ" || op == "PUSHFQ":
		return spEffect{add: 8}
	case op == "POPQ" || op == "POPFQ":
		return spEffect{add: -8}
	case (op == "SUBQ" || op == "ADDQ") && strings.HasSuffix(args, ", SP") && strings.HasPrefix(args, "$"):
		n, err := strconv.ParseInt(strings.TrimSuffix(args[1:], ", SP"), 0, 64)
		if err != nil {
			return spEffect{writes: true}
		}
		if op == "ADDQ" {
			n = -n
		}
		return spEffect{add: n}
	case strings.HasSuffix(args, ", SP") && op != "CMPQ":
		return spEffect{writes: true}
	case op == "RET" || op == "JMP" || op == "UD2" || asm == "INT $0x3":
		return spEffect{jumpEnd: true}
	case op == "JBE" || op == "JLS" || op == "JB" || op == "JCS":
		n, _ := strconv.ParseUint(args, 0, 64)
		return spEffect{target: n}
	}
	return spEffect{}
}

func arm64SPEffect(asm, next string, pc uint64, st *replayState) spEffect {
	op, args, _ := strings.Cut(asm, " ")
	imm := func(s string) (int64, bool) {
		if n, ok := st.consts[s]; ok {
			return n, true
		}
		s, ok := strings.CutPrefix(s, "$")
		if !ok {
			return 0, false
		}
		// $n or $(n<<shift)
		s = strings.TrimSuffix(strings.TrimPrefix(s, "("), ")")
		v, shift, _ := strings.Cut(s, "<<")
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			return 0, false
		}
		if shift != "" {
			sh, err := strconv.ParseUint(shift, 10, 6)
			if err != nil {
				return 0, false
			}
			n <<= sh
		}
		return n, true
	}
	parts := strings.Split(args, ", ")
	if len(parts) == 2 && (op == "MOVD" || op == "MOVK") && strings.HasPrefix(parts[0], "$") {
		if n, ok := imm(parts[0]); ok {
			if op == "MOVK" {
				n |= st.consts[parts[1]]
			}
			st.consts[parts[1]] = n
		}
	}
	if len(parts) == 3 && op == "SUB" && parts[1] == "R20" && parts[2] == "R20" {
		if n, ok := imm(parts[0]); ok {
			st.r20 += n
		}
	}
	switch {
	case strings.HasSuffix(op, ".W") || strings.HasSuffix(op, ".P"):
		// Pre- and post-indexed accesses (MOVD.W R30, -32(RSP),
		// MOVD.P 32(RSP), R30) add the offset to the base register.
		for _, p := range parts {
			if off, ok := strings.CutSuffix(p, "(RSP)"); ok {
				if n, err := strconv.ParseInt(off, 0, 64); err == nil {
					return spEffect{add: -n}
				}
			}
		}
	case (op == "SUB" || op == "ADD") && len(parts) >= 2 && parts[len(parts)-1] == "RSP" &&
		(len(parts) == 2 || parts[1] == "RSP"):
		if n, ok := imm(parts[0]); ok {
			if op == "ADD" {
				n = -n
			}
			if strings.HasPrefix(next, op+" $(") && strings.HasSuffix(next, "RSP, RSP") {
				// A large adjustment split in two instructions is one
				// assembler instruction, so one pcsp step, at the second.
				st.deferred = n
				return spEffect{}
			}
			n, st.deferred = n+st.deferred, 0
			return spEffect{add: n}
		}
	case op == "SUB" && len(parts) == 3 && parts[1] == "RSP" && parts[2] == "R20":
		if n, ok := imm(parts[0]); ok {
			st.r20 = n
		}
	case op == "MOVD" && args == "R20, RSP":
		return spEffect{useR20: true}
	case op == "RET" || op == "JMP" || op == "UNDEF" || op == "BRK":
		return spEffect{jumpEnd: true}
	case op == "BLS" || op == "BLO" || op == "BCC":
		if n, err := strconv.ParseInt(strings.TrimSuffix(args, "(PC)"), 0, 64); err == nil {
			return spEffect{target: uint64(int64(pc) + 4*n)}
		}
	}
	if len(parts) > 0 && parts[len(parts)-1] == "RSP" && op != "CMP" {
		return spEffect{writes: true}
	}
	return spEffect{}
}

// TestGoCgoCallRules: on arm64, runtime.asmcgocall calls C with the system
// stack's frame pointer loaded, so its calls (blr x1, where the goroutine
// and the system stack paths call C) need the CFAGoCgo rule, with its
// 16-byte frame's return address and frame pointer slots; on amd64 the
// frame pointer rule holds and no rule is CFAGoCgo.
func TestGoCgoCallRules(t *testing.T) {
	set := newGoBuildSet(t)
	for _, c := range []struct {
		build string
		calls int
	}{{"amd64-cgo-pie", 0}, {"arm64-cgo-pie", 2}} {
		t.Run(c.build, func(t *testing.T) {
			path := set.path(t, c.build)
			_, deltas := readGoFile(t, path)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := Rule{CFA: CFAGoCgo, StackSwitch: true, CFAOffset: 16, RAOffset: -16, FPOffset: -24}
			calls := 0
			for i, d := range deltas {
				if d.Rule.CFA != CFAGoCgo {
					continue
				}
				calls++
				code, err := elfImage{f: f}.read(d.Address, 4)
				if err != nil {
					t.Fatal(err)
				}
				var end uint64
				if i+1 < len(deltas) {
					end = deltas[i+1].Address
				}
				if d.Rule != want || end != d.Address+4 || binary.LittleEndian.Uint32(code) != 0xd63f0020 {
					t.Errorf("%#x: %v on %x up to %#x, want %v on one blr x1", d.Address, d.Rule, code, end, want)
				}
			}
			if calls != c.calls {
				t.Errorf("%d CFAGoCgo rules, want %d", calls, c.calls)
			}
		})
	}
}

package beam

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
)

// symtestErl is the module the live tests name: its functions' lines are
// known (main/0 on line 3, outer/1 on 4, loop/2 on 5 and 6, and
// included/0 on line 11 of another file, whose name is not ASCII: -file
// numbers its own line).
const symtestErl = `-module(symtest).
-export([main/0, loop/2, included/0]).
main() -> outer(0).
outer(N) -> X = loop(100000000, 0), outer(N + X).
loop(0, Acc) -> Acc;
loop(N, Acc) -> loop(N - 1, Acc + (N band 3)).
-file("inc/é.hrl", 10).
included() -> erlang:phash2(main()).
`

// sourceLines are the file and the lines a function spans.
type sourceLines struct {
	file  string
	lines []uint32
}

var symtestLines = map[string]sourceLines{
	"symtest:main/0":     {"symtest.erl", []uint32{3}},
	"symtest:outer/1":    {"symtest.erl", []uint32{4}},
	"symtest:loop/2":     {"symtest.erl", []uint32{5, 6}},
	"symtest:included/0": {"inc/é.hrl", []uint32{11}},
}

// hotExs is an Elixir module the same shape, run as a script.
const hotExs = `defmodule Hot do
  def outer(n), do: outer(n + loop(100_000_000, 0))
  def loop(0, acc), do: acc
  def loop(n, acc), do: loop(n - 1, acc + Bitwise.band(n, 3))
  def twice(l), do: Enum.map(l, fn x -> x * 2 end)
end
IO.puts("ready")
Process.sleep(600_000)
`

var hotLines = map[string]sourceLines{
	"Hot.outer/1":                   {"hot.exs", []uint32{2}},
	"Hot.loop/2":                    {"hot.exs", []uint32{3, 4}},
	"Hot.twice/1":                   {"hot.exs", []uint32{5}},
	"anonymous fn/1 in Hot.twice/1": {"hot.exs", []uint32{5}},
}

// perfEntry is a line of the JIT's perf map (+JPperf map), which names
// every function's code: the tests' ground truth.
type perfEntry struct {
	start, size uint64
	name        string
}

// liveBEAM runs cmd (an erl or elixir of OTP otp with +JPperf map) until
// it prints "ready" and returns a symbolizer of it and its perf map.
func liveBEAM(tb testing.TB, otp string, cmd *exec.Cmd) (*symbolizer, []perfEntry) {
	s := startBEAM(tb, otp, cmd, nil)
	return s, readPerfMap(tb, fmt.Sprintf("/tmp/perf-%d.map", cmd.Process.Pid))
}

// startBEAM runs cmd (an erl or elixir of OTP otp) until it prints
// "ready", passing each line before to line, and returns a symbolizer of
// it.
func startBEAM(tb testing.TB, otp string, cmd *exec.Cmd, line func(string)) *symbolizer {
	tb.Helper()
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		tb.Skipf("no Debian Erlang build runs on %s", runtime.GOARCH)
	}
	path, err := beamfetch.BeamSMP(otp, runtime.GOARCH)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tab, err := FindTables(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	pid := cmd.Process.Pid
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.Remove(fmt.Sprintf("/tmp/perf-%d.map", pid)) // if +JPperf map wrote it
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		if line != nil {
			line(sc.Text())
		}
	}
	if sc.Text() != "ready" {
		tb.Fatalf("%v: never ready", cmd.Args)
	}
	// erl and elixir exec erlexec, which execs beam.smp: the same pid.
	bias := loadBias(tb, pid, path)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mem.Close() })
	n, _ := strconv.Atoi(otp)
	return newSymbolizer(mem, Tables{Ranges: bias + tab.Ranges, ActiveCodeIndex: bias + tab.ActiveCodeIndex}, n)
}

// liveModules returns the code headers of the modules in the active
// ranges table of s's process.
func liveModules(t *testing.T, s *symbolizer) []uint64 {
	ix, err := s.r.U32(s.tables.ActiveCodeIndex)
	if err != nil {
		t.Fatal(err)
	}
	rec := s.tables.Ranges + uint64(ix)*rangesSize
	modules, err1 := s.r.U64(rec)
	n, err2 := s.r.U64(rec + rangesNOffset)
	if err1 != nil || err2 != nil || n > maxModules {
		t.Fatalf("ranges table: %d modules at %#x: %v, %v", n, modules, err1, err2)
	}
	var out []uint64
	for i := uint64(0); i < n; i++ {
		h, err := s.r.U64(modules + 16*i)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func readPerfMap(tb testing.TB, path string) []perfEntry {
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var out []perfEntry
	for _, l := range strings.Split(string(data), "\n") {
		fs := strings.SplitN(l, " ", 3)
		if len(fs) != 3 {
			continue
		}
		start, err1 := strconv.ParseUint(strings.TrimPrefix(fs[0], "0x"), 16, 64)
		size, err2 := strconv.ParseUint(fs[1], 16, 64)
		if err1 != nil || err2 != nil || !strings.HasPrefix(fs[2], "$") {
			tb.Fatalf("%s: line %q", path, l)
		}
		out = append(out, perfEntry{start, size, fs[2][1:]})
	}
	return out
}

// loadBias returns where pid maps exe's first page (file offset 0 at
// virtual address 0: a PIE).
func loadBias(tb testing.TB, pid int, exe string) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		fs := strings.Fields(l)
		if len(fs) >= 6 && strings.Join(fs[5:], " ") == exe && fs[2] == "00000000" {
			lo, _ := strconv.ParseUint(strings.SplitN(fs[0], "-", 2)[0], 16, 64)
			return lo
		}
	}
	tb.Fatalf("pid %d: no mapping of %s", pid, exe)
	return 0
}

// elixirFunRE matches the name the compiler gives a fun: -parent/arity-fun-N-.
var elixirFunRE = regexp.MustCompile(`^-(.+/[0-9]+)-fun-[0-9]+-$`)

// functionOf returns the name a perf map entry gives a function, the
// symbolizer's spelling of it, and whether the entry is a function's
// code (not its prologue, a module's header or footer, or a shared
// fragment).
func functionOf(e perfEntry) (string, bool) {
	// erts_beamasm:run_process/3 is the JIT's entry stub, in no module.
	if strings.HasSuffix(e.name, "-CodeInfoPrologue") || strings.Contains(e.name, "::") ||
		strings.HasPrefix(e.name, "erts_beamasm:") {
		return "", false
	}
	if m, ok := strings.CutPrefix(e.name, "'Elixir."); ok {
		// 'Elixir.Foo':'bar?'/1 is Foo.bar?/1.
		mod, fa, ok := strings.Cut(m, "':")
		slash := strings.LastIndexByte(fa, '/')
		if !ok || slash < 0 {
			return "", false
		}
		fun := strings.Trim(fa[:slash], "'")
		if m := elixirFunRE.FindStringSubmatch(fun); m != nil {
			return "anonymous fn" + fa[slash:] + " in " + mod + "." + m[1], true
		}
		return mod + "." + fun + fa[slash:], true
	}
	return e.name, true
}

// checkLive names every function of the perf map at its first and last
// byte, as an interrupted PC and as a return address, checks the lines of
// the functions in lines, and that headers, footers and shared fragments
// are in no function.
func checkLive(t *testing.T, s *symbolizer, perf []perfEntry, lines map[string]sourceLines) {
	var named, fragments int
	seen := map[string]bool{}
	for _, e := range perf {
		want, isFunc := functionOf(e)
		if !isFunc {
			// The JIT's shared fragments are "global::name", like the
			// header and footer of the module global: its footer starts
			// with code that counts as its last function (see symbolizer).
			if strings.HasPrefix(e.name, "global::") && !strings.HasSuffix(e.name, "::codeFooter") ||
				strings.HasPrefix(e.name, "erts_beamasm:") || strings.HasSuffix(e.name, "::codeHeader") {
				if _, err := s.frame(e.start, false); !errors.Is(err, errNoFunction) {
					t.Errorf("%s at %#x: %v, want an address in no function", e.name, e.start, err)
				}
				fragments++
			}
			continue
		}
		for _, pc := range []struct {
			addr uint64
			ret  bool
		}{{e.start, false}, {e.start + e.size - 1, false}, {e.start + 1, true}, {e.start + e.size, true}} {
			f, err := s.frame(pc.addr, pc.ret)
			if err != nil {
				t.Fatalf("%s at %#x (return address %v): %v", e.name, pc.addr, pc.ret, err)
			}
			if f.FunctionName != want {
				t.Fatalf("%#x (return address %v) named %q, the perf map says %q", pc.addr, pc.ret, f.FunctionName, want)
			}
		}
		named++
		ls, ok := lines[want]
		if !ok {
			continue
		}
		seen[want] = true
		for pc := e.start; pc < e.start+e.size; pc++ {
			f, err := s.frame(pc, false)
			if err != nil {
				t.Fatalf("%s at %#x: %v", want, pc, err)
			}
			if f.SourceLine == 0 {
				continue // before the function's first line item
			}
			if f.SourceFile != ls.file || !containsLine(ls.lines, f.SourceLine) {
				t.Fatalf("%s at %#x: %s:%d, want %s at one of lines %v", want, pc, f.SourceFile, f.SourceLine, ls.file, ls.lines)
			}
			seen[fmt.Sprintf("%s:%d", want, f.SourceLine)] = true
		}
	}
	for fn, ls := range lines {
		for _, l := range ls.lines {
			if !seen[fmt.Sprintf("%s:%d", fn, l)] {
				t.Errorf("no address of %s on line %d", fn, l)
			}
		}
	}
	if named < 1000 || fragments < 10 {
		t.Errorf("named %d functions, checked %d headers and fragments: too few for a booted system", named, fragments)
	}
	t.Logf("named %d functions, %d headers and fragments in none; %+v", named, fragments, s.Stats())
}

func containsLine(ls []uint32, l uint32) bool {
	for _, x := range ls {
		if x == l {
			return true
		}
	}
	return false
}

// erlSymtest compiles symtest into a temporary directory and returns the
// command that runs erl of otp with it loaded.
func erlSymtest(tb testing.TB, otp string) *exec.Cmd {
	erl, err := beamfetch.Erl(otp)
	if err != nil {
		tb.Fatal(err)
	}
	erlc, err := beamfetch.Erlc(otp)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "symtest.erl"), []byte(symtestErl), 0o644); err != nil {
		tb.Fatal(err)
	}
	c := exec.Command(erlc, "symtest.erl")
	c.Dir = dir
	if out, err := c.CombinedOutput(); err != nil {
		tb.Fatalf("erlc: %v: %s", err, out)
	}
	cmd := exec.Command(erl, "-noshell", "+S", "1:1", "+JPperf", "map", "-pa", dir, "-eval",
		`code:ensure_loaded(symtest), io:format("ready~n"), timer:sleep(600000), halt().`)
	cmd.Dir = dir
	return cmd
}

// TestLiveSymbolize names the code of a live erl of every tested version
// as its JIT's perf map does, with symtest's lines.
func TestLiveSymbolize(t *testing.T) {
	for _, v := range beamfetch.Versions {
		t.Run("OTP "+v, func(t *testing.T) {
			s, perf := liveBEAM(t, v, erlSymtest(t, v))
			checkLive(t, s, perf, symtestLines)
		})
	}
}

// TestLiveSymbolizeElixir names an Elixir script's module as Elixir does,
// with the script's lines.
func TestLiveSymbolizeElixir(t *testing.T) {
	elixir, err := beamfetch.Elixir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hot.exs"), []byte(hotExs), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(elixir, "--erl", "+S 1:1 +JPperf map", "hot.exs")
	cmd.Dir = dir
	s, perf := liveBEAM(t, beamfetch.ElixirVersion, cmd)
	checkLive(t, s, perf, hotLines)
}

// TestLiveSymbolizeDefaultLayout names every function of a few modules
// in an erl run without +JPperf (the JIT's default frame layout, no perf
// map): each function's code, from its ErtsCodeInfo to the next one,
// names the function that module_info(functions) lists at its place.
func TestLiveSymbolizeDefaultLayout(t *testing.T) {
	modules := []string{"symtest", "lists", "gen_server", "erl_eval"}
	for _, v := range beamfetch.Versions {
		t.Run("OTP "+v, func(t *testing.T) {
			cmd := erlSymtest(t, v)
			// Drop +JPperf map, print each module's functions in order.
			args := []string{cmd.Args[0], "-noshell", "+S", "1:1", "-pa", cmd.Dir, "-eval",
				`[io:format("~s ~s ~b~n", [M, F, A]) || M <- [` + strings.Join(modules, ",") +
					`], {F, A} <- M:module_info(functions)], io:format("ready~n"), timer:sleep(600000), halt().`}
			cmd = exec.Command(args[0], args[1:]...)
			want := map[string][]string{}
			s := startBEAM(t, v, cmd, func(l string) {
				fs := strings.Fields(l)
				if len(fs) == 3 {
					a, _ := strconv.ParseUint(fs[2], 10, 64)
					want[fs[0]] = append(want[fs[0]], functionName(fs[0], fs[1], a))
				}
			})
			got := map[string][]string{}
			for _, header := range liveModules(t, s) {
				n, _ := s.r.U64(header)
				var names []string
				for i := uint64(0); i < n; i++ {
					ci, _ := s.r.U64(header + s.functions + 8*i)
					next, _ := s.r.U64(header + s.functions + 8*(i+1))
					first, err1 := s.frame(ci, false)
					last, err2 := s.frame(next, true)
					if err1 != nil || err2 != nil || first.FunctionName != last.FunctionName {
						t.Fatalf("function %d of the module at %#x: %q, %v; %q, %v", i, header, first.FunctionName, err1, last.FunctionName, err2)
					}
					names = append(names, first.FunctionName)
				}
				if len(names) > 0 {
					mod, _, _ := strings.Cut(names[0], ":")
					got[mod] = names
				}
			}
			for _, m := range modules {
				if strings.Join(got[m], " ") != strings.Join(want[m], " ") {
					t.Errorf("module %s: named %v, module_info says %v", m, got[m], want[m])
				}
			}
			t.Logf("%d modules named; %+v", len(got), s.Stats())
		})
	}
}

func TestFunctionName(t *testing.T) {
	for _, c := range []struct {
		module, function string
		arity            uint64
		want             string
	}{
		{"lists", "map", 2, "lists:map/2"},
		{"erl_init", "-restart/0-fun-0-", 0, "erl_init:'-restart/0-fun-0-'/0"},
		{"prim_eval", "receive", 2, "prim_eval:receive/2"},
		{"Mod@node", "it's\\", 1, "'Mod@node':'it\\'s\\\\'/1"},
		{"m", "", 0, "m:''/0"},
		{"m", "héllo", 0, "m:'héllo'/0"},
		{"Elixir.Foo.Bar", "baz?", 1, "Foo.Bar.baz?/1"},
		{"Elixir.", "f", 0, "'Elixir.':f/0"},
		{"Elixir.Hot", "-apply/1-fun-0-", 1, "anonymous fn/1 in Hot.apply/1"},
		{"Elixir.Hot", "-a-b/2-fun-12-", 0, "anonymous fn/0 in Hot.a-b/2"},
		{"Elixir.Hot", "-apply/1-fun-x-", 1, "Hot.-apply/1-fun-x-/1"},
		{"Elixir.Hot", "-apply-fun-0-", 1, "Hot.-apply-fun-0-/1"},
	} {
		if got := functionName(c.module, c.function, c.arity); got != c.want {
			t.Errorf("functionName(%q, %q, %d) = %s, want %s", c.module, c.function, c.arity, got, c.want)
		}
	}
}

// TestLiveSymbolizeExit checks that once the process exits, its frames,
// cached or not, are errors.
func TestLiveSymbolizeExit(t *testing.T) {
	v := beamfetch.Versions[len(beamfetch.Versions)-1]
	cmd := erlSymtest(t, v)
	s, perf := liveBEAM(t, v, cmd)
	var pcs []uint64
	for _, e := range perf {
		if _, ok := functionOf(e); ok && strings.HasPrefix(e.name, "symtest:") {
			pcs = append(pcs, e.start)
		}
	}
	cached := pcs[0]
	if _, err := s.frame(cached, false); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for _, pc := range pcs {
		if f, err := s.frame(pc, false); err == nil {
			t.Errorf("%#x named %q after the process exited", pc, f.FunctionName)
		}
	}
}

// TestLiveSymbolizeReload names symtest, loads a second version of it in
// its place (loop/2 renamed spin/2) and purges the first: the first
// version's addresses, named before from the cache, are in no function,
// and the second's are named.
func TestLiveSymbolizeReload(t *testing.T) {
	for _, v := range beamfetch.Versions {
		t.Run("OTP "+v, func(t *testing.T) {
			cmd := erlSymtest(t, v)
			v2 := strings.ReplaceAll(symtestErl, "loop", "spin")
			if err := os.WriteFile(filepath.Join(cmd.Dir, "v2.erl"), []byte(v2), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd.Args[len(cmd.Args)-1] = `code:ensure_loaded(symtest), io:format("ready~n"), ` +
				`io:get_line(""), {ok, symtest, Bin} = compile:file("v2.erl", [binary, debug_info]), ` +
				`{module, symtest} = code:load_binary(symtest, "v2.erl", Bin), code:purge(symtest), ` +
				`io:format("reloaded~n"), timer:sleep(600000), halt().`
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			s := startBEAM(t, v, cmd, nil)
			perf := readPerfMap(t, fmt.Sprintf("/tmp/perf-%d.map", cmd.Process.Pid))
			old := map[uint64]string{}
			for _, e := range perf {
				if name, ok := functionOf(e); ok && strings.HasPrefix(name, "symtest:") {
					f, err := s.frame(e.start, false)
					if err != nil || f.FunctionName != name {
						t.Fatalf("%#x: %q, %v, want %s", e.start, f.FunctionName, err, name)
					}
					old[e.start] = name
				}
			}
			if _, err := in.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
			waitForPerfMap(t, cmd.Process.Pid, "symtest:spin/2")
			time.Sleep(2 * genTTL)
			for pc, name := range old {
				if f, err := s.frame(pc, false); !errors.Is(err, errNoFunction) {
					t.Errorf("%#x, %s before the purge: %q, %v; want an address in no function", pc, name, f.FunctionName, err)
				}
			}
			var named int
			for _, e := range readPerfMap(t, fmt.Sprintf("/tmp/perf-%d.map", cmd.Process.Pid)) {
				if name, ok := functionOf(e); ok && strings.HasPrefix(name, "symtest:") && old[e.start] == "" {
					f, err := s.frame(e.start, false)
					if err != nil || f.FunctionName != name {
						t.Errorf("%#x after the reload: %q, %v, want %s", e.start, f.FunctionName, err, name)
					}
					named++
				}
			}
			if named != len(old) {
				t.Errorf("named %d functions of the second version, %d of the first", named, len(old))
			}
			t.Logf("%+v", s.Stats())
		})
	}
}

// waitForPerfMap waits until pid's perf map names fn.
func waitForPerfMap(t *testing.T, pid int, fn string) {
	for range 100 {
		data, err := os.ReadFile(fmt.Sprintf("/tmp/perf-%d.map", pid))
		if err == nil && strings.Contains(string(data), " $"+fn+"\n") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pid %d's perf map never named %s", pid, fn)
}

package integration

import (
	"math"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/luajit"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/luajitfetch"
)

// luajitCase is a way to run a tested LuaJIT: the luajit command, or the
// C host that embeds libluajit-5.1.so.2 (luajitfetch.Embed).
type luajitCase struct {
	name, version string
	embed         bool
}

// require fails t when the case's build is not installed for the
// workloads' architecture, and lists it for the VM when the run prepares
// one.
func (c luajitCase) require(t *testing.T) {
	t.Helper()
	requireRuntime(t, func(arch string) ([]string, error) { return luajitfetch.Tree(c.version, arch) },
		func() error {
			if c.embed {
				_, err := luajitfetch.Embed(c.version)
				return err
			}
			_, err := luajitfetch.Executable(c.version, runtime.GOARCH)
			return err
		})
}

// command runs the workload in mode for d, with the JIT off when joff
// (the luajit command's -joff; the host has the script turn it off).
func (c luajitCase) command(t *testing.T, script, mode string, joff bool, d time.Duration) *exec.Cmd {
	t.Helper()
	if c.embed {
		host, err := luajitfetch.Embed(c.version)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{script, mode, formatSeconds(d)}
		if joff {
			args = append(args, "joff")
		}
		return exec.Command(host, args...)
	}
	var args []string
	if joff {
		args = append(args, "-joff")
	}
	cmd, err := luajitfetch.Command(c.version, append(args, script, mode, formatSeconds(d))...)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// luajitFrame is a Lua frame a test expects: its function (file:line of
// its definition) and line.
type luajitFrame struct {
	name string
	line uint32
}

// luajitMatch says whether fs, a sample's Lua frames, are want, all in
// file.
func luajitMatch(fs []libpf.Frame, file string, want []luajitFrame) bool {
	if len(fs) != len(want) {
		return false
	}
	for i, f := range fs {
		if f.FunctionName != want[i].name || f.SourceLine != want[i].line || f.SourceFile != file {
			return false
		}
	}
	return true
}

// luajitChain is a workload's expected stack: leaf (or fleaf) <- mid <-
// top <- the main chunk; for recursion leaf <- mid <- rec (41 frames) <-
// the main chunk; for coroutine the chain in the coroutine's function,
// wrapped, then the main chunk.
func luajitChain(script string, hot map[string]uint32, workload string) []luajitFrame {
	base := filepath.Base(script)
	def := func(name string) string { return base + ":" + strconv.Itoa(int(hot["def "+name])) }
	leaf := luajitFrame{def("leaf"), hot["leaf"]}
	if workload == "ffi" || workload == "math" {
		name := map[string]string{"ffi": "fleaf", "math": "mleaf"}[workload]
		leaf = luajitFrame{def(name), hot[name]}
	}
	chain := []luajitFrame{leaf, {def("mid"), hot["mid"]}}
	switch workload {
	case "recursion":
		chain = append(chain, luajitFrame{def("rec"), hot["rec mid"]})
		for range 40 {
			chain = append(chain, luajitFrame{def("rec"), hot["rec"]})
		}
		return append(chain, luajitFrame{base + ":main", hot["rec main"]})
	case "coroutine":
		return append(chain, luajitFrame{def("top"), hot["top"]}, luajitFrame{def("wrapped"), hot["wrapped"]},
			luajitFrame{base + ":main", hot["coroutine main"]})
	}
	return append(chain, luajitFrame{def("top"), hot["top"]}, luajitFrame{base + ":main", hot["main"]})
}

// TestLuaJITStacks profiles the chain under each tested LuaJIT, as the
// luajit command and embedded in a C host, with the JIT off (-joff:
// interpreted frames only) and on (the leaf's loop runs as a trace), and
// the FFI chain (a libc function called through the FFI, a native frame
// above the Lua frames), a recursion deeper than one BPF program walks and
// the chain in a coroutine with the luajit command. Each sample's Lua
// frames must be the chain's, names and lines.
func TestLuaJITStacks(t *testing.T) {
	requireRoot(t)
	script, hot := markedWorkload(t, "luajit", "ljworkload.lua")
	type mode struct {
		name, workload string
		joff, embed    bool
	}
	modes := []mode{
		{"chain -joff", "chain", true, false}, {"chain jit", "chain", false, false},
		{"ffi -joff", "ffi", true, false}, {"ffi jit", "ffi", false, false},
		{"embed -joff", "chain", true, true}, {"embed jit", "chain", false, true},
		{"math -joff", "math", true, false}, {"math jit", "math", false, false},
		{"recursion -joff", "recursion", true, false}, {"recursion jit", "recursion", false, false},
		{"coroutine -joff", "coroutine", true, false}, {"coroutine jit", "coroutine", false, false},
	}
	var names, cases []string
	for _, m := range modes {
		cases = append(cases, m.name)
	}
	results := map[string][]float64{}
	for _, v := range luajitfetch.Versions {
		name := "luajit " + v
		names = append(names, name)
		results[name] = slices.Repeat([]float64{math.NaN()}, len(modes))
	}
	slices.Sort(names)
	// The versions run two at a time (pairUp): the table is logged once
	// both are done.
	t.Cleanup(func() { logShareTable(t, "LuaJIT", names, cases, results) })
	for _, v := range luajitfetch.Versions {
		name := "luajit " + v
		t.Run(v, func(t *testing.T) {
			pairUp(t)
			for i, m := range modes {
				t.Run(m.name, func(t *testing.T) {
					c := luajitCase{name: name, version: v, embed: m.embed}
					c.require(t)
					want := luajitChain(script, hot, m.workload)
					ok := func(smp sample) bool { return luajitMatch(framesOf(smp.trace, luajit.Kind), script, want) }
					s := startSession(t, testHz)
					run := runScriptHeld(t, c.command(t, script, m.workload, m.joff, 4*time.Second), func() {
						logRuntimeMetrics(t, s, "luajit")
						s.stop(t)
					})
					samples := warmSamples(t, run, s.rec, !m.joff, ok, luajit.Kind, "lua")
					good, native := 0, 0
					misses := map[string]int{}
					for _, smp := range samples {
						if !ok(smp) {
							misses[stackOf(smp.trace, luajit.Kind, "lua")]++
							continue
						}
						good++
						// A native frame (strlen) above the Lua leaf.
						if fr := smp.trace.Frames; len(fr) > 0 && fr[0].Kind == libpf.FrameNative {
							native++
						}
					}
					sh := share(good, len(samples))
					results[name][i] = sh
					t.Logf("%s: %d samples, %.1f%% with the chain, %d of them with native frames above it", m.name, len(samples), 100*sh, native)
					logTopStacks(t, misses, 4)
					floor := 0.95
					if !m.joff {
						floor = 0.90
					}
					if len(samples) < 2*testHz || sh < floor {
						t.Errorf("%d of %d samples show the chain, want >= %.0f%% of at least %d", good, len(samples), 100*floor, 2*testHz)
					}
					if m.workload == "ffi" && share(native, good) < 0.5 {
						t.Errorf("%d of %d samples with the chain have a native frame above it, want most (strlen)", native, good)
					}
				})
			}
		})
	}
}

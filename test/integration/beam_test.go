package integration

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/interpreter/beam"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
)

// beamWorkload compiles utils/workloads/erlang/ewl.erl with a version's
// erlc and returns the directory of its .beam.
func beamWorkload(t *testing.T, version string) string {
	t.Helper()
	src, _ := beamMarks(t)
	erlc, err := beamfetch.Erlc(version)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if out, err := exec.Command(erlc, "-o", dir, src).CombinedOutput(); err != nil {
		t.Fatalf("erlc %s: %v\n%s", src, err, out)
	}
	return dir
}

// beamMarks returns the path of ewl.erl and the lines of its "%# hot: NAME"
// marks.
func beamMarks(t *testing.T) (string, map[string]uint32) {
	return markedWorkload(t, "erlang", "ewl.erl")
}

// beamFrame is an Erlang frame a test expects.
type beamFrame struct {
	name string
	line uint32
}

// beamNames are a trace's Erlang frames, leaf first, as "mod:fun/arity:line".
func beamNames(tr *libpf.Trace) []string {
	var out []string
	for _, f := range framesOf(tr, beam.Kind) {
		out = append(out, fmt.Sprintf("%s:%d", f.FunctionName, f.SourceLine))
	}
	return out
}

// profileBeam runs the workload in mode under version and returns the
// share of its hot samples ok accepts after the warm-up (t fails below
// 95%).
func profileBeam(t *testing.T, version, mode string, ok func(names []string) bool) float64 {
	t.Helper()
	return profileBeamOn(t, version, mode, "1:1", 0.95, ok)
}

// profileBeamOn is profileBeam with schedulers (+S) and the share wanted.
func profileBeamOn(t *testing.T, version, mode, schedulers string, want float64, ok func(names []string) bool) float64 {
	t.Helper()
	return profileBeamFlags(t, version, mode, []string{"+S", schedulers}, want, ok)
}

// profileBeamFlags is profileBeam with the emulator's flags.
func profileBeamFlags(t *testing.T, version, mode string, flags []string, want float64, ok func(names []string) bool) float64 {
	t.Helper()
	dir := beamWorkload(t, version)
	erl, err := beamfetch.Erl(version)
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"-noshell"}, flags...), "-pa", dir, "-s", "ewl", "main", mode, formatSeconds(4*time.Second))
	return profileBeamCommand(t, exec.Command(erl, args...), mode, want, ok)
}

// profileBeamCommand is profileBeam for a command that runs a workload.
func profileBeamCommand(t *testing.T, cmd *exec.Cmd, mode string, want float64, ok func(names []string) bool) float64 {
	t.Helper()
	share, _ := profileBeamSamples(t, cmd, mode, want, ok)
	return share
}

// profileBeamSamples is profileBeamCommand that also returns the hot
// samples after the warm-up.
func profileBeamSamples(t *testing.T, cmd *exec.Cmd, mode string, want float64, ok func(names []string) bool) (float64, []sample) {
	t.Helper()
	s := startSession(t, testHz)
	run := runScriptHeld(t, cmd, func() {
		logRuntimeMetrics(t, s, "beam")
		s.stop(t)
	})
	samples := run.hotSamples(t, s.rec)
	accept := func(smp sample) bool { return ok(beamNames(smp.trace)) }
	// The warm-up is bounded in time, as maxWarmupSamples is for one
	// busy thread: procs keeps two schedulers busy, twice the samples a
	// second (94-116 before its first whole stack in CI runs).
	warm := slices.IndexFunc(samples, accept)
	maxWarmup := time.Duration(maxWarmupSamples) * time.Second / testHz
	if warm < 0 || samples[warm].meta.Time.Sub(samples[0].meta.Time) > maxWarmup {
		for _, smp := range samples[len(samples)/2:][:min(len(samples)/2, 4)] {
			t.Logf("sample: %v", stackOf(smp.trace, beam.Kind, "erl"))
		}
		var after time.Duration
		if warm >= 0 {
			after = samples[warm].meta.Time.Sub(samples[0].meta.Time)
		}
		t.Fatalf("%d hot samples (%v) before the first with the expected frames (-1: none of %d), want <= %v",
			warm, after, len(samples), maxWarmup)
	}
	samples = samples[warm:]
	good := 0
	misses := map[string]int{}
	for _, smp := range samples {
		if accept(smp) {
			good++
		} else {
			misses[stackOf(smp.trace, beam.Kind, "erl")]++
		}
	}
	share := share(good, len(samples))
	t.Logf("%s: %d samples after %d of warm-up, %.1f%% with the expected Erlang frames", mode, len(samples), warm, 100*share)
	logTopStacks(t, misses, 8)
	if len(samples) < 2*testHz || share < want {
		t.Errorf("%d of %d samples show the expected frames, want >= %.0f%% of at least %d", good, len(samples), 100*want, 2*testHz)
	}
	return share, samples
}

// beamChain is the names of frames as beamNames gives them.
func beamChain(fs ...beamFrame) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%s:%d", f.name, f.line))
	}
	return out
}

// TestBeamStacks profiles the Erlang workloads under each tested OTP
// release: chain, whose hot function is a frameless tail-recursive loop
// (its caller's frame comes from the top of the Erlang stack); bif, whose
// hot code is C (lists:reverse/1's BIF and the garbage collector) called
// from JIT code; procs, four processes in the chain on two schedulers;
// nif, whose hot code is a NIF's (zlib:compress/1: the emulator's zlib
// NIFs and zlib); dirty, whose hot code is the garbage collector on a
// dirty CPU scheduler thread (C code only: the process's frames come from
// its saved state); the chain again with +JMsingle (the JIT's code in
// anonymous memory, not a memfd); dirty_io, whose hot code is a dirty I/O
// NIF's (prim_file:read_file/1: the kernel's copy, prim_file's NIF).
func TestBeamStacks(t *testing.T) {
	requireRoot(t)
	_, hot := beamMarks(t)
	mainFrame := beamFrame{"ewl:main/1", hot["main"]}
	chain := beamChain(beamFrame{"ewl:leaf/2", hot["leaf"]}, beamFrame{"ewl:mid/1", hot["mid"]},
		beamFrame{"ewl:top/1", hot["top"]}, mainFrame)
	leaf0 := beamChain(beamFrame{"ewl:leaf/2", hot["leaf0"]})[0]
	bif := beamChain(beamFrame{"ewl:bif_mid/2", hot["bif_mid"]}, beamFrame{"ewl:bif_top/1", hot["bif_top"]}, mainFrame)
	procsLine := fmt.Sprintf(":%d", hot["procs"])
	nif := beamChain(beamFrame{"ewl:nif_mid/2", hot["nif_mid"]}, beamFrame{"ewl:nif_top/1", hot["nif_top"]}, mainFrame)
	dirty := beamChain(beamFrame{"ewl:dirty_mid/2", hot["dirty_mid"]}, beamFrame{"ewl:dirty_top/1", hot["dirty_top"]}, mainFrame)
	dio := beamChain(beamFrame{"ewl:dio_mid/2", hot["dio_mid"]}, beamFrame{"ewl:dio_top/1", hot["dio_top"]}, mainFrame)
	modes := []string{"chain", "bif", "procs", "nif", "dirty", "chain +JMsingle", "dirty_io"}
	results := map[string][]float64{}
	var names []string
	for _, v := range beamfetch.Versions {
		name := "OTP_" + v
		names = append(names, name)
		results[name] = make([]float64, len(modes))
		t.Run(name, func(t *testing.T) {
			// The loop's clause test for 0 is on the line before.
			chainOK := func(fs []string) bool {
				return len(fs) >= len(chain) && (fs[0] == chain[0] || fs[0] == leaf0) &&
					slices.Equal(fs[1:len(chain)], chain[1:])
			}
			results[name][0] = profileBeam(t, v, "chain", chainOK)
			results[name][1] = profileBeam(t, v, "bif", func(fs []string) bool { return hasChain(fs, bif) })
			// Four processes on two schedulers: each sample has its
			// process's stack, which ends with the fun it was spawned
			// with.
			results[name][2] = profileBeamOn(t, v, "procs", "2:2", 0.90, func(fs []string) bool {
				return len(fs) == 4 && (fs[0] == chain[0] || fs[0] == leaf0) && slices.Equal(fs[1:3], chain[1:3]) &&
					strings.HasPrefix(fs[3], "ewl:'-run/2-fun-") && strings.HasSuffix(fs[3], procsLine)
			})
			results[name][3] = profileBeam(t, v, "nif", func(fs []string) bool { return hasChain(fs, nif) })
			results[name][4] = profileBeamDirty(t, v, "dirty", "erts_dcpus", 0.90, 0.90, dirty)
			// The emulator's other threads work for the I/O too (the
			// poll thread, the normal scheduler woken by each read's
			// completion): 82-95% of the samples were the dirty I/O
			// scheduler's, 79-89% of all had the chain. 5-10% of the
			// dirty I/O scheduler's are between jobs, in erts_schedule,
			// with no process: 90-95% had the chain.
			results[name][6] = profileBeamDirty(t, v, "dirty_io", "erts_dios", 0.85, 0.70, dio)
			// The JIT's code mapped once, in anonymous memory.
			results[name][5] = profileBeamFlags(t, v, "chain", []string{"+S", "1:1", "+JMsingle", "true"}, 0.95, chainOK)
		})
	}
	logShareTable(t, "BEAM", names, modes, results)
}

// profileBeamDirty runs a dirty mode: at least half its samples are on
// a thread of the dirty schedulers named threads (erts_dcpus, erts_dios),
// and most of those run a job (have Erlang frames: the rest is the
// scheduler's own loop between jobs, spinning in erts_schedule, whose
// share the host's load sets); wantThreads of the jobs' samples and
// wantAll of all its samples have the chain.
func profileBeamDirty(t *testing.T, version, mode, threads string, wantThreads, wantAll float64, chain []string) float64 {
	t.Helper()
	dir := beamWorkload(t, version)
	erl, err := beamfetch.Erl(version)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(fs []string) bool { return hasChain(fs, chain) }
	all, samples := profileBeamSamples(t, exec.Command(erl, "-noshell", "+S", "1:1", "+SDcpu", "1:1", "-pa", dir, "-s", "ewl", "main", mode,
		formatSeconds(4*time.Second)), mode, wantAll, ok)
	onDirty, jobs, good := 0, 0, 0
	for _, smp := range samples {
		if strings.HasPrefix(smp.meta.ThreadName, threads) {
			onDirty++
			names := beamNames(smp.trace)
			if len(names) > 0 {
				jobs++
			}
			if ok(names) {
				if good == 0 {
					t.Logf("a dirty scheduler's sample: %v", stackOf(smp.trace, beam.Kind, "erl"))
				}
				good++
			}
		}
	}
	t.Logf("%s: %d of %d samples on %s threads, %d of them in a job, %.1f%% of those with the chain", mode, onDirty,
		len(samples), threads, jobs, 100*share(good, jobs))
	if onDirty < len(samples)/2 || jobs < onDirty*3/4 || share(good, jobs) < wantThreads {
		t.Errorf("%d of %d samples on %s threads, %d in a job, %d with the chain: want half the samples there, "+
			"three quarters of those in a job, >= %.0f%% of those with the chain",
			onDirty, len(samples), threads, jobs, good, 100*wantThreads)
	}
	return all
}

// TestBeamElixir profiles the Elixir chain (utils/workloads/erlang/ewl.exs)
// on the OTP release Debian's elixir runs on: modules are named as Elixir
// names them (EwlChain.leaf/2 for the emulator's 'Elixir.EwlChain'), the
// script's own code is a function of the module elixir compiles it into
// (elixir_compiler_0:'__FILE__'/1), at the script's line.
func TestBeamElixir(t *testing.T) {
	requireRoot(t)
	elixir, err := beamfetch.Elixir()
	if err != nil {
		t.Fatal(err)
	}
	script, hot := markedWorkload(t, "erlang", "ewl.exs")
	want := func(name, mark string) string { return fmt.Sprintf("%s:%d", name, hot[mark]) }
	leaf, leaf0 := want("EwlChain.leaf/2", "ex_leaf"), want("EwlChain.leaf/2", "ex_leaf0")
	rest := []string{want("EwlChain.mid/1", "ex_mid"), want("EwlChain.top/1", "ex_top")}
	mainLine := fmt.Sprintf(":%d", hot["ex_main"])
	share := profileBeamCommand(t, exec.Command(elixir, "--erl", "+S 1:1", script, "chain", formatSeconds(4*time.Second)), "chain", 0.95,
		func(fs []string) bool {
			return len(fs) > len(rest)+1 && (fs[0] == leaf || fs[0] == leaf0) && slices.Equal(fs[1:len(rest)+1], rest) &&
				strings.HasSuffix(fs[len(rest)+1], mainLine)
		})
	t.Logf("Elixir on OTP %s: %.1f%% of the chain's samples with the full chain", beamfetch.ElixirVersion, 100*share)
}

package beam

import (
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/symbench"
	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
)

// benchFrames returns a symbolizer of a live erl of otp (symtest loaded)
// whose atom table is found, and return addresses in the middle of the
// functions of a few modules a profile of it would show.
func benchFrames(b *testing.B, otp string) (*symbolizer, []uint64) { return benchFramesT(b, otp) }

func benchFramesT(b testing.TB, otp string) (*symbolizer, []uint64) {
	s, perf := liveBEAM(b, otp, erlSymtest(b, otp))
	if _, err := s.atomTable(); err != nil {
		b.Fatal(err)
	}
	var pcs []uint64
	for _, e := range perf {
		if _, ok := functionOf(e); !ok {
			continue
		}
		mod, _, _ := strings.Cut(e.name, ":")
		switch mod {
		case "symtest", "lists", "erl_eval", "gen_server", "proc_lib", "init", "code_server":
			pcs = append(pcs, e.start+e.size/2)
		}
	}
	if len(pcs) < 100 {
		b.Fatalf("%d functions", len(pcs))
	}
	return s, pcs
}

// benchmarkSymbolize names one return address of pcs per iteration:
// with every cache fresh (fresh "all": a process's first frames), only the
// frame cache fresh ("frames": a new address of a process symbolized
// before, its atoms and modules' line tables cached) or every address
// cached ("").
func benchmarkSymbolize(b *testing.B, s *symbolizer, pcs []uint64, fresh string) {
	for _, pc := range pcs {
		if _, err := s.frame(pc, true); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		if fresh != "" {
			b.StopTimer()
			old := s
			s = newSymbolizer(s.mem, s.tables, s.otp)
			s.atomTab = old.atomTab
			if fresh == "frames" {
				s.atoms, s.modules = old.atoms, old.modules
			}
			b.StartTimer()
		}
		if _, err := s.frame(pcs[i%len(pcs)], true); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSymbolize, per OTP release: new (every cache fresh), cached,
// and new-address (a new address of a process whose atoms and modules are
// cached: the usual miss once a process has been sampled a while).
func BenchmarkSymbolize(b *testing.B) {
	for _, v := range beamfetch.Versions {
		s, pcs := benchFrames(b, v)
		symbench.Run(b, "OTP "+v, 1,
			func(b *testing.B) { benchmarkSymbolize(b, s, pcs, "all") },
			func(b *testing.B) { benchmarkSymbolize(b, s, pcs, "") })
		b.Run("OTP "+v+"/new-address", func(b *testing.B) { benchmarkSymbolize(b, s, pcs, "frames") })
	}
}

// BenchmarkFindAtomTable is the one-time search of a process's atom table.
func BenchmarkFindAtomTable(b *testing.B) {
	for _, v := range beamfetch.Versions {
		b.Run("OTP "+v, func(b *testing.B) {
			s, _ := benchFrames(b, v)
			b.ResetTimer()
			for range b.N {
				if _, err := s.findAtomTable(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

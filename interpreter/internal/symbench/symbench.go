// Package symbench gives the runtimes' symbolization benchmarks one shape:
// per runtime version (and kind of frame), a "new" sub-benchmark, where
// the frame is not cached and everything naming it is read from the live
// process, and a "cached" one, where the cache answers (after whatever
// check the runtime makes that the cached object is still the same). Each
// reports ns/frame as well as ns/op, so that benchmarks naming a whole
// stack per operation compare with those naming one frame:
//
//	go test -run '^$' -bench Symbolize ./interpreter/...
//
// prints one table per runtime, a row per version, kind and case.
package symbench

import "testing"

// Run runs uncached as name/new and cached as name/cached, each naming
// frames frames per operation: frames as BPF reports them, one of which
// may be named as several (a compiled frame with inlined functions).
func Run(b *testing.B, name string, frames int, uncached, cached func(b *testing.B)) {
	b.Helper()
	for _, c := range []struct {
		name string
		run  func(b *testing.B)
	}{{"new", uncached}, {"cached", cached}} {
		b.Run(name+"/"+c.name, func(b *testing.B) {
			c.run(b)
			b.StopTimer()
			if b.N > 0 && frames > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*frames), "ns/frame")
			}
		})
	}
}

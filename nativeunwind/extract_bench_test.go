package nativeunwind

import (
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkExtract measures extraction on libc and on the largest library
// Debian ships (libLLVM, ~5 MB of .eh_frame), or on the files listed in
// $NATIVEUNWIND_BENCH_FILES. MB/s is of .eh_frame; heapsys-MB is the heap
// the runtime holds after the runs, an upper bound of the peak.
func BenchmarkExtract(b *testing.B) {
	files := []string{
		"/lib/x86_64-linux-gnu/libc.so.6",
		"/usr/lib/x86_64-linux-gnu/libLLVM-16.so.1",
	}
	if env := os.Getenv("NATIVEUNWIND_BENCH_FILES"); env != "" {
		files = filepath.SplitList(env)
	}
	for _, path := range files {
		b.Run(filepath.Base(path), func(b *testing.B) {
			f, err := elf.Open(path)
			if err != nil {
				b.Skip(err)
			}
			defer f.Close()
			if s := f.Section(".eh_frame"); s != nil {
				b.SetBytes(int64(s.Size))
			}
			b.ReportAllocs()
			var n int
			for b.Loop() {
				d, err := Extract(f)
				if err != nil {
					b.Fatal(err)
				}
				n = len(d)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "deltas/s")
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapSys)/(1<<20), "heapsys-MB")
		})
	}
}

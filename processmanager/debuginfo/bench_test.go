package debuginfo

import (
	"debug/elf"
	"os"
	"testing"
)

// libcAddrs returns addresses spread over libc's functions.
func libcAddrs(b *testing.B) []uint64 {
	b.Helper()
	f, err := elf.Open(libc)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		b.Fatal(err)
	}
	var addrs []uint64
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			addrs = append(addrs, s.Value+s.Size/2)
		}
	}
	return addrs
}

func openLibc(b *testing.B) *File {
	b.Helper()
	f, err := os.Open(libc)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	d, err := Open(Executable{File: f, Root: "/", Path: libc},
		Options{DebugDirs: []string{"/usr/lib/debug"}, MaxDecompressed: 1 << 28})
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkOpenLibc: finding libc's build-id debug file, inflating its
// compressed sections and indexing its units, as on the first sampled
// address of libc.
func BenchmarkOpenLibc(b *testing.B) {
	var cost int64
	for b.Loop() {
		d := openLibc(b)
		cost = d.Cost()
		d.Close()
	}
	b.ReportMetric(float64(cost)/(1<<20), "MiB-held")
}

// BenchmarkLookupLibc: one address of libc looked up for the first time
// (processmanager caches the answer per address after).
func BenchmarkLookupLibc(b *testing.B) {
	d := openLibc(b)
	defer d.Close()
	addrs := libcAddrs(b)
	i := 0
	for b.Loop() {
		if _, err := d.Lookup(addrs[i%len(addrs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

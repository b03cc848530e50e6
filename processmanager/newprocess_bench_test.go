package processmanager

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// BenchmarkNewProcess is the daemon's work for a new process that runs no
// language runtime, mapping files earlier processes mapped (a C++ service
// with OpenSSL and zlib): on its first sample, reading its status and maps,
// looking its files up and for runtimes and an APM agent in them; then
// forgetting it when it exits. Writing the fake /proc entry is not timed.
func BenchmarkNewProcess(b *testing.B) {
	var files []string
	for _, name := range []string{"ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libstdc++.so.6",
		"libgcc_s.so.1", "libz.so.1", "libssl.so.3", "libcrypto.so.3"} {
		path, err := filepath.EvalSymlinks(filepath.Join("/lib/x86_64-linux-gnu", name))
		if err != nil {
			b.Skipf("%s: %v (the benchmark maps Debian's amd64 libraries)", name, err)
		}
		files = append(files, path)
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	files = append(files, exe)
	var mappings []fakeMapping
	addr := uint64(0x7f0000000000)
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			b.Fatal(err)
		}
		size := (uint64(st.Size()) + 0xfff) &^ 0xfff
		mappings = append(mappings, fakeMapping{start: addr, end: addr + size, file: f})
		addr += size + 0x100000
	}
	fs := newFakeProcFS(b)
	m, err := New(Config{ProcFS: fs.root})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	start := func(pid uint32) { fs.setProcess(pid, uint64(pid), exe, mappings...) }
	sample := func(pid uint32) {
		raw := &support.Trace{PID: pid, TID: pid, Comm: "svc", Hash: uint64(pid),
			Frames: []support.Frame{{Kind: libpf.FrameNative, Addr: mappings[1].start + 0x1000}}}
		if _, _, err := m.ConvertTrace(raw); err != nil {
			b.Fatal(err)
		}
		m.ProcessExited(libpf.PID(pid))
	}
	pid := uint32(1000)
	start(pid)
	sample(pid) // its files are known from then on
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		fs.removeProcess(pid)
		pid++
		start(pid)
		b.StartTimer()
		sample(pid)
	}
}

package reporter

import (
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// fixture is a small but complete picture of an interval: two processes that
// share the kernel mapping and a libc (mapped at different addresses), with
// kernel, native, unsymbolized and abort frames, several threads and CPUs,
// and two traces with distinct hashes but identical frames.
type fixture struct {
	start, end time.Time
	procA      *libpf.ProcessInfo
	procB      *libpf.ProcessInfo
	vmlinux    *libpf.Mapping
	libcA      *libpf.Mapping
	libcB      *libpf.Mapping
	appA       *libpf.Mapping
	appB       *libpf.Mapping
	t1, t2, t3 *libpf.Trace
	t4, t5     *libpf.Trace
	samples    []fixtureSample
}

type fixtureSample struct {
	trace *libpf.Trace
	meta  libpf.SampleMeta
	n     int
}

// Expected shape of the OTLP request built from newFixture.
const (
	fixtureSamples   = 13
	fixtureProfiles  = 2
	fixtureMappings  = 6 // zero, vmlinux, libc twice, two executables
	fixtureFunctions = 6 // zero, copy_user, do_syscall_64, write, main.main, main
	fixtureLocations = 9 // zero + 8, kernel frames shared between processes
	fixtureStacks    = 5 // zero + t1..t4 (t5 has t2's frames)
)

func newFixture() *fixture {
	f := &fixture{
		start: time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC),
		procA: &libpf.ProcessInfo{PID: 100, ExecutableName: "app-a", ExecutablePath: "/usr/bin/app-a"},
		procB: &libpf.ProcessInfo{PID: 200, ExecutableName: "app-b", ExecutablePath: "/opt/b/app-b",
			ContainerID: "c0ffee", PodUID: "1b7c8f4e-2a3d-4e5f-8a9b-0c1d2e3f4a5b",
			PodName: "b-0", Namespace: "ns", ContainerName: "app", RuntimeName: "CPython", RuntimeVersion: "3.12.1"},
	}
	f.end = f.start.Add(5 * time.Second)
	f.vmlinux = &libpf.Mapping{FileID: libpf.FileIDFromKernelBuildID("0badc0de"), Path: "vmlinux",
		Start: 0xffffffff81000000, End: 0xffffffff83000000, Bias: 0xffffffff81000000, GNUBuildID: "0badc0de"}
	libcID := libpf.FileID{1, 2, 3}
	f.libcA = &libpf.Mapping{FileID: libcID, Path: "/usr/lib/libc.so.6", GNUBuildID: "11aa",
		Start: 0x7f0000000000, End: 0x7f0000200000, Bias: 0x7f0000000000}
	f.libcB = &libpf.Mapping{FileID: libcID, Path: "/usr/lib/libc.so.6", GNUBuildID: "11aa",
		Start: 0x7f5000000000, End: 0x7f5000200000, Bias: 0x7f5000000000}
	f.appA = &libpf.Mapping{FileID: libpf.FileID{0xa}, Path: "/usr/bin/app-a", GoBuildID: "go-a/b/c",
		Start: 0x400000, End: 0x800000, FileOffset: 0x1000}
	f.appB = &libpf.Mapping{FileID: libpf.FileID{0xb}, Path: "/opt/b/app-b", GNUBuildID: "22bb",
		Start: 0x500000, End: 0x900000}

	kernel := []libpf.Frame{
		{Kind: libpf.FrameKernel, Address: 0x1000, Mapping: f.vmlinux, FunctionName: "copy_user"},
		{Kind: libpf.FrameKernel, Address: 0x2000, Mapping: f.vmlinux, FunctionName: "do_syscall_64"},
	}
	write := func(m *libpf.Mapping) libpf.Frame {
		return libpf.Frame{Kind: libpf.FrameNative, Address: 0x100, Mapping: m,
			FunctionName: "write", SourceFile: "write.c", SourceLine: 10}
	}
	mainA := libpf.Frame{Kind: libpf.FrameNative, Address: 0x500, Mapping: f.appA,
		FunctionName: "main.main", SourceFile: "main.go", SourceLine: 5}
	mainB := libpf.Frame{Kind: libpf.FrameNative, Address: 0x700, Mapping: f.appB, FunctionName: "main"}
	frames := func(fs ...[]libpf.Frame) []libpf.Frame {
		var out []libpf.Frame
		for _, f := range fs {
			out = append(out, f...)
		}
		return out
	}
	f.t1 = &libpf.Trace{Hash: libpf.TraceHash{Hi: 1, Lo: 1},
		Frames: frames(kernel, []libpf.Frame{write(f.libcA), mainA})}
	f.t2 = &libpf.Trace{Hash: libpf.TraceHash{Hi: 2, Lo: 2}, Frames: []libpf.Frame{
		{Kind: libpf.FrameNative, Address: 0x600, Mapping: f.appA}, mainA}}
	f.t3 = &libpf.Trace{Hash: libpf.TraceHash{Hi: 3, Lo: 3},
		Frames: frames(kernel, []libpf.Frame{write(f.libcB), mainB})}
	f.t4 = &libpf.Trace{Hash: libpf.TraceHash{Hi: 4, Lo: 4}, Frames: []libpf.Frame{
		{Kind: libpf.FrameAbort, Address: 3}, mainB}}
	f.t5 = &libpf.Trace{Hash: libpf.TraceHash{Hi: 5, Lo: 5}, Frames: f.t2.Frames}

	at := func(ms int) time.Time { return f.start.Add(time.Duration(ms) * time.Millisecond) }
	f.samples = []fixtureSample{
		{f.t1, libpf.SampleMeta{Time: at(10), TID: 100, ThreadName: "app-a", CPU: 0, Process: f.procA}, 3},
		{f.t2, libpf.SampleMeta{Time: at(20), TID: 100, ThreadName: "app-a", CPU: 0, Process: f.procA}, 2},
		{f.t5, libpf.SampleMeta{Time: at(30), TID: 100, ThreadName: "app-a", CPU: 0, Process: f.procA}, 1},
		{f.t1, libpf.SampleMeta{Time: at(40), TID: 101, ThreadName: "worker", CPU: 1, Process: f.procA}, 1},
		{f.t3, libpf.SampleMeta{Time: at(50), TID: 200, ThreadName: "app-b", CPU: 2, Process: f.procB}, 4},
		{f.t4, libpf.SampleMeta{Time: at(60), TID: 200, ThreadName: "app-b", CPU: 2, Process: f.procB}, 1},
		// Arrived late from the pipeline: stamped before the interval began.
		{f.t4, libpf.SampleMeta{Time: at(-100), TID: 201, CPU: 3, Process: f.procB}, 1},
	}
	return f
}

// report feeds the fixture's samples to fn, spacing repeated samples 1ms
// apart.
func (f *fixture) report(fn func(*libpf.Trace, *libpf.SampleMeta)) {
	for _, s := range f.samples {
		for i := range s.n {
			meta := s.meta
			meta.Time = meta.Time.Add(time.Duration(i) * time.Millisecond)
			fn(s.trace, &meta)
		}
	}
}

// interval returns the fixture as a finished interval.
func (f *fixture) interval() *interval {
	a := newAggregator(f.start, defaultMaxSamplesPerInterval)
	f.report(func(t *libpf.Trace, m *libpf.SampleMeta) { a.add(t, m, uint64(m.Time.UnixNano())) })
	return a.swap(f.end)
}

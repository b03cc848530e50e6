package processmanager

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	"github.com/hostprof/ebpf-profiler/processmanager/internal/filetest"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/support"
)

// benchTrace starts the test program and returns a 30-frame trace of it: 5
// kernel frames (when kallsyms shows addresses), frames in its functions
// and frames in libc.
func benchTrace(b *testing.B) *support.Trace {
	b.Helper()
	bin := buildTestProgram(b)
	syms := filetest.NMFunctions(b, bin)
	pid := startProgram(b, bin)
	base, _ := loadBase(b, pid, bin)
	raw := &support.Trace{PID: uint32(pid), TID: uint32(pid), Comm: "prog", Hash: 42}

	if f, err := os.Open("/proc/kallsyms"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() && len(raw.KernelStack) < 5 {
			fields := strings.Fields(s.Text())
			if len(fields) >= 3 && fields[1] == "T" {
				if addr, _ := strconv.ParseUint(fields[0], 16, 64); addr != 0 {
					raw.KernelStack = append(raw.KernelStack, addr+16)
				}
			}
		}
		f.Close()
	}
	var libc uint64
	entries, _ := proc.FS{Mount: "/proc"}.Maps(uint32(pid), proc.ExecutableMappings)
	for _, e := range entries {
		if strings.Contains(e.Path, "libc") {
			libc = e.Start
		}
	}
	fns := []string{"leaf_fn", "middle_fn", "outer_fn", "main"}
	for i := 0; len(raw.KernelStack)+len(raw.Frames) < 30; i++ {
		addr := base + syms[fns[i%len(fns)]] + uint64(i%3) + 1
		if i%2 == 1 && libc != 0 {
			addr = libc + uint64(i)*0x1000 + 0x10
		}
		raw.Frames = append(raw.Frames, support.Frame{Kind: libpf.FrameNative, Addr: addr, ReturnAddress: i > 0})
	}
	return raw
}

func BenchmarkConvertTrace(b *testing.B) {
	raw := benchTrace(b)
	m, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := m.ConvertTrace(raw); err != nil { // queues files for lines
		b.Fatal(err)
	}
	m.lines.wait()
	tr, _, err := m.ConvertTrace(raw) // warm the caches
	if err != nil {
		b.Fatal(err)
	}
	// libc's frames may come with inlined ones (libc6-dbg).
	machine := 0
	for _, f := range tr.Frames {
		if !f.Inlined {
			machine++
		}
	}
	if machine != 30 || tr.Frames[len(tr.Frames)-1].FunctionName == "" {
		b.Fatalf("conversion %+v", tr.Frames)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := m.ConvertTrace(raw); err != nil {
			b.Fatal(err)
		}
	}
}

type discardReporter struct{}

func (discardReporter) ReportSample(*libpf.Trace, *libpf.SampleMeta) {}

func BenchmarkHandleTraceCached(b *testing.B) {
	raw := benchTrace(b)
	m, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	h, err := NewHandler(m, discardReporter{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	h.HandleTrace(raw)
	h.Flush() // its process set up
	m.lines.wait()
	h.HandleTrace(raw) // converted again with its files' lines
	b.ReportAllocs()
	for b.Loop() {
		h.HandleTrace(raw)
	}
	if s := h.Stats(); s.TraceCacheMisses != 2 {
		b.Errorf("stats %+v", s)
	}
}

// BenchmarkNativeLines: converting benchTrace's trace with source lines,
// per native frame, when every address's answer is cached and when none
// is (the files' debug information stays open: libc's from libc6-dbg).
func BenchmarkNativeLines(b *testing.B) {
	raw := benchTrace(b)
	for _, c := range []struct {
		name  string
		fresh bool
	}{{"cached", false}, {"new addresses", true}} {
		b.Run(c.name, func(b *testing.B) {
			m, err := New(Config{})
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := m.ConvertTrace(raw); err != nil { // queues the files
				b.Fatal(err)
			}
			m.lines.wait()
			if st := m.Stats(); st.DebugFilesOpened["build-id"] == 0 {
				b.Fatalf("libc's debug file was not opened: %+v", st.DebugFilesOpened)
			}
			for b.Loop() {
				if c.fresh {
					m.lines.results = libpf.NewLRU[lineKey, []debuginfo.Frame](maxLineResults, 0)
				}
				if _, _, err := m.ConvertTrace(raw); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(raw.Frames)), "ns/frame")
		})
	}
}

package processmanager

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/support"
)

func TestParseKallsyms(t *testing.T) {
	// Unsorted like the real file: modules follow the image, and data
	// symbols (d, b, r, A) are skipped.
	const input = "ffffffff81000000 T _stext\n" +
		"ffffffff81000000 t startup_64\n" +
		"ffffffffc0a01000 t ext4_read\t[ext4]\n" +
		"ffffffff81001000 T schedule\n" +
		"ffffffff82000000 D some_data\n" +
		"ffffffffc0a02000 T ext4_write\t[ext4]\n" +
		"ffffffff81000800 W weak_fn\n" +
		"ffffffff81001ff0 T __pfx_padded\n" + // padding, then its function
		"ffffffff81002000 T padded\n" +
		"ffffffff81002ff0 t __pfx_lone\n" + // padding of a function not listed
		"ffffffff81003000 t __pfx_\n" +
		"ffffffffc0b00000 t bpf_prog_abc_handler\t[bpf]\n" +
		"0000000000000000 A fixed_percpu_data\n"
	k, err := parseKallsyms(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr         uint64
		name, module string
		ok           bool
	}{
		{0xffffffff80ffffff, "", "", false},
		{0xffffffff81000000, "_stext", vmlinuxName, true}, // global before local at one address
		{0xffffffff81000900, "weak_fn", vmlinuxName, true},
		{0xffffffff81001234, "schedule", vmlinuxName, true},
		{0xffffffff81001ff8, "__pfx_padded", vmlinuxName, true},
		{0xffffffff81002000, "padded", vmlinuxName, true},
		{0xffffffff81002ff0, "__pfx_lone", vmlinuxName, true},
		{0xffffffff81003001, "__pfx_", vmlinuxName, true},
		{0xffffffffc0a01010, "ext4_read", "ext4", true},
		{0xffffffffc0a02000, "ext4_write", "ext4", true},
		{0xffffffffc0b00010, "bpf_prog_abc_handler", "bpf", true},
		{0xffffffffc0b00000 + maxKernelSymbolSize, "", "", false}, // far past the last symbol
	}
	for _, tt := range tests {
		name, mod, ok := k.lookup(tt.addr)
		if ok != tt.ok || name != tt.name || (ok && k.modules[mod].name != tt.module) {
			t.Errorf("lookup(%#x) = %q, %q, %v; want %q, %q, %v",
				tt.addr, name, k.modules[mod].name, ok, tt.name, tt.module, tt.ok)
		}
	}
	if k.hidden {
		t.Error("hidden set with real addresses")
	}
	if want := len("_stextstartup_64ext4_readscheduleext4_writeweak_fnpaddedlonebpf_prog_abc_handler__pfx_"); len(k.names) != want {
		t.Errorf("names take %d bytes, want %d (padding symbols share their function's)", len(k.names), want)
	}
	if m := k.modules[1]; m.name != "ext4" || m.low != 0xffffffffc0a01000 || m.high != 0xffffffffc0a02000 {
		t.Errorf("ext4 range %+v", m)
	}
}

func TestParseKallsymsErrors(t *testing.T) {
	tests := []struct {
		name, input string
		wantErr     bool
		wantHidden  bool
	}{
		{name: "empty", input: ""},
		{name: "zero addresses", input: "0000000000000000 T _stext\n0000000000000000 t foo\t[mod]\n", wantHidden: true},
		{name: "bad address", input: "xyz T foo\n", wantErr: true},
		{name: "missing type", input: "ffffffff81000000\n", wantErr: true},
		{name: "long type", input: "ffffffff81000000 TT foo\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := parseKallsyms(strings.NewReader(tt.input))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if k.hidden != tt.wantHidden {
				t.Errorf("hidden = %v", k.hidden)
			}
			if _, _, ok := k.lookup(0xffffffff81000010); ok {
				t.Error("lookup succeeded without usable symbols")
			}
		})
	}
}

func FuzzParseKallsyms(f *testing.F) {
	f.Add("ffffffff81000000 T _stext\nffffffffc0a01000 t ext4_read\t[ext4]\n")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseKallsyms(strings.NewReader(s))
		if err == nil {
			k.lookup(0xffffffff81000000)
		}
	})
}

// buildIDNote encodes a GNU build id note (type NT_GNU_BUILD_ID, 3), as
// /sys/kernel/notes and a module's notes hold it.
func buildIDNote(id []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, 4) // len("GNU\x00")
	b = binary.NativeEndian.AppendUint32(b, uint32(len(id)))
	b = binary.NativeEndian.AppendUint32(b, 3)
	b = append(b, "GNU\x00"...)
	b = append(b, id...)
	return append(b, make([]byte, (4-len(id)%4)%4)...)
}

// fakeKernel lays out procfs and sysfs files for a kernel with one module.
func fakeKernel(t *testing.T, kallsyms string) (procFS, sysFS string) {
	t.Helper()
	procFS, sysFS = t.TempDir(), t.TempDir()
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(procFS+"/kallsyms", []byte(kallsyms))
	if err := os.Mkdir(procFS+"/self", 0o755); err != nil {
		t.Fatal(err)
	}
	write(sysFS+"/kernel/notes", buildIDNote([]byte{0xab, 0xcd}))
	write(sysFS+"/module/ext4/notes/.note.gnu.build-id", buildIDNote([]byte{0x12, 0x34}))
	return procFS, sysFS
}

func TestKernelFrames(t *testing.T) {
	procFS, sysFS := fakeKernel(t, "ffffffff81000000 T _stext\n"+
		"ffffffff81001000 T schedule\n"+
		"ffffffff81002000 T do_syscall_64\n"+
		"ffffffffc0a01000 t ext4_read\t[ext4]\n"+
		"ffffffffc0b00000 t bpf_prog_x\t[bpf]\n")
	m, err := New(Config{ProcFS: procFS, SysFS: sysFS})
	if err != nil {
		t.Fatal(err)
	}
	frames := []uint64{
		0xffffffff81001000, // interrupted: used as is
		0xffffffff81002000, // return address at a function's start: the call was in schedule
		0xffffffffc0a01010,
		0xffffffffc0b00008,
	}
	k := m.kernel
	want := []struct {
		name, path, buildID string
		addr                uint64
	}{
		{"schedule", vmlinuxName, "abcd", 0xffffffff81001000},
		{"schedule", vmlinuxName, "abcd", 0xffffffff81001fff},
		{"ext4_read", "[ext4]", "1234", 0xffffffffc0a0100f},
		{"bpf_prog_x", "[bpf]", "", 0xffffffffc0b00007},
	}
	for i, addr := range frames {
		f := k.frame(addr, i > 0)
		w := want[i]
		if f.Kind != libpf.FrameKernel || f.FunctionName != w.name || f.Address != w.addr ||
			f.Mapping.Path != w.path || f.Mapping.GNUBuildID != w.buildID || f.Mapping.Bias != 0 {
			t.Errorf("frame %d = %+v %+v; want %+v", i, f, *f.Mapping, w)
		}
		if w.buildID != "" && f.Mapping.FileID != libpf.FileIDFromKernelBuildID(w.buildID) {
			t.Errorf("frame %d file id %s", i, f.Mapping.FileID)
		}
		if w.buildID == "" && !f.Mapping.FileID.IsZero() {
			t.Errorf("frame %d of a pseudo module has file id %s", i, f.Mapping.FileID)
		}
	}
	if a, b := k.frame(frames[2], true), k.frame(frames[2]+4, true); a.Mapping != b.Mapping {
		t.Error("frames of one module do not share its mapping")
	}
}

func TestKernelFramesHidden(t *testing.T) {
	procFS, sysFS := fakeKernel(t, "0000000000000000 T _stext\n0000000000000000 T schedule\n")
	var logs bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logs)
	m, err := New(Config{ProcFS: procFS, SysFS: sysFS, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	m.ReloadKernelSymbols()
	if n := strings.Count(logs.String(), "only zero addresses"); n != 1 {
		t.Errorf("warned %d times about hidden kernel addresses:\n%s", n, logs.String())
	}
	f := m.kernel.frame(0xffffffff81001000, false)
	if f.FunctionName != "" || f.Mapping.Path != vmlinuxName || f.Mapping.GNUBuildID != "abcd" {
		t.Errorf("frame %+v %+v", f, *f.Mapping)
	}
}

// TestReloadKernelSymbols: a reload that reads the same kallsyms keeps the
// table (the names held traces point into stay the only copy); one that
// reads a changed kallsyms symbolizes with the new table.
func TestReloadKernelSymbols(t *testing.T) {
	procFS, sysFS := fakeKernel(t, "ffffffff81000000 T _stext\nffffffff81001000 T schedule\n")
	m, err := New(Config{ProcFS: procFS, SysFS: sysFS})
	if err != nil {
		t.Fatal(err)
	}
	first := m.kernel
	m.ReloadKernelSymbols()
	if m.kernel != first {
		t.Error("an unchanged kallsyms was parsed into a new table")
	}
	changed := "ffffffff81000000 T _stext\nffffffff81001000 T schedule\nffffffff81002000 T bpf_prog_0123_new\n"
	if err := os.WriteFile(procFS+"/kallsyms", []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	m.ReloadKernelSymbols()
	if f := m.kernel.frame(0xffffffff81002010, false); m.kernel == first || f.FunctionName != "bpf_prog_0123_new" {
		t.Errorf("after kallsyms changed: frame named %q, table replaced: %v", f.FunctionName, m.kernel != first)
	}
}

// TestRealKallsyms symbolizes the running kernel's schedule().
func TestRealKallsyms(t *testing.T) {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	// Every text symbol alone at its address is found by it, as named.
	var addr uint64
	named := map[uint64]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 3 || !strings.Contains("tTwW", fields[1]) {
			continue
		}
		a, _ := strconv.ParseUint(fields[0], 16, 64)
		if _, dup := named[a]; dup {
			named[a] = ""
		} else {
			named[a] = fields[2]
		}
		if fields[2] == "schedule" {
			addr = a
		}
	}
	if addr == 0 {
		t.Skip("kallsyms hides addresses or has no schedule")
	}
	k, err := loadKallsyms(proc.FS{Mount: "/proc"})
	if err != nil {
		t.Fatal(err)
	}
	wrong := 0
	for a, want := range named {
		if name, _, ok := k.lookup(a); want != "" && (!ok || name != want) {
			if wrong++; wrong <= 5 {
				t.Errorf("lookup(%#x) = %q, %v; want %q", a, name, ok, want)
			}
		}
	}
	t.Logf("%d symbols, %d bytes of names", len(named), len(k.names))
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	// PID 0 is the idle task: kernel frames only, no /proc to read.
	tr, info, err := m.ConvertTrace(&support.Trace{PID: 0, KernelStack: []uint64{addr + 1, addr + 8}})
	if err != nil {
		t.Fatal(err)
	}
	if info.ExecutableName != "swapper" {
		t.Errorf("process %+v", info)
	}
	for i, f := range tr.Frames {
		if f.FunctionName != "schedule" || f.Mapping.Path != vmlinuxName {
			t.Errorf("frame %d = %+v", i, f)
		}
	}
	if tr.Frames[0].Address != addr+1 || tr.Frames[1].Address != addr+7 {
		t.Errorf("addresses %#x %#x, want %#x %#x", tr.Frames[0].Address, tr.Frames[1].Address, addr+1, addr+7)
	}
	if tr.Frames[0].Mapping.FileID.IsZero() {
		t.Log("kernel has no build id in /sys/kernel/notes")
	}
}

// BenchmarkLoadKallsyms: reading and parsing the host's /proc/kallsyms,
// which the daemon does at start; B/op is its allocations.
func BenchmarkLoadKallsyms(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		k, err := loadKallsyms(proc.FS{Mount: "/proc"})
		if err != nil {
			b.Fatal(err)
		}
		if len(k.syms) == 0 {
			b.Fatal("no symbols")
		}
	}
}

// TestTracingFrames: an off-CPU trace's stack loses the BPF program and
// tracepoint frames above the scheduler, named or not, and nothing
// without kernel symbols.
func TestTracingFrames(t *testing.T) {
	k := func(names ...string) []libpf.Frame {
		fs := make([]libpf.Frame, len(names))
		for i, n := range names {
			fs[i] = libpf.Frame{Kind: libpf.FrameKernel, FunctionName: n}
		}
		return fs
	}
	for _, c := range []struct {
		frames []libpf.Frame
		want   int
	}{
		{k("bpf_prog_1ea9_off_cpu_switch", "bpf_trace_run4", "__schedule", "schedule"), 2},
		{k("", "bpf_trace_run4", "__bpf_trace_sched_switch", "__schedule"), 3},
		{k("", "", "", "", ""), 0},
		{k("__schedule", "schedule"), 0},
		{nil, 0},
	} {
		if got := tracingFrames(c.frames); got != c.want {
			t.Errorf("%v: %d tracing frames, want %d", c.frames, got, c.want)
		}
	}
}

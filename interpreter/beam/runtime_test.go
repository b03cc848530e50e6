package beam

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirror of struct beam_proc has its C layout.
func TestUnwinderStructs(t *testing.T) {
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	if err := shared.CheckMirror("beam_proc", UnwinderProc{}); err != nil {
		t.Error(err)
	}
}

// TestRecognise: every fetched beam.smp (OTP 27 and 29, amd64 and arm64)
// is recognised with its ERTS version and tables; the same file under
// another ERTS version's directory is refused with a reason naming the
// version; other files are not the runtime's.
func TestRecognise(t *testing.T) {
	forEachBeamSMP(t, func(t *testing.T, v, arch, path string, f *elf.File) {
		bin, err := recognise(&interpreter.File{Path: path, ELF: f})
		if err != nil || bin == nil {
			t.Fatalf("recognise: %v, %v", bin, err)
		}
		b := bin.(*beamBinary)
		if b.err != nil || b.otp != map[string]int{"27": 27, "29": 29}[v] || b.tables.Ranges == 0 {
			t.Fatalf("%s: OTP %d, tables %+v, %v", path, b.otp, b.tables, b.err)
		}
		t.Logf("%s: ERTS %s, OTP %d, ranges %#x, active code index %#x", arch, b.Version(), b.otp, b.tables.Ranges, b.tables.ActiveCodeIndex)

		for _, tc := range []struct{ dir, want string }{
			{"erts-16.0.2", "ERTS 16.0.2 (OTP 28) is not OTP 27 or 29"},
			{"erts-14.2.5", "ERTS 14.2.5 (OTP 26) is not OTP 27 or 29"},
			{"bin", "is not under an erts-X.Y directory"},
		} {
			other, err := recognise(&interpreter.File{Path: "/usr/lib/erlang/" + tc.dir + "/bin/beam.smp", ELF: f})
			if err != nil || other == nil {
				t.Fatalf("%s: %v, %v", tc.dir, other, err)
			}
			if err := other.Unsupported(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want %q", tc.dir, err, tc.want)
			}
			if _, err := other.Attach(nil); err == nil {
				t.Errorf("%s: attached", tc.dir)
			}
		}
		if other, err := recognise(&interpreter.File{Path: strings.TrimSuffix(path, ".smp"), ELF: f}); other != nil || err != nil {
			t.Errorf("beam: %v, %v, want not the runtime's", other, err)
		}
	})
}

// TestJITRegions: the executable view of the JIT's memfd is claimed, its
// writable view and other mappings are not.
func TestJITRegions(t *testing.T) {
	ms := []interpreter.Mapping{
		{Start: 0x1000, End: 0x2000, Path: "/usr/lib/erlang/erts-17.1.1/bin/beam.smp", Executable: true},
		{Start: 0x7f0000000000, End: 0x7f0004000000, Path: "/memfd:vmem"},
		{Start: 0x7f0004000000, End: 0x7f0008000000, Path: "/memfd:vmem", Executable: true},
		{Start: 0x7f0010000000, End: 0x7f0010001000, Path: "/memfd:other", Executable: true},
		{Start: 0x7f0020000000, End: 0x7f0020001000, Executable: true},
	}
	got := jitRegions(ms, 0x7f0020000800)
	want := []interpreter.Region{{Start: 0x7f0004000000, End: 0x7f0008000000, Unwind: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%v, want %v", got, want)
	}
	// +JMsingle: no memfd; the anonymous executable mapping that holds a
	// module is claimed, no other.
	single := []interpreter.Mapping{ms[0], ms[3], ms[4],
		{Start: 0x7f0030000000, End: 0x7f0034000000, Executable: true}}
	for _, tc := range []struct {
		first uint64
		want  []interpreter.Region
	}{
		{0x7f0030001000, []interpreter.Region{{Start: 0x7f0030000000, End: 0x7f0034000000, Unwind: true}}},
		{0x7f0010000800, nil}, // a memfd of another name
		{0x1800, nil},         // the emulator's file
		{0, nil},              // no module known yet
	} {
		if got := jitRegions(single, tc.first); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("+JMsingle, first module at %#x: %v, want %v", tc.first, got, tc.want)
		}
	}
}

// fakeNamer names one PC and knows no function at any other.
type fakeNamer struct{ pc uint64 }

func (n fakeNamer) frame(pc uint64, ra bool) (libpf.Frame, error) {
	switch {
	case pc == n.pc:
		return libpf.Frame{FunctionName: "m:f/1", SourceLine: 3}, nil
	case pc == 0:
		return libpf.Frame{}, errBadObject
	}
	return libpf.Frame{}, fmt.Errorf("%w: %#x", errNoFunction, pc)
}

// TestSymbolize: a frame in an Erlang function is named by the
// symbolizer; one in the JIT's shared code is named as such; a failed read
// is an error; after Detach every frame is.
func TestSymbolize(t *testing.T) {
	p := &process{names: fakeNamer{pc: 0x1000}}
	for _, tc := range []struct {
		f    support.Frame
		want string
		err  error
	}{
		{support.Frame{Kind: Kind, Addr: 0x1000}, "m:f/1", nil},
		{support.Frame{Kind: Kind, Addr: 0x2000, ReturnAddress: true}, sharedCodeName, nil},
		{support.Frame{Kind: Kind, Addr: 0x2000}, sharedCodeName, nil},
		{support.Frame{Kind: Kind}, "", errBadObject},
	} {
		out, err := p.Symbolize(tc.f, nil)
		switch {
		case !errors.Is(err, tc.err):
			t.Errorf("%+v: %v, want %v", tc.f, err, tc.err)
		case err != nil && len(out) != 0:
			t.Errorf("%+v: %v with frames %v", tc.f, err, out)
		case err == nil && (len(out) != 1 || out[0].FunctionName != tc.want || out[0].Kind != Kind):
			t.Errorf("%+v: %+v, want one frame %q", tc.f, out, tc.want)
		}
	}
	p.Detach()
	if _, err := p.Symbolize(support.Frame{Kind: Kind, Addr: 0x1000}, nil); !errors.Is(err, interpreter.ErrDetached) {
		t.Errorf("after Detach: %v", err)
	}
}

package perl

import (
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/support"
)

// TestUnwinderStructs: the Go mirrors of the Perl unwinder's structs have
// their C layouts, the frame tags their C values, and every layout offered
// is one the unwinder reads.
func TestUnwinderStructs(t *testing.T) {
	shared, err := support.LoadShared()
	if err != nil {
		t.Fatal(err)
	}
	for name, mirror := range map[string]any{"perl_proc": UnwinderProc{}, "perl_si": unwinderSI{}, "perl_cx": unwinderCX{}} {
		if err := shared.CheckMirror(name, mirror); err != nil {
			t.Error(err)
		}
	}
	tags, err := shared.EnumValues("perl_frame_tag")
	if err != nil {
		t.Fatal(err)
	}
	if tags["PERL_FRAME_MAIN"] != frameMain || tags["PERL_FRAME_EVAL"] != frameEval {
		t.Errorf("frame tags %v, Go has main %#x, eval %#x", tags, frameMain, frameEval)
	}
	for arch, byMinor := range layouts {
		for minor, l := range byMinor {
			if !readsLayout(l) {
				t.Errorf("5.%d on %s: run levels and contexts not laid out as the unwinder reads them: %+v", minor, arch, l)
			}
		}
	}
}

// TestUnknownVersionRefused: a perl whose layout the tables do not have
// (an older one, a newer one, Perl 7) is not unwound, and the reason names
// its version; the versions with a layout are accepted on both
// architectures.
func TestUnknownVersionRefused(t *testing.T) {
	for _, tc := range []struct {
		v    interpreter.Version
		want string // "" for accepted
	}{
		{interpreter.Version{Major: 5, Minor: 30, Patch: 3}, "perl 5.30.3: no struct layout (5.32, 5.34, 5.36, 5.38, 5.40, 5.42 have one)"},
		{interpreter.Version{Major: 5, Minor: 44, Patch: 0}, "perl 5.44.0: no struct layout (5.32, 5.34, 5.36, 5.38, 5.40, 5.42 have one)"},
		{interpreter.Version{Major: 7, Minor: 42}, "perl 7.42.0: no struct layout"},
		{interpreter.Version{Major: 5, Minor: 42, Patch: 3}, ""},
	} {
		for _, arch := range []string{"amd64", "arm64"} {
			l, _ := layoutFor(arch, interpreter.Version{Major: 5, Minor: 42})
			b := &Binary{Version: tc.v, ThrKey: 0x1000, InterpSize: l.InterpSize}
			err := b.checkFor(arch)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%v on %s: %v, want accepted", tc.v, arch, err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Errorf("%v on %s: %v, want %q", tc.v, arch, err, tc.want)
			}
		}
	}
}

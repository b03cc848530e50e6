package python

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDetect finds the interpreter and its version in every CPython on the
// machine (pyenv's shared libpython, Debian's statically linked
// python3.11), and checks them against what the interpreter says of itself.
func TestDetect(t *testing.T) {
	type candidate struct{ file, python string }
	var cands []candidate
	libs, _ := filepath.Glob("/root/.pyenv/versions/3.*/lib/libpython3.*.so.1.0")
	for _, lib := range libs {
		dir := filepath.Dir(filepath.Dir(lib))
		cands = append(cands, candidate{lib, filepath.Join(dir, "bin", "python3")})
	}
	if _, err := os.Stat("/usr/bin/python3.11"); err == nil {
		cands = append(cands, candidate{"/usr/bin/python3.11", "/usr/bin/python3.11"})
	}
	if len(cands) == 0 {
		t.Fatal("no CPython found (pyenv's or /usr/bin/python3.11)")
	}
	for _, c := range cands {
		out, err := exec.Command(c.python, "-c", "import sys; print('%d.%d %d' % sys.version_info[:3])").Output()
		if err != nil {
			t.Errorf("%s: %v", c.python, err)
			continue
		}
		f, err := elf.Open(c.file)
		if err != nil {
			t.Fatal(err)
		}
		in, err := Detect(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", c.file, err)
			continue
		}
		var want Version
		var micro int
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "%d.%d %d", &want.Major, &want.Minor, &micro); err != nil {
			t.Fatalf("%s said %q: %v", c.python, out, err)
		}
		if in.Version != want || (in.Micro != micro && in.Micro != -1) {
			t.Errorf("%s: detected %v micro %d, the interpreter says %v.%d", c.file, in.Version.MajorMinor(), in.Micro, want.MajorMinor(), micro)
		}
		if in.EvalFrame[1] <= in.EvalFrame[0] {
			t.Errorf("%s: _PyEval_EvalFrameDefault range %#x", c.file, in.EvalFrame)
		}
		if in.Debug {
			t.Errorf("%s: taken for a debug build", c.file)
		}
		if (want.Minor >= 7) != (in.Runtime != 0) || (want.Minor == 6) != (in.ThreadStateCurrent != 0) {
			t.Errorf("%s (%v): _PyRuntime %#x, _PyThreadState_Current %#x", c.file, want.MajorMinor(), in.Runtime, in.ThreadStateCurrent)
		}
		t.Logf("%s: %v.%d", c.file, in.Version.MajorMinor(), in.Micro)
	}
}

// TestDebugBuild: Debian's debug interpreter (python3.X-dbg) is CPython,
// known as a debug build, which NewBinary refuses to unwind.
func TestDebugBuild(t *testing.T) {
	debugs, _ := filepath.Glob("/usr/bin/python3.*d")
	if len(debugs) == 0 {
		t.Fatal("no Debian debug interpreter (/usr/bin/python3.Xd; make test-deps installs python3.11-dbg)")
	}
	for _, path := range debugs {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewBinary(f, func() ([][2]uint64, error) { return nil, nil })
		f.Close()
		if err != nil || !b.Debug || b.Err == nil || b.Offsets != nil {
			t.Errorf("%s: %+v, %v; want a debug build that is not unwound", path, b, err)
		}
	}
}

// TestDetectOthers: other programs and broken files are not Python.
func TestDetectOthers(t *testing.T) {
	for _, path := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/proc/self/exe"} {
		f, err := elf.Open(path)
		if err != nil {
			t.Skip(err)
		}
		_, err = Detect(f)
		f.Close()
		if !errors.Is(err, ErrNotPython) {
			t.Errorf("%s: %v, want ErrNotPython", path, err)
		}
	}
	libs, _ := filepath.Glob("/root/.pyenv/versions/3.9*/lib/libpython3.9.so.1.0")
	if len(libs) == 0 {
		t.Skip("no pyenv CPython 3.9")
	}
	data, err := os.ReadFile(libs[0])
	if err != nil {
		t.Fatal(err)
	}
	// The version does not depend on the version string, only the micro
	// release does; a file cut short is an error, not a panic.
	mangled := bytes.ReplaceAll(data, []byte("3.9.18\x00"), []byte("x.y.zz\x00"))
	f, err := elf.NewFile(bytes.NewReader(mangled))
	if err != nil {
		t.Fatal(err)
	}
	if in, err := Detect(f); err != nil || in.Version != (Version{Major: 3, Minor: 9}) || in.Micro != -1 {
		t.Errorf("without its version string: %+v, %v", in, err)
	}
	for _, n := range []int{64, 4096, len(data) / 2} {
		if f, err := elf.NewFile(bytes.NewReader(data[:n])); err == nil {
			Detect(f)
		}
	}
}

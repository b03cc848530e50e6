package python

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

func TestOffsetsFor(t *testing.T) {
	tests := []struct {
		v         Version
		from      ThreadStateSource
		lastiUnit int
	}{
		{Version{Major: 3, Minor: 6}, ThreadStateFromGlobal, 1},
		{Version{Major: 3, Minor: 7}, ThreadStateFromRuntime, 1},
		{Version{Major: 3, Minor: 9}, ThreadStateFromRuntime, 1},
		{Version{Major: 3, Minor: 10}, ThreadStateFromRuntime, 2},
		{Version{Major: 3, Minor: 11}, ThreadStateFromRuntime, 0},
		{Version{Major: 3, Minor: 12}, ThreadStateFromTLS, 0},
		{Version{Major: 3, Minor: 13}, ThreadStateFromTLS, 0},
		{Version{Major: 3, Minor: 14}, ThreadStateFromTLS, 0},
		{Version{Major: 3, Minor: 15}, ThreadStateFromGILStateTLS, 0},
	}
	for _, tt := range tests {
		o, err := OffsetsFor(tt.v)
		if err != nil {
			t.Errorf("OffsetsFor(%s): %v", tt.v.MajorMinor(), err)
			continue
		}
		if o.Version != tt.v || o.Arch != runtime.GOARCH || o.ThreadStateFrom != tt.from || o.LastiUnit != tt.lastiUnit {
			t.Errorf("OffsetsFor(%s) = version %s arch %s from %d lasti unit %d, want %s %s %d %d",
				tt.v.MajorMinor(), o.Version.MajorMinor(), o.Arch, o.ThreadStateFrom, o.LastiUnit, tt.v.MajorMinor(), runtime.GOARCH, tt.from, tt.lastiUnit)
		}
	}
	for _, v := range []Version{{Major: 2, Minor: 7}, {Major: 3, Minor: 5}, {Major: 3, Minor: 16}, {Major: 4, Minor: 0}} {
		_, err := OffsetsFor(v)
		if !errors.Is(err, ErrNoOffsets) || !strings.Contains(err.Error(), v.MajorMinor()) {
			t.Errorf("OffsetsFor(%s) error = %v, want ErrNoOffsets naming %s", v.MajorMinor(), err, v.MajorMinor())
		}
	}
	if _, err := offsetsFor("riscv64", Version{Major: 3, Minor: 11}); !errors.Is(err, ErrNoOffsets) {
		t.Errorf("offsetsFor(riscv64, 3.11) error = %v, want ErrNoOffsets", err)
	}
}

// TestOffsetsConsistent checks what the unwinder relies on in every entry
// of the table: each version has one way to the current frame, one line
// table and one bytecode location, and the fields that go with them.
func TestOffsetsConsistent(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		for _, v := range offTableVersions() {
			o, err := offsetsFor(arch, v)
			if err != nil {
				t.Error(err)
				continue
			}
			for _, p := range offProblems(o) {
				t.Errorf("%s %s: %s", o.Version.MajorMinor(), arch, p)
			}
		}
	}
}

// TestOffsetsArchitectures checks that amd64 and arm64 differ only in
// _PyRuntimeState, which holds glibc types of different sizes: in 3.7-3.11
// the GIL's pthread_mutex_t (40 bytes on amd64, 48 on arm64) precedes
// gilstate.
func TestOffsetsArchitectures(t *testing.T) {
	for _, v := range offTableVersions() {
		amd, err1 := offsetsFor("amd64", v)
		arm, err2 := offsetsFor("arm64", v)
		if err := errors.Join(err1, err2); err != nil {
			t.Error(err)
			continue
		}
		la, lb := offLeaves(amd), offLeaves(arm)
		for k, val := range la {
			if lb[k] != val && !strings.HasPrefix(k, "Runtime.") {
				t.Errorf("%s %s: amd64 %d, arm64 %d", v.MajorMinor(), k, val, lb[k])
			}
		}
	}
}

func offProblems(o *Offsets) []string {
	var ps []string
	check := func(ok bool, what string) {
		if !ok {
			ps = append(ps, what)
		}
	}
	set := func(vs ...int) bool {
		for _, v := range vs {
			if v == NoField {
				return false
			}
		}
		return true
	}
	ts, f, cf := o.ThreadState, o.InterpreterFrame, o.CFrame
	switch minor := o.Version.Minor; {
	case minor <= 10:
		fo := o.FrameObject
		check(set(ts.Frame, fo.Back, fo.Code, fo.Lasti, o.Code.Code), "frame object fields missing")
		check(f.Size == NoField && ts.CurrentFrame == NoField, "interpreter frame fields before 3.11")
	case minor <= 12:
		check(set(ts.CFrame, cf.CurrentFrame, f.Code, f.PrevInstr, f.Previous, o.Code.CodeAdaptive),
			"3.11/3.12 frame fields missing")
		check(ts.Frame == NoField && f.Executable == NoField && f.InstrPtr == NoField, "fields of other versions set")
	default:
		check(set(ts.CurrentFrame, f.Executable, f.InstrPtr, f.Previous, o.Code.CodeAdaptive, o.Debug.Size) &&
			(set(f.OwnedByCStack) || set(f.OwnedByInterpreter)), "3.13+ frame fields missing")
		check(ts.Frame == NoField && ts.CFrame == NoField && f.Code == NoField, "fields of other versions set")
	}
	check(set(o.Code.Lnotab) != set(o.Code.Linetable), "not exactly one line table")
	check(set(o.Code.Code) != set(o.Code.CodeAdaptive), "not exactly one bytecode location")
	check(set(o.Code.Filename, o.Code.Name, o.Code.FirstLineno, o.Object.Type, o.Type.Name, o.Bytes.Data,
		o.Unicode.State, o.Unicode.ASCIISize, o.Unicode.CompactSize, o.Unicode.KindShift), "symbolizer fields missing")
	switch o.ThreadStateFrom {
	case ThreadStateFromGlobal:
		check(o.Runtime.Size == NoField, "_PyRuntime before 3.7")
	case ThreadStateFromRuntime:
		check(set(o.Runtime.TStateCurrent, o.Runtime.AutoTSSKey, o.TSS.Key), "_PyRuntime thread state fields missing")
	case ThreadStateFromTLS:
		check(set(o.Runtime.AutoTSSKey, o.TSS.Key) && o.Runtime.TStateCurrent == NoField, "3.12+ runtime fields")
	case ThreadStateFromGILStateTLS:
		check(o.Runtime.AutoTSSKey == NoField && o.Runtime.TStateCurrent == NoField, "3.15+ runtime fields")
	default:
		ps = append(ps, "no thread state source")
	}
	return ps
}

// offLeaves flattens the compiled fields of o into "Group.Field" values.
func offLeaves(o *Offsets) map[string]int {
	leaves := map[string]int{}
	ov := reflect.ValueOf(o).Elem()
	for i := range ov.NumField() {
		g, gf := ov.Field(i), ov.Type().Field(i)
		if g.Kind() != reflect.Struct || gf.Name == "Version" {
			continue
		}
		for j := range g.NumField() {
			leaves[gf.Name+"."+g.Type().Field(j).Name] = int(g.Field(j).Int())
		}
	}
	return leaves
}

// offTableVersions lists the versions in the table, oldest first.
func offTableVersions() []Version {
	var vs []Version
	for _, o := range generatedOffsets {
		if !slices.Contains(vs, o.Version) {
			vs = append(vs, o.Version)
		}
	}
	return vs
}

// offFetchedVersions are the releases utils/pyoffsets takes by default
// from utils/pyfetch's cache of Debian's packages (its -fetched flag):
// those pyenv has no headers for here.
var offFetchedVersions = pyfetch.Fetched

// offFetchPython runs utils/pyfetch/fetch-python.sh for CPython version
// on the Debian architecture arch (amd64 and arm64 are named as in Go) and
// returns the cache directory it unpacks into, base/python-VERSION-ARCH.
// The script reuses a finished cache without network. It fails the test
// rather than skipping it: the table's values for version would go
// unchecked.
func offFetchPython(t testing.TB, version, arch string) (base, wrapper string) {
	t.Helper()
	script := filepath.Join("..", "..", "utils", "pyfetch", "fetch-python.sh")
	cmd := exec.Command(script, version, arch)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fetching Debian's CPython %s for %s: %v\n%s\nrun utils/pyfetch/fetch-python.sh %s %s "+
			"(as .ci/install-test-deps.sh does)", version, arch, err, stderr.String(), version, arch)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	wrapper = lines[len(lines)-1]
	// The wrapper is base/python-VERSION-ARCH/bin/python3.
	return filepath.Dir(filepath.Dir(filepath.Dir(wrapper))), wrapper
}

// offPyenvVersions is where pyenv keeps its CPythons.
func offPyenvVersions() string { return pyfetch.PyenvVersions() }

// offCompiled is one layout utils/pyoffsets -json prints.
type offCompiled struct {
	Version, Release, Arch, Origin string
	Entries                        []struct {
		Key   string
		Kind  string
		Value int
	}
}

// TestOffsetsMatchHeaders compiles utils/pyoffsets' C program against
// the headers of every CPython pyenv installed and of Debian's releases
// that utils/pyfetch fetches, for amd64 and (with the cross compiler)
// arm64, and compares each value with the table: a mismatch means the
// table is stale or was edited by hand.
func TestOffsetsMatchHeaders(t *testing.T) {
	versions := offPyenvVersions()
	if versions == "" {
		t.Fatal("no pyenv CPython installed ($PYENV_ROOT/versions, ~/.pyenv/versions): nothing to check the table against")
	}
	arches := []string{"amd64"}
	_, err := exec.LookPath("aarch64-linux-gnu-gcc")
	if err == nil && offHaveFile("/usr/aarch64-linux-gnu/include/stdio.h") {
		arches = append(arches, "arm64")
	} else {
		t.Log("not checking arm64: needs aarch64-linux-gnu-gcc and libc6-dev-arm64-cross")
	}
	var cache string
	for _, arch := range arches {
		for _, v := range offFetchedVersions {
			cache, _ = offFetchPython(t, v, arch)
		}
	}
	compiled := offRunGenerator(t, versions, cache, arches)
	checked := 0
	for _, c := range compiled {
		var v Version
		if _, err := fmt.Sscanf(c.Version, "%d.%d", &v.Major, &v.Minor); err != nil {
			t.Fatalf("version %q: %v", c.Version, err)
		}
		o, err := offsetsFor(c.Arch, v)
		if err != nil {
			t.Errorf("CPython %s is installed but not in the table: run go generate ./interpreter/python (%v)", c.Release, err)
			continue
		}
		leaves := offLeaves(o)
		for _, e := range c.Entries {
			got, ok := leaves[e.Key]
			if !ok {
				t.Errorf("%s %s: the headers give %s, which the table lacks", c.Release, c.Arch, e.Key)
			} else if got != e.Value {
				t.Errorf("%s %s: %s is %d in the table, %d in the headers", c.Release, c.Arch, e.Key, got, e.Value)
			}
			delete(leaves, e.Key)
		}
		for k := range leaves {
			t.Errorf("%s %s: the headers give no %s", c.Release, c.Arch, k)
		}
		if !t.Failed() {
			t.Logf("%s %s: %d values match CPython %s, %s", v.MajorMinor(), c.Arch, len(c.Entries), c.Release, c.Origin)
		}
		checked++
	}
	if checked == 0 {
		t.Fatalf("no installed CPython under %s to check the table against", versions)
	}
	for _, o := range generatedOffsets {
		if !offCompiledHas(compiled, o.Version, o.Arch) {
			t.Logf("%s %s: skipped, not installed (or not compiled) here", o.Version.MajorMinor(), o.Arch)
		}
	}
}

func offRunGenerator(t *testing.T, versions, cache string, arches []string) []offCompiled {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goTool, "run", "../../utils/pyoffsets", "-json",
		"-pyenv", versions, "-cache", cache, "-fetched", strings.Join(offFetchedVersions, ","),
		"-arch", strings.Join(arches, ","))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("utils/pyoffsets: %v\n%s", err, stderr.String())
	}
	var compiled []offCompiled
	if err := json.Unmarshal(out, &compiled); err != nil {
		t.Fatalf("utils/pyoffsets output: %v", err)
	}
	return compiled
}

func offCompiledHas(cs []offCompiled, v Version, arch string) bool {
	for _, c := range cs {
		if c.Version == v.MajorMinor() && c.Arch == arch {
			return true
		}
	}
	return false
}

func offHaveFile(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

package python

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// symTargetsScript defines functions of every shape, prints their code
// objects and the lines CPython gives their offsets, and waits; see its
// header.
//
//go:embed testdata/symbolize/targets.py
var symTargetsScript []byte

type symTargets struct {
	Version string            `json:"version"`
	Codes   []symTarget       `json:"codes"`
	NotCode map[string]uint64 `json:"not_code"`
}

type symTarget struct {
	Label       string  `json:"label"`
	ID          uint64  `json:"id"`
	Name        string  `json:"name"`
	Qualname    *string `json:"qualname"`
	Filename    string  `json:"filename"`
	FirstLineno int     `json:"firstlineno"`
	// Lines are [offset, line] pairs, line null where CPython has none.
	Lines [][2]*int `json:"lines"`
}

// symPythons finds every pyenv CPython 3.
func symPythons() []string {
	versions := offPyenvVersions()
	if versions == "" {
		return nil
	}
	found, _ := filepath.Glob(filepath.Join(versions, "3.*", "bin", "python3"))
	sort.Strings(found)
	return found
}

// TestSymbolizerAgainstCPython runs targets.py under every pyenv CPython
// and symbolizes its code objects, at every instruction offset, from the
// live process's memory, with the version Detect finds in the libpython
// the process mapped.
func TestSymbolizerAgainstCPython(t *testing.T) {
	pythons := symPythons()
	if len(pythons) == 0 {
		t.Fatal("no CPython 3 found in pyenv's versions ($PYENV_ROOT, ~/.pyenv or /root/.pyenv)")
	}
	script := filepath.Join(t.TempDir(), "symbolize_targets.py")
	if err := os.WriteFile(script, symTargetsScript, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, py := range pythons {
		t.Run(filepath.Base(filepath.Dir(filepath.Dir(py))), func(t *testing.T) {
			t.Parallel()
			symCheckAgainst(t, py, script)
		})
	}
}

// symStart runs the targets script under python, isolated from the
// environment and the user's site, and returns what it printed and its
// pid; the process ends with the test.
func symStart(t testing.TB, python, script string) (symTargets, int) {
	return symStartWith(t, python, "-I", script)
}

// symStartWith is symStart with python's flag isolate: "-s" for the
// wrappers of utils/pyfetch, which find their library through PYTHONHOME
// (that -I would ignore).
func symStartWith(t testing.TB, python, isolate, script string) (symTargets, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	cmd := exec.CommandContext(ctx, python, isolate, script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the script exits when stdin closes
		_ = cmd.Wait()
		cancel()
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("%s: %v; stderr: %s", python, err, stderr.Bytes())
	}
	var targets symTargets
	if err := json.Unmarshal(line, &targets); err != nil {
		t.Fatalf("%s: %v", python, err)
	}
	return targets, cmd.Process.Pid
}

func symCheckAgainst(t *testing.T, python, script string) {
	targets, pid := symStart(t, python, script)
	in, lib := symDetect(t, pid)
	if !strings.HasPrefix(targets.Version, in.Version.MajorMinor()+".") {
		t.Fatalf("%s detected as %v in %s, but it is %s", python, in.Version.MajorMinor(), lib, targets.Version)
	}
	off, err := OffsetsFor(in.Version)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	s, err := NewSymbolizer(mem, off)
	if err != nil {
		t.Fatal(err)
	}

	var frames, noLine, failures int
	fail := func(format string, args ...any) {
		if failures++; failures <= 10 {
			t.Errorf("%s: "+format, append([]any{targets.Version}, args...)...)
		}
	}
	for _, c := range targets.Codes {
		if (c.Qualname != nil) != (off.Code.Qualname >= 0) {
			fail("%s: co_qualname %v, but the offsets say %d", c.Label, c.Qualname, off.Code.Qualname)
		}
		name := c.Name
		if c.Qualname != nil {
			name = *c.Qualname
		}
		want := Frame{FunctionName: name, FileName: c.Filename, Line: c.FirstLineno, FirstLine: c.FirstLineno}
		if got, err := s.Frame(c.ID, OffsetNotStarted); err != nil || got != want {
			fail("%s not started: got %+v, %v; want %+v", c.Label, got, err, want)
		}
		for _, ol := range c.Lines {
			want.Line = 0
			if ol[1] != nil {
				want.Line = *ol[1]
			} else {
				noLine++
			}
			got, err := s.Frame(c.ID, uint32(*ol[0]))
			if err != nil || got != want {
				fail("%s offset %d: got %+v, %v; want %+v", c.Label, *ol[0], got, err, want)
			}
			frames++
		}
	}
	for what, addr := range targets.NotCode {
		if f, err := s.Frame(addr, 0); !errors.Is(err, ErrNotCode) {
			fail("a %s at %#x: got %+v, %v; want ErrNotCode", what, addr, f, err)
		}
	}
	// One miss per code object and per object refused, the rest hits.
	st := s.Stats()
	if wantMisses := uint64(len(targets.Codes) + len(targets.NotCode)); st.Misses != wantMisses || st.Stale != 0 {
		fail("cache %+v, want %d misses and none stale", st, wantMisses)
	}
	t.Logf("%s (%s): %d code objects, %d frames (%d without a line), %d not-code objects refused; %+v",
		targets.Version, filepath.Base(lib), len(targets.Codes), frames+len(targets.Codes), noLine, len(targets.NotCode), st)
}

// symDetect finds the CPython a process runs among the files it mapped.
func symDetect(t testing.TB, pid int) (*Interpreter, string) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for l := range strings.Lines(string(maps)) {
		fields := strings.Fields(l)
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") || seen[fields[5]] {
			continue
		}
		path := fields[5]
		seen[path] = true
		f, err := elf.Open(path)
		if err != nil {
			continue
		}
		in, err := Detect(f)
		f.Close()
		if err == nil {
			return in, path
		}
		if !errors.Is(err, ErrNotPython) {
			t.Fatalf("%s: %v", path, err)
		}
	}
	t.Fatalf("process %d maps no CPython", pid)
	return nil, ""
}

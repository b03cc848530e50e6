package python

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

// offEncodeDebug lays the table's values for o out the way a process of
// that version publishes them in _Py_DebugOffsets.
func offEncodeDebug(t *testing.T, o *Offsets, hex uint64) []byte {
	t.Helper()
	raw := make([]byte, o.Debug.Size)
	copy(raw, debugCookie)
	binary.NativeEndian.PutUint64(raw[o.Debug.Version:], hex)
	for _, tg := range o.debugTargets() {
		binary.NativeEndian.PutUint64(raw[tg.at:], uint64(*tg.field))
	}
	return raw
}

// TestDecodeDebugOffsets encodes each version's table values as its
// processes publish them and decodes them back, edited.
func TestDecodeDebugOffsets(t *testing.T) {
	for _, v := range offTableVersions() {
		table, err := OffsetsFor(v)
		if err != nil {
			t.Fatal(err)
		}
		if table.Debug.Size == NoField {
			continue
		}
		t.Run(v.MajorMinor(), func(t *testing.T) { offTestDecodeDebug(t, table) })
	}
}

func offTestDecodeDebug(t *testing.T, table *Offsets) {
	d := table.Debug
	hexOf := func(minor, patch int) uint64 { return uint64(3<<24 | minor<<16 | patch<<8 | 0xf0) }
	minor := table.Version.Minor
	put := func(at int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { binary.NativeEndian.PutUint64(b[at:], v); return b }
	}
	tests := []struct {
		name    string
		edit    func([]byte) []byte
		wantErr error // nil: decodes
		errText string
		check   func(*Offsets) bool
	}{
		{name: "the table's own values", edit: func(b []byte) []byte { return b },
			check: func(o *Offsets) bool { return offEqual(o, table) }},
		{name: "a published value wins", edit: put(d.ThreadStateCurrentFrame, 80),
			check: func(o *Offsets) bool { return o.ThreadState.CurrentFrame == 80 && o.Code.Name == table.Code.Name }},
		{name: "a patch release", edit: put(d.Version, hexOf(minor, 5)),
			check: func(o *Offsets) bool { return o.Version == table.Version }},
		{name: "no cookie", edit: func(b []byte) []byte { copy(b, "xdebugpz"); return b }, wantErr: ErrNoDebugOffsets},
		{name: "too short for the cookie", edit: func(b []byte) []byte { return b[:12] }, wantErr: ErrNoDebugOffsets},
		{name: "too short for the layout", edit: func(b []byte) []byte { return b[:d.Size-1] }, errText: "bytes"},
		{name: "unknown version", edit: put(d.Version, hexOf(99, 0)), wantErr: ErrNoOffsets, errText: "3.99"},
		{name: "older version", edit: put(d.Version, hexOf(12, 1)), wantErr: ErrNoOffsets, errText: "3.12"},
		{name: "free-threaded", edit: put(d.FreeThreaded, 1), wantErr: ErrNoOffsets, errText: "free-threaded"},
		{name: "implausible value", edit: put(d.CodeFilename, 1<<40), errText: "implausible"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := DecodeDebugOffsets(tt.edit(offEncodeDebug(t, table, hexOf(minor, 0))))
			if tt.wantErr == nil && tt.errText == "" {
				if err != nil || !tt.check(o) {
					t.Fatalf("DecodeDebugOffsets = %+v, %v", o, err)
				}
				return
			}
			if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) || !strings.Contains(err.Error(), tt.errText) {
				t.Fatalf("DecodeDebugOffsets error = %v, want %v mentioning %q", err, tt.wantErr, tt.errText)
			}
		})
	}
}

func offEqual(a, b *Offsets) bool {
	la, lb := offLeaves(a), offLeaves(b)
	for k, v := range la {
		if lb[k] != v {
			return false
		}
	}
	return a.Version == b.Version && a.ThreadStateFrom == b.ThreadStateFrom && a.LastiUnit == b.LastiUnit
}

// TestDebugOffsetsLive reads the _Py_DebugOffsets of running CPythons
// 3.13+ from their memory, where each interpreter put the offsets it was
// compiled with, and checks that they agree with the table: pyenv's 3.13.0
// and Debian's 3.14 and 3.15, which utils/pyfetch fetches and runs through Debian's
// own dynamic loader (so /proc/PID/exe is ld.so, and _PyRuntime is found
// among the mapped files).
func TestDebugOffsetsLive(t *testing.T) {
	tests := []struct {
		name    string
		version Version
		python  func(t *testing.T) string
	}{
		{"pyenv-3.13.0", Version{Major: 3, Minor: 13}, func(t *testing.T) string {
			python := filepath.Join(offPyenvVersions(), "3.13.0", "bin", "python3.13")
			if offPyenvVersions() == "" || !offHaveFile(python) {
				t.Skip("CPython 3.13.0 is not installed by pyenv")
			}
			return python
		}},
	}
	for _, v := range pyfetch.Fetched {
		var version Version
		if _, err := fmt.Sscanf(v, "%d.%d", &version.Major, &version.Minor); err != nil {
			t.Fatal(err)
		}
		tests = append(tests, struct {
			name    string
			version Version
			python  func(t *testing.T) string
		}{"debian-" + v, version, func(t *testing.T) string {
			_, wrapper := offFetchPython(t, v, runtime.GOARCH)
			return wrapper
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { offCheckLiveDebug(t, tt.python(t), tt.version) })
	}
}

func offCheckLiveDebug(t *testing.T, python string, v Version) {
	cmd := exec.Command(python, "-c", "import time; print('ready', flush=True); time.sleep(60)")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s did not start: %q, %v", python, line, err)
	}
	pid := cmd.Process.Pid

	addr, file, err := offSymbolAddress(pid, RuntimeSymbol)
	if err != nil {
		t.Fatal(err)
	}
	table, err := OffsetsFor(v)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, table.Debug.Size)
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if errors.Is(err, fs.ErrPermission) {
		t.Skipf("reading another process's memory needs root or ptrace rights: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if _, err := mem.ReadAt(raw, int64(addr)); err != nil {
		t.Fatalf("reading %s at %#x: %v", RuntimeSymbol, addr, err)
	}
	hex := binary.NativeEndian.Uint64(raw[table.Debug.Version:])
	if got := (Version{Major: int(hex >> 24 & 0xff), Minor: int(hex >> 16 & 0xff)}); got != v {
		t.Fatalf("PY_VERSION_HEX = %#x, want %s", hex, v.MajorMinor())
	}
	live, err := DecodeDebugOffsets(raw)
	if err != nil {
		t.Fatalf("decoding the %d bytes at %s+%#x in %s: %v", len(raw), RuntimeSymbol, addr, file, err)
	}
	want, got := offLeaves(table), offLeaves(live)
	for k, val := range want {
		if k == "Runtime.Size" && got[k] != val {
			// Read by nothing: the binary's own size is used where one is
			// needed. Debian's 3.15 (gcc 16) has 8 bytes more than this
			// machine's gcc 12 compiles from its headers.
			t.Logf("%s: the process publishes %d, the table has %d", k, got[k], val)
			continue
		}
		if got[k] != val {
			t.Errorf("%s: the process publishes %d, the table has %d", k, got[k], val)
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("the %d offsets CPython %#x (pid %d) publishes at %#x (%s) match the table",
		len(live.debugTargets()), hex, pid, addr, file)
}

// offSymbolAddress finds where symbol is in the memory of pid: in which
// mapped ELF file it is defined, and that file's load bias.
func offSymbolAddress(pid int, symbol string) (uint64, string, error) {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, "", err
	}
	// The address each file's offset 0 is mapped at.
	base := map[string]uint64{}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") || f[2] != "00000000" {
			continue
		}
		start, _, _ := strings.Cut(f[0], "-")
		if a, err := strconv.ParseUint(start, 16, 64); err == nil {
			if _, seen := base[f[5]]; !seen {
				base[f[5]] = a
			}
		}
	}
	for path, start := range base {
		if value, vaddr0, ok := offELFSymbol(path, symbol); ok {
			return start - vaddr0 + value, path, nil
		}
	}
	return 0, "", fmt.Errorf("no mapped file of pid %d defines %s", pid, symbol)
}

// offELFSymbol returns symbol's value in the ELF file at path and the
// virtual address of the file's offset 0.
func offELFSymbol(path, symbol string) (value, vaddr0 uint64, ok bool) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Off == 0 {
			vaddr0 = p.Vaddr
		}
	}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, _ := read()
		for _, s := range syms {
			if s.Name == symbol && s.Section != elf.SHN_UNDEF {
				return s.Value, vaddr0, true
			}
		}
	}
	return 0, 0, false
}

// TestBinaryOffsetsPublished: a binary's offsets are those its
// _Py_DebugOffsets publish where it has them. Debian sid's 3.15 debug build
// publishes a _PyRuntime larger than the table's (the only difference) and
// is read with it; its 3.14 debug build is refused, naming what is missing.
func TestBinaryOffsetsPublished(t *testing.T) {
	offFetchPython(t, "3.15", runtime.GOARCH)
	b := offOpenBinary(t, filepath.Join(pyfetch.Dir("3.15", runtime.GOARCH), "root", "usr", "bin", "python3.15d"))
	if b.Err != nil {
		t.Fatalf("3.15 debug build: %v", b.Err)
	}
	table, err := OffsetsFor(b.Version)
	if err != nil {
		t.Fatal(err)
	}
	if b.Offsets.Runtime.Size <= table.Runtime.Size {
		t.Errorf("3.15 debug build: _PyRuntime of %d bytes, want the published size, larger than the table's %d",
			b.Offsets.Runtime.Size, table.Runtime.Size)
	}
	offFetchPython(t, "3.14", runtime.GOARCH)
	b = offOpenBinary(t, filepath.Join(pyfetch.Dir("3.14", runtime.GOARCH), "root", "usr", "bin", "python3.14d"))
	if b.Err == nil || !strings.Contains(b.Err.Error(), "debug build") || !strings.Contains(b.Err.Error(), "3.14") {
		t.Errorf("3.14 debug build: error %v, want a refusal naming the version and the debug build", b.Err)
	}
}

func offOpenBinary(t *testing.T, path string) *Binary {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%v: make test-deps fetches it (utils/pyfetch)", err)
	}
	t.Cleanup(func() { f.Close() })
	b, err := NewBinary(f, func() ([][2]uint64, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	return b
}

package php

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
)

// detectFile runs Detect on a file as the process manager would.
func detectFile(t testing.TB, path string) *Binary {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	dyn, err := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Detect(f, dyn)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}

// TestDetectNotPHP: other files are not taken for PHP.
func TestDetectNotPHP(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dyn, _ := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	if _, err := Detect(f, dyn); err != ErrNotPHP {
		t.Errorf("test binary: %v, want ErrNotPHP", err)
	}
}

// TestDetect reads the CLI, php-fpm and Apache module of every tested
// release: the version the interpreter states, a layout for it, and the
// dispatch in execute_ex where JIT code is unwound from.
func TestDetect(t *testing.T) {
	for _, v := range phpfetch.Versions {
		b, err := phpfetch.PHP(v)
		if err != nil {
			t.Fatal(err)
		}
		out, err := b.Command("-r", "echo PHP_VERSION;").Output()
		if err != nil {
			t.Fatalf("%s: %v", b.CLI, err)
		}
		// jmp *(%r15)
		checkDetect(t, b, string(out), "\x41\xff\x27", 0)
	}
}

// TestDetectARM64 reads the arm64 builds: the dispatch is ldr x0, [x28];
// br x0, and the body's frame record is 0x40 above its stack pointer
// (internals.md §A.4).
func TestDetectARM64(t *testing.T) {
	for _, v := range phpfetch.Versions {
		b, err := phpfetch.For(v, "arm64")
		if err != nil {
			t.Fatal(err)
		}
		// The Debian version (8.2.36-1~deb12u1) starts with PHP's.
		deb, err := os.ReadFile(filepath.Join(phpfetch.Dir(v, "arm64"), ".complete"))
		if err != nil {
			t.Fatal(err)
		}
		version, _, _ := strings.Cut(string(deb), "-")
		checkDetect(t, b, version, "\x80\x03\x40\xf9\x00\x00\x1f\xd6", 0x40)
	}
}

// checkDetect checks Detect on a build's files: the version, a layout for
// it, the dispatch instructions (code) before the JIT return and the
// body's frame record.
func checkDetect(t *testing.T, b *phpfetch.Build, version, code string, record uint64) {
	t.Helper()
	for _, path := range []string{b.CLI, b.FPM, b.Apache} {
		if path == "" {
			continue
		}
		d := detectFile(t, path)
		if d.Version.String() != version || d.ThreadSafe {
			t.Errorf("%s: version %v (thread-safe %v), want %s, not thread-safe", path, d.Version, d.ThreadSafe, version)
		}
		if _, err := LayoutFor(d.Version); err != nil {
			t.Error(err)
		}
		if d.JITReturn <= d.ExecuteEx[0] || d.JITReturn >= d.ExecuteEx[1] {
			t.Errorf("%s: JIT return %#x outside execute_ex %#x", path, d.JITReturn, d.ExecuteEx)
			continue
		}
		if d.BodyFrameRecord != record {
			t.Errorf("%s: the body's frame record at sp+%#x, want %#x", path, d.BodyFrameRecord, record)
		}
		f, _ := elf.Open(path)
		got, err := interpreter.ReadELF(f, d.JITReturn-uint64(len(code)), uint64(len(code)))
		f.Close()
		if err != nil || string(got) != code {
			t.Errorf("%s: % x before the JIT return, want % x: %v", path, got, code, err)
		}
	}
}

// TestParseVersion covers the version strings releases and builds print.
func TestParseVersion(t *testing.T) {
	for in, want := range map[string]interpreter.Version{
		"8.2.36": {Major: 8, Minor: 2, Patch: 36}, "8.4.0-dev": {Major: 8, Minor: 4}, "8.3.0RC1": {Major: 8, Minor: 3},
	} {
		if got, err := parseVersion(in); err != nil || got != want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "8", "8.2", "x.y.z", "8.2.123456"} {
		if _, err := parseVersion(in); err == nil {
			t.Errorf("parseVersion(%q) succeeded", in)
		}
	}
}

package tlsvar

import (
	"debug/elf"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/pyfetch"
)

// TestFindCPython finds _Py_tss_gilstate from the code of
// PyGILState_GetThisThreadState in Debian's CPython 3.15 (make test-deps
// fetches it) for each TLS model: the python3.15 executable (local-exec;
// on arm64 a TLS descriptor call the linker relaxed, its instructions
// among the prologue's) and libpython3.15.so (local-dynamic on x86_64,
// whose variable offset follows the __tls_get_addr call; a TLS descriptor
// on arm64). The expected values were read off objdump and readelf -r.
func TestFindCPython(t *testing.T) {
	lib := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
	tests := []struct {
		arch, file string
		want       Ref
	}{
		// mov %fs:0xffffffffffffffd8,%rax
		{"amd64", "usr/bin/python3.15", Ref{Offset: 0xffffffffffffffd8}},
		// lea 0x879790(%rip),%rdi; call __tls_get_addr; mov 0x28(%rax),%rax
		{"amd64", "usr/lib/{lib}/libpython3.15.so.1.0", Ref{Index: 0x879790, Offset: 0x28}},
		// mrs x0, tpidr_el0; ...; add x0, x0, #0x20; ...; ldr x0, [x0]
		{"arm64", "usr/bin/python3.15", Ref{Offset: 0x20}},
		// adrp x0, 0x881000; ldr x2, [x0, #736]; add x0, x0, #0x2e0; blr x2
		{"arm64", "usr/lib/{lib}/libpython3.15.so.1.0", Ref{Index: 0x8812e0, Offset: 0x28}},
	}
	for _, tt := range tests {
		file := strings.ReplaceAll(tt.file, "{lib}", lib[tt.arch])
		name := filepath.Join(pyfetch.Dir("3.15", tt.arch), "root", filepath.FromSlash(file))
		t.Run(tt.arch+"/"+filepath.Base(name), func(t *testing.T) {
			f, err := elf.Open(name)
			if err != nil {
				t.Fatalf("%v: make test-deps fetches it (utils/pyfetch/fetch-python.sh 3.15 %s)", err, tt.arch)
			}
			defer f.Close()
			dynsym, err := f.DynamicSymbols()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range dynsym {
				if s.Name != "PyGILState_GetThisThreadState" {
					continue
				}
				got, err := Find(f, s, dynsym)
				if err != nil || got != tt.want {
					t.Fatalf("Find = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			t.Fatal("no PyGILState_GetThisThreadState")
		})
	}
}

// TestFindRefuses: code that reads no thread-local variable is an error,
// not a guess.
func TestFindRefuses(t *testing.T) {
	name := filepath.Join(pyfetch.Dir("3.15", "amd64"), "root", "usr", "bin", "python3.15")
	f, err := elf.Open(name)
	if err != nil {
		t.Fatalf("%v: make test-deps fetches it", err)
	}
	defer f.Close()
	dynsym, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range dynsym {
		if s.Name == "PyLong_FromLong" {
			if got, err := Find(f, s, dynsym); err == nil {
				t.Fatalf("Find(PyLong_FromLong) = %+v, want an error", got)
			}
			return
		}
	}
	t.Fatal("no PyLong_FromLong")
}

// Package filetest has test helpers that read real executable files:
// shared by the tests of processmanager and its sub-packages.
package filetest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
)

// OwnVDSO returns this process's vDSO image: a small, real ELF file with
// .dynsym and notes. It skips the test where there is none.
func OwnVDSO(t testing.TB) []byte {
	t.Helper()
	self := proc.FS{Mount: "/proc"}
	pid := uint32(os.Getpid())
	entries, err := self.Maps(pid, proc.ExecutableMappings)
	if err != nil {
		t.Skip(err)
	}
	for i := range entries {
		if !entries[i].IsVDSO() {
			continue
		}
		image, err := proc.ReadVDSO(self, pid, &entries[i])
		if err != nil {
			t.Skip(err)
		}
		return image
	}
	t.Skip("no vdso")
	return nil
}

// NMFunctions returns the addresses nm reports for the text symbols of a
// file, by name.
func NMFunctions(t testing.TB, bin string) map[string]uint64 {
	t.Helper()
	out, err := exec.Command("nm", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	syms := map[string]uint64{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[1] == "T" || f[1] == "t") {
			addr, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			syms[f[2]] = addr
		}
	}
	return syms
}

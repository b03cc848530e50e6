package beam

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/beamfetch"
)

// TestFindTables finds the ranges table and the active code index in
// Debian's stripped beam.smp of every fetched version and architecture. OTP
// 27 still exports the_active_code_index: the code search must land on it.
func TestFindTables(t *testing.T) {
	forEachBeamSMP(t, func(t *testing.T, v, arch, path string, f *elf.File) {
		start := time.Now()
		tab, err := FindTables(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		t.Logf("%s: r at %#x, the_active_code_index at %#x (%v)", path, tab.Ranges, tab.ActiveCodeIndex, time.Since(start))
		if tab.Ranges%8 != 0 || tab.ActiveCodeIndex%4 != 0 {
			t.Errorf("misaligned: %#x, %#x", tab.Ranges, tab.ActiveCodeIndex)
		}
		syms, _ := f.DynamicSymbols()
		for _, s := range syms {
			if s.Name == "the_active_code_index" && s.Value != tab.ActiveCodeIndex {
				t.Errorf("found the active code index at %#x, the symbol says %#x", tab.ActiveCodeIndex, s.Value)
			}
		}
		ver, err := ERTSVersion(path)
		if err != nil || ver == "" {
			t.Errorf("ERTS version of %s: %q, %v", path, ver, err)
		}
	})
}

// TestTablesLive runs each fetched version here and checks, in its memory,
// that what FindTables found is a live ranges table: three records whose n
// fits the allocation, whose cached mid lies in the module array, whose
// modules are sorted and lie in the JIT's executable mapping, and an
// active code index below 3.
func TestTablesLive(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("no Debian Erlang build runs on %s", runtime.GOARCH)
	}
	for _, v := range beamfetch.Versions {
		t.Run(v, func(t *testing.T) {
			erl, err := beamfetch.Erl(v)
			if err != nil {
				t.Fatal(err)
			}
			path, err := beamfetch.BeamSMP(v, runtime.GOARCH)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			tab, err := FindTables(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(erl, "-noshell", "+S", "1:1", "-eval",
				"io:format(\"ready~n\"), timer:sleep(60000), halt().")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
				t.Fatalf("erl %s: %q, %v", v, line, err)
			}
			// erl execs erlexec, which execs beam.smp: the same pid.
			pid := cmd.Process.Pid
			bias, jit := mappings(t, pid, path)
			mem, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			read := func(addr uint64, n int) []byte {
				b := make([]byte, n)
				if _, err := mem.ReadAt(b, int64(addr)); err != nil {
					t.Fatalf("reading %#x: %v", addr, err)
				}
				return b
			}
			aci := binary.LittleEndian.Uint32(read(bias+tab.ActiveCodeIndex, 4))
			if aci >= numCodeIx {
				t.Fatalf("active code index %d", aci)
			}
			for ix := uint64(0); ix < numCodeIx; ix++ {
				rec := read(bias+tab.Ranges+ix*rangesSize, rangesSize)
				modules := binary.LittleEndian.Uint64(rec)
				n := binary.LittleEndian.Uint64(rec[rangesNOffset:])
				allocated := binary.LittleEndian.Uint64(rec[16:])
				mid := binary.LittleEndian.Uint64(rec[rangesMidOffset:])
				if n == 0 || n > allocated || n > 1<<20 {
					t.Fatalf("r[%d] = {%#x, %d, %d, %#x} is no ranges table", ix, modules, n, allocated, mid)
				}
				if ix != uint64(aci) {
					// A staging or retired index: only its counts mean
					// something (its mid may point into a freed array).
					continue
				}
				if mid < modules || mid >= modules+n<<rangeSizeShift {
					t.Fatalf("active r[%d]: cached mid %#x outside [%#x, +%d entries)", ix, mid, modules, n)
				}
				entries := read(modules, int(n)<<rangeSizeShift)
				prev := uint64(0)
				for i := uint64(0); i < n; i++ {
					start := binary.LittleEndian.Uint64(entries[i<<rangeSizeShift:])
					end := binary.LittleEndian.Uint64(entries[i<<rangeSizeShift+8:])
					if start < prev || end < start || !jit(start) || (end > start && !jit(end-1)) {
						t.Fatalf("r[%d].modules[%d] = [%#x, %#x) after %#x: not a sorted JIT range", ix, i, start, end, prev)
					}
					prev = end
				}
				t.Logf("OTP %s pid %d: active index %d, %d modules", v, pid, aci, n)
			}
		})
	}
}

// mappings returns the load bias of exe in pid and a test for addresses in
// the JIT's executable mapping (a deleted memfd, or anonymous with
// +JMsingle).
func mappings(t *testing.T, pid int, exe string) (uint64, func(uint64) bool) {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		t.Fatal(err)
	}
	var bias uint64
	var found bool
	type span struct{ lo, hi uint64 }
	var jit []span
	for _, l := range strings.Split(string(data), "\n") {
		fs := strings.Fields(l)
		if len(fs) < 5 {
			continue
		}
		lohi := strings.SplitN(fs[0], "-", 2)
		lo, _ := strconv.ParseUint(lohi[0], 16, 64)
		hi, _ := strconv.ParseUint(lohi[1], 16, 64)
		name := strings.Join(fs[5:], " ")
		off, _ := strconv.ParseUint(fs[2], 16, 64)
		if name == exe && off == 0 && !found {
			bias, found = lo, true // PIE: the first mapping is file offset 0 at vaddr 0
		}
		if strings.Contains(fs[1], "x") && (strings.HasPrefix(name, "/memfd:vmem") || name == "") {
			jit = append(jit, span{lo, hi})
		}
	}
	if !found || len(jit) == 0 {
		t.Fatalf("pid %d: no mapping of %s (%v) or no JIT mapping (%d)", pid, exe, found, len(jit))
	}
	return bias, func(a uint64) bool {
		for _, s := range jit {
			if a >= s.lo && a < s.hi {
				return true
			}
		}
		return false
	}
}

// forEachBeamSMP runs test on Debian's beam.smp of every fetched version
// and architecture, opened, as a subtest named version/arch.
func forEachBeamSMP(t *testing.T, test func(t *testing.T, v, arch, path string, f *elf.File)) {
	for _, v := range beamfetch.Versions {
		for _, arch := range beamfetch.Arches {
			t.Run(v+"/"+arch, func(t *testing.T) {
				path, err := beamfetch.BeamSMP(v, arch)
				if err != nil {
					t.Fatal(err)
				}
				f, err := elf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				test(t, v, arch, path, f)
			})
		}
	}
}

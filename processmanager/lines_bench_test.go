package processmanager

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
)

// BenchmarkDebugInfoRSS: the daemon's resident memory after sampling
// addresses in 200 distinct large binaries (each with 4,000 functions and
// compressed DWARF, inflated when opened), with the default bound on open
// debug information and with none. Run with -benchtime 1x.
func BenchmarkDebugInfoRSS(b *testing.B) {
	bins, addrs := largeBinaries(b, 200)
	for _, c := range []struct {
		name  string
		bound int64
	}{{"default bound", DefaultDebugInfoBytes}, {"no bound", 1 << 40}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				before := rssBytes(b)
				s := newLineSymbolizer(debuginfo.Options{}, c.bound, nil, time.Now)
				lines := 0
				pid, host := uint32(os.Getpid()), proc.FS{Mount: "/proc"}
				for i, bin := range bins {
					mp := fileMapping(b, bin, i)
					s.frames(host, pid, mp, addrs[0]) // queues the file
					s.wait()
					for _, a := range addrs {
						if fs, _, _ := s.frames(host, pid, mp, a); len(fs) > 0 {
							lines++
						}
					}
				}
				runtime.GC()
				debug.FreeOSMemory()
				after := rssBytes(b)
				if lines < len(bins)*len(addrs)/2 {
					b.Fatalf("only %d of %d addresses had lines; stats %+v", lines, len(bins)*len(addrs), s.stats)
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(after-before)/(1<<20), "MiB-RSS-growth")
				b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-heap-in-use")
				b.ReportMetric(float64(s.bytes)/(1<<20), "MiB-held")
				b.ReportMetric(float64(s.stats.evicted), "evicted")
				s.close()
			}
		})
	}
}

// largeBinaries compiles one C file of many small functions, which call
// an inlined helper, with -O2 -g -gz, and makes n copies of it with
// distinct build ids. It returns them and addresses of its functions.
func largeBinaries(b *testing.B, n int) ([]string, []uint64) {
	b.Helper()
	dir := b.TempDir()
	var src strings.Builder
	src.WriteString("static inline unsigned long mix(unsigned long a, unsigned long b) { return (a * 31 + b) ^ (a >> 3); }\n")
	const funcs = 4000
	for i := range funcs {
		fmt.Fprintf(&src, "unsigned long f%d(unsigned long x) { for (int i = 0; i < %d; i++) x = mix(x, i + %d); return x; }\n",
			i, 3+i%5, i)
	}
	src.WriteString("int main(int argc, char **argv) { (void)argv; return (int)f0(argc); }\n")
	cfile := filepath.Join(dir, "large.c")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	first := filepath.Join(dir, "large0")
	if out, err := exec.Command("gcc", "-O2", "-g", "-gz", "-o", first, cfile).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v\n%s", err, out)
	}
	data, err := os.ReadFile(first)
	if err != nil {
		b.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	note := f.Section(".note.gnu.build-id")
	syms, _ := f.Symbols()
	var addrs []uint64
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "f") && s.Size > 0 && len(addrs) < 20 {
			addrs = append(addrs, s.Value+s.Size/2)
		}
	}
	if note == nil || len(addrs) == 0 {
		b.Fatal("no build id or no functions")
	}
	bins := []string{first}
	for i := 1; i < n; i++ {
		// The last 4 bytes of the build id: a distinct file and file id.
		end := note.Offset + note.Size
		copy(data[end-4:end], strconv.AppendUint(nil, uint64(1000+i), 10)[:4])
		p := filepath.Join(dir, "large"+strconv.Itoa(i))
		if err := os.WriteFile(p, data, 0o755); err != nil {
			b.Fatal(err)
		}
		bins = append(bins, p)
	}
	return bins, addrs
}

// fileMapping is a mapping of bin as lineSymbolizer.frames needs it.
func fileMapping(b *testing.B, bin string, i int) *mapping {
	b.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(bin, &st); err != nil {
		b.Fatal(err)
	}
	var id libpf.FileID
	id[0], id[1] = byte(i), byte(i>>8)
	id[15] = 1
	return &mapping{
		entry: proc.MapsEntry{Path: bin, Inode: st.Ino, Dev: st.Dev, Executable: true},
		file:  &execinfo.File{ID: id, ELF: &execinfo.ELF{}},
	}
}

// rssBytes is the process's resident set.
func rssBytes(b *testing.B) int64 {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

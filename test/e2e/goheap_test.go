package e2e

import (
	"bufio"
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
)

// goHeapBuild is one build of utils/workloads/goheap.
type goHeapBuild struct {
	name, version string
	cgo           bool
	ldflags       string
}

var goHeapBuilds = []goHeapBuild{
	{name: "go" + gofetch.System, version: gofetch.System},
	{name: "go" + gofetch.System + "-stripped", version: gofetch.System, ldflags: "-s -w"},
	{name: "go" + gofetch.System + "-cgo", version: gofetch.System, cgo: true},
	{name: "go1.27", version: "1.27"},
}

// heapReading is one heap profile, by leaf function: in-use and allocated
// bytes.
type heapReading struct {
	start, end time.Time
	inuse      map[string]int64
	alloc      map[string]int64
}

// equal says two of the program's own profiles have the same values: no
// garbage collection published new counts between them.
func (a heapReading) equal(b heapReading) bool {
	return mapsEqual(a.inuse, b.inuse) && mapsEqual(a.alloc, b.alloc)
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// buildGoHeap builds the workload.
func buildGoHeap(t *testing.T, b goHeapBuild) string {
	t.Helper()
	goCmd, env, err := gofetch.Command(b.version)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "goheap-"+b.name)
	cgo := "CGO_ENABLED=0"
	if b.cgo {
		cgo = "CGO_ENABLED=1"
	}
	cmd := exec.Command(goCmd, "build", "-ldflags="+b.ldflags, "-o", bin, ".")
	cmd.Dir = filepath.Join(repoRoot(t), "utils", "workloads", "goheap")
	cmd.Env = append(append(os.Environ(), env...), cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", b.name, err, out)
	}
	return bin
}

// startGoHeap runs the workload for d and returns it and its address.
func startGoHeap(t *testing.T, bin string, d time.Duration) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, "127.0.0.1:0", fmt.Sprint(d.Seconds()))
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if err != nil || !ok {
		t.Fatalf("%s printed %q, %v", bin, line, err)
	}
	return cmd, addr
}

// pollOwnProfile fetches the program's own heap profile every 250 ms until
// stop is closed.
func pollOwnProfile(addr string, stop <-chan struct{}) (readings func() []heapReading) {
	var mu sync.Mutex
	var got []heapReading
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			start := time.Now()
			resp, err := http.Get("http://" + addr + "/debug/pprof/heap")
			if err != nil {
				continue
			}
			p, err := profile.Parse(resp.Body)
			resp.Body.Close()
			if err != nil {
				continue
			}
			r := heapReading{start: start, end: time.Now(), inuse: map[string]int64{}, alloc: map[string]int64{}}
			for i, st := range p.SampleType {
				m := map[string]map[string]int64{"inuse_space": r.inuse, "alloc_space": r.alloc}[st.Type]
				if m == nil {
					continue
				}
				for _, s := range p.Sample {
					if len(s.Location) > 0 && len(s.Location[0].Line) > 0 && s.Value[i] != 0 {
						m[s.Location[0].Line[0].Function.Name] += s.Value[i]
					}
				}
			}
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		}
	}()
	return func() []heapReading {
		<-done
		return got
	}
}

// daemonHeapReadings are the heap profiles the collector received for pid,
// by time, each by leaf function.
func daemonHeapReadings(pds []*profilespb.ProfilesData, pid int) map[time.Time]*heapReading {
	out := map[time.Time]*heapReading{}
	for _, pd := range pds {
		d := pd.GetDictionary()
		for _, rp := range pd.GetResourceProfiles() {
			if p, _ := resourceIntAttr(rp, "process.pid"); p != int64(pid) {
				continue
			}
			for _, sp := range rp.GetScopeProfiles() {
				for _, prof := range sp.GetProfiles() {
					kind := d.GetStringTable()[prof.GetSampleType().GetTypeStrindex()]
					if kind != "inuse_space" && kind != "alloc_space" {
						continue
					}
					at := time.Unix(0, int64(prof.GetTimeUnixNano()))
					r := out[at]
					if r == nil {
						r = &heapReading{end: at, inuse: map[string]int64{}, alloc: map[string]int64{}}
						out[at] = r
					}
					m := r.inuse
					if kind == "alloc_space" {
						m = r.alloc
					}
					for _, s := range prof.GetSamples() {
						if names := stackFunctions(d, s.GetStackIndex()); len(names) > 0 {
							for _, v := range s.GetValues() {
								m[names[0]] += v
							}
						}
					}
				}
			}
		}
	}
	return out
}

// pprofHeapReadings are pid's samples in the heap pprof files in dir
// (-output-dir), each file's by leaf function at the file's time.
func pprofHeapReadings(t *testing.T, dir string, pid int) []heapReading {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "profile-*-heap*.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	var out []heapReading
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if p.DefaultSampleType != "inuse_space" || len(p.SampleType) != 4 {
			t.Fatalf("%s: sample types %v, default %q", path, p.SampleType, p.DefaultSampleType)
		}
		r := heapReading{end: time.Unix(0, p.TimeNanos), inuse: map[string]int64{}, alloc: map[string]int64{}}
		found := false
		for _, s := range p.Sample {
			if pids := s.NumLabel["pid"]; len(pids) != 1 || pids[0] != int64(pid) || len(s.Location) == 0 ||
				len(s.Location[0].Line) == 0 {
				continue
			}
			found = true
			name := s.Location[0].Line[0].Function.Name
			r.alloc[name] += s.Value[1]
			r.inuse[name] += s.Value[3]
		}
		if found {
			// Zero values are left out, as the program's own profile
			// and the collector's leave them out of the comparison.
			maps.DeleteFunc(r.inuse, func(_ string, v int64) bool { return v == 0 })
			maps.DeleteFunc(r.alloc, func(_ string, v int64) bool { return v == 0 })
			out = append(out, r)
		}
	}
	return out
}

// topN are the n functions with the most bytes.
func topN(m map[string]int64, n int) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	return names[:min(n, len(names))]
}

// agree says whether two heap profiles have the same top 5 functions by
// bytes, each within 10% of the other's value (ties at the fifth place
// may name different functions of equal value: each side's top 5 is
// checked against the other's whole profile).
func agree(ours, theirs map[string]int64) string {
	var bad []string
	check := func(a, b map[string]int64, side string) {
		for _, name := range topN(a, 5) {
			if math.Abs(float64(a[name]-b[name])) > 0.1*float64(a[name]) {
				bad = append(bad, fmt.Sprintf("%s: %d in %s top 5, %d in the other", name, a[name], side, b[name]))
			}
		}
	}
	check(ours, theirs, "ours")
	check(theirs, ours, "the program's")
	return strings.Join(bad, "; ")
}

// TestGoHeapProfiles runs the goheap workload, built by the machine's Go
// (plain, stripped, with cgo) and by Go 1.27, under the daemon reading
// heap profiles every 2 s, and compares each profile the collector got
// with the program's own /debug/pprof/heap fetched just before and just
// after it: where those two are the same (no garbage collection published
// new counts meanwhile), the daemon's must have the same top 5 functions
// by in-use and by allocated bytes, each within 10%.
func TestGoHeapProfiles(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	const run = 20 * time.Second
	bins := make([]string, len(goHeapBuilds))
	for i, b := range goHeapBuilds {
		bins[i] = buildGoHeap(t, b)
	}
	c := startCollector(t)
	pprofDir := t.TempDir()
	d := startDaemon(t, "-collection-agent="+c.Addr, "-disable-tls", "-reporter-interval=1s",
		"-go-heap-interval=2s", "-monitor-interval=2s", "-spool-dir="+filepath.Join(t.TempDir(), "spool"),
		"-output-dir="+pprofDir)
	stop := make(chan struct{})
	type running struct {
		cmd      *exec.Cmd
		readings func() []heapReading
	}
	var runs []running
	for _, bin := range bins {
		cmd, addr := startGoHeap(t, bin, run)
		runs = append(runs, running{cmd, pollOwnProfile(addr, stop)})
	}
	for _, r := range runs {
		r.cmd.Wait()
	}
	close(stop)
	time.Sleep(2 * time.Second)
	d.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	pds, err := collector.ReadOutput(c.OutPath, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, pd := range pds {
		if err := collector.ResolveAttributeRefs(pd); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("daemon: %s", linesWith(readFile(t, d.LogPath), "go_heap="))
	for i, b := range goHeapBuilds {
		t.Run(b.name, func(t *testing.T) {
			own := runs[i].readings()
			ours := daemonHeapReadings(pds, runs[i].cmd.Process.Pid)
			// The program's last profile before our read began (a read
			// takes well under 100 ms) and its first after, if they are
			// the same.
			bracket := func(at time.Time) int {
				before := slices.IndexFunc(own, func(r heapReading) bool { return r.end.After(at.Add(-100 * time.Millisecond)) }) - 1
				after := slices.IndexFunc(own, func(r heapReading) bool { return r.start.After(at) })
				if before < 0 || after < 0 || !own[before].equal(own[after]) {
					return -1
				}
				return before
			}
			times := slices.SortedFunc(maps.Keys(ours), func(a, b time.Time) int { return a.Compare(b) })
			var last time.Time
			for _, at := range times {
				if bracket(at) >= 0 {
					last = at
				}
			}
			compared := 0
			for _, at := range times {
				before := bracket(at)
				if before < 0 {
					continue
				}
				compared++
				r := ours[at]
				for _, kind := range []struct {
					name         string
					ours, theirs map[string]int64
				}{{"inuse_space", r.inuse, own[before].inuse}, {"alloc_space", r.alloc, own[before].alloc}} {
					if msg := agree(kind.ours, kind.theirs); msg != "" {
						t.Errorf("%s at %s: %s", kind.name, at.Format("15:04:05.000"), msg)
					}
					if at.Equal(last) {
						t.Logf("%s, the last compared: ours %v; the program's own %v", kind.name,
							top5Values(kind.ours), top5Values(kind.theirs))
					}
				}
			}
			t.Logf("%d heap profiles received, %d compared (the program's own the same before and after)", len(ours), compared)
			if compared < 3 {
				t.Errorf("%d heap profiles compared, want 3 or more (%d received, %d of the program's own)", compared, len(ours), len(own))
			}

			// The pprof files: one per interval, at the time of its
			// first profile; the round reads a dozen Go programs in well
			// under half a second.
			files := pprofHeapReadings(t, pprofDir, runs[i].cmd.Process.Pid)
			comparedFiles := 0
			for _, r := range files {
				before := slices.IndexFunc(own, func(o heapReading) bool { return o.end.After(r.end.Add(-100 * time.Millisecond)) }) - 1
				after := slices.IndexFunc(own, func(o heapReading) bool { return o.start.After(r.end.Add(500 * time.Millisecond)) })
				if before < 0 || after < 0 || !own[before].equal(own[after]) {
					continue
				}
				comparedFiles++
				for _, kind := range []struct {
					name         string
					ours, theirs map[string]int64
				}{{"inuse_space", r.inuse, own[before].inuse}, {"alloc_space", r.alloc, own[before].alloc}} {
					if msg := agree(kind.ours, kind.theirs); msg != "" {
						t.Errorf("pprof file of %s, %s: %s", r.end.Format("15:04:05"), kind.name, msg)
					}
				}
			}
			t.Logf("%d pprof heap files with the program, %d compared", len(files), comparedFiles)
			if comparedFiles < 2 {
				t.Errorf("%d pprof heap files compared, want 2 or more (%d with the program)", comparedFiles, len(files))
			}
		})
	}
}

func top5Values(m map[string]int64) string {
	var parts []string
	for _, name := range topN(m, 5) {
		parts = append(parts, fmt.Sprintf("%s=%.1fMiB", name, float64(m[name])/(1<<20)))
	}
	return strings.Join(parts, " ")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package integration

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/processmanager/goheap"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
)

// buildHeapprog builds processmanager/goheap's test program (a module of
// its own) for the target architecture, plain or stripped.
func buildHeapprog(t *testing.T, stripped bool) string {
	t.Helper()
	tc := targetToolchain(t)
	ldflags := ""
	if stripped {
		ldflags = "-s -w"
	}
	bin, build := workloadPath(t, "heapprog", "go", gofetch.System, tc.goarch, ldflags)
	if build {
		dir := filepath.Join(workloadDir(""), "..", "..", "processmanager", "goheap", "testdata", "heapprog")
		run(t, dir, []string{"GOTOOLCHAIN=local", "GOARCH=" + tc.goarch, "CGO_ENABLED=0"},
			"go", "build", "-ldflags="+ldflags, "-o", bin, ".")
	}
	return bin
}

// TestGoHeapReader reads a Go program's heap profile from its memory on
// the target architecture (the kernel matrix runs it in the arm64 VMs),
// plain and stripped, and compares it with the profile the program writes
// itself: the same in-use and allocated bytes per leaf function.
func TestGoHeapReader(t *testing.T) {
	requireRoot(t)
	bins := map[string]string{"plain": buildHeapprog(t, false), "stripped": buildHeapprog(t, true)}
	skipIfPreparing(t)
	r := goheap.NewReader()
	defer r.Close()
	for _, name := range slices.Sorted(maps.Keys(bins)) {
		t.Run(name, func(t *testing.T) {
			own := filepath.Join(t.TempDir(), "heap.pb.gz")
			cmd := exec.Command(bins[name], "sampled", own)
			stdin, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { stdin.Close(); cmd.Wait() }()
			for sc := bufio.NewScanner(out); sc.Scan() && sc.Text() != "ready"; {
			}
			prof, err := r.Read(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			ours := map[string][2]int64{}
			for _, s := range prof.Samples {
				if len(s.Stack) > 0 {
					v := ours[prof.Resolve(s.Stack[0]).Function]
					ours[prof.Resolve(s.Stack[0]).Function] = [2]int64{v[0] + s.InUseBytes, v[1] + s.AllocBytes}
				}
			}
			f, err := os.Open(own)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			p, err := profile.Parse(f)
			if err != nil {
				t.Fatal(err)
			}
			theirs := map[string][2]int64{}
			for _, s := range p.Sample {
				if len(s.Location) > 0 && len(s.Location[0].Line) > 0 {
					name := s.Location[0].Line[0].Function.Name
					v := theirs[name]
					theirs[name] = [2]int64{v[0] + s.Value[3], v[1] + s.Value[1]}
				}
			}
			t.Logf("in use, allocated per leaf: ours %v; the program's own %v", ours, theirs)
			for _, fn := range []string{"main.retainLeaf", "main.retainSmall", "main.churnLeaf"} {
				if ours[fn] != theirs[fn] || theirs[fn][1] == 0 {
					t.Errorf("%s: %v, the program's own profile says %v", fn, ours[fn], theirs[fn])
				}
			}
		})
	}
}

package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager"
	"github.com/hostprof/ebpf-profiler/test/critest"
	"github.com/hostprof/ebpf-profiler/utils/gofetch"
)

// buildPause builds the pods' sandbox program: a static C program that
// waits for signals.
func buildPause(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "pause.c")
	if err := os.WriteFile(src, []byte("#include <unistd.h>\nint main(void) { for (;;) pause(); }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "pause")
	run(t, dir, nil, "gcc", "-static", "-O2", "-o", bin, src)
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKubernetesNames runs two pods, each a container of the golabels
// workload (a static Go program), through a containerd of the test's own
// via the CRI, as the kubelet would. The process manager asks that
// containerd for each container's names once, in the background: from the
// first sample that has them on, every sample of a container must carry
// its pod's name, namespace and uid, its container's name and id, and
// never the other pod's; the goroutines' labels come along.
func TestKubernetesNames(t *testing.T) {
	requireRoot(t)
	if inVM() {
		t.Fatal("not a kernel-matrix test: the VMs have no containerd")
	}
	pause := buildPause(t)
	workload, err := os.ReadFile(buildGoLabels(t, goLabelBuild{version: gofetch.System}))
	if err != nil {
		t.Fatal(err)
	}
	skipIfPreparing(t)
	c := critest.Start(t, pause)
	c.Import(t, "hostprof.test/golabels:1", critest.Image{"/golabels": workload}, []string{"/golabels"})
	t.Run("CRI", func(t *testing.T) {
		s := startSessionWith(t, testHz, func(cfg *processmanager.Config) { cfg.CRISockets = []string{c.Socket} })
		checkKubernetesNames(t, c, s, nil)
	})
	// No CRI socket: the kubelet's pod directories, laid out as the
	// kubelet lays them out, and the termination log it mounts into the
	// container.
	t.Run("kubelet_directory", func(t *testing.T) {
		kubelet := t.TempDir()
		s := startSessionWith(t, testHz, func(cfg *processmanager.Config) { cfg.KubeletRoot = kubelet })
		checkKubernetesNames(t, c, s, func(p *critest.Pod) {
			// Other pods than the CRI subtest's, which still exist.
			p.Name, p.UID = p.Name+"-k", p.UID[:len(p.UID)-2]+"99"
			dir := filepath.Join(kubelet, "pods", p.UID)
			p.TerminationLog = filepath.Join(dir, "containers", p.ContainerName, "4f3a2b1c")
			for path, text := range map[string]string{
				"etc-hosts": "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.0.0.7\t" + p.Name + "\n",
				"volumes/kubernetes.io~projected/kube-api-access-7xk2p/namespace": p.Namespace,
				"containers/" + p.ContainerName + "/4f3a2b1c":                     "",
			} {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, path), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	})
}

// checkKubernetesNames runs two pods (prepare, when set, changes each
// before it runs) and checks their samples' names.
func checkKubernetesNames(t *testing.T, c *critest.Containerd, s *session, prepare func(*critest.Pod)) {
	t.Helper()

	pods := []critest.Pod{
		{Name: "checkout-5c7d9", Namespace: "shop", UID: "6f1e2d3c-4b5a-4697-8877-665544332211", ContainerName: "worker",
			Image: "hostprof.test/golabels:1", Args: []string{"4"}},
		{Name: "billing-0", Namespace: "finance", UID: "0a1b2c3d-4e5f-4a6b-9c8d-7e6f5a4b3c2d", ContainerName: "ledger",
			Image: "hostprof.test/golabels:1", Args: []string{"4"}},
	}
	ids := make([]string, len(pods))
	pids := make([]int, len(pods))
	for i := range pods {
		if prepare != nil {
			prepare(&pods[i])
		}
		ids[i] = c.Run(t, pods[i])
		pids[i] = c.PID(t, ids[i])
	}
	for _, pid := range pids {
		s.waitExited(t, pid)
	}
	for i := range pods {
		samples := s.rec.ofPID(pids[i])
		p := pods[i]
		want := libpf.ProcessInfo{ContainerID: ids[i], PodUID: p.UID, PodName: p.Name, Namespace: p.Namespace,
			ContainerName: p.ContainerName}
		first := -1
		var right, labelled int
		var wrong *libpf.ProcessInfo
		for j, smp := range samples {
			got := smp.meta.Process
			if got == nil {
				continue
			}
			if got.PodName != "" && first < 0 {
				first = j
			}
			if got.PodName != "" && got.PodName != p.Name {
				t.Errorf("%s: a sample of pod %s carries %s/%s", p.Name, p.Name, got.Namespace, got.PodName)
			}
			if first < 0 {
				continue
			}
			if got.ContainerID == want.ContainerID && got.PodUID == want.PodUID && got.PodName == want.PodName &&
				got.Namespace == want.Namespace && got.ContainerName == want.ContainerName {
				right++
			} else if wrong == nil {
				wrong = got
			}
			if !smp.meta.Labels.IsZero() {
				labelled++
			}
		}
		if first < 0 || first > maxWarmupSamples {
			t.Fatalf("%s: %d samples before the first with its names (-1: none of %d), want <= %d",
				p.Name, first, len(samples), maxWarmupSamples)
		}
		n := len(samples) - first
		t.Logf("pod %s/%s: %d of %d samples before the first with its names; then %d of %d (%.1f%%) with all of "+
			"them right, %d with goroutine labels", p.Namespace, p.Name, first, len(samples), right, n,
			100*float64(right)/float64(n), labelled)
		if float64(right) < 0.95*float64(n) {
			t.Errorf("%s: %d of %d samples carry its names %+v, want >= 95%%; one carries %+v", p.Name, right, n, want, wrong)
		}
		if labelled == 0 {
			t.Errorf("%s: no sample carries goroutine labels", p.Name)
		}
	}
	// Named once per container, not per process or sample.
	if st := s.pm.Stats(); st.ContainersNamed < uint64(len(pods)) || st.CRIErrors != 0 {
		t.Errorf("containers named %d, CRI errors %d; want >= %d and 0", st.ContainersNamed, st.CRIErrors, len(pods))
	}
}

package cri

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime serves ListContainers and ListPodSandbox from fixed lists,
// as containerd filters them (by id), and counts the calls.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	containers []*runtimeapi.Container
	sandboxes  []*runtimeapi.PodSandbox
	calls      atomic.Int32
}

func (f *fakeRuntime) ListContainers(_ context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.calls.Add(1)
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range f.containers {
		if r.Filter == nil || r.Filter.Id == "" || r.Filter.Id == c.Id {
			out.Containers = append(out.Containers, c)
		}
	}
	return out, nil
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.calls.Add(1)
	out := &runtimeapi.ListPodSandboxResponse{}
	for _, s := range f.sandboxes {
		if r.Filter == nil || r.Filter.Id == "" || r.Filter.Id == s.Id {
			out.Items = append(out.Items, s)
		}
	}
	return out, nil
}

func serve(t *testing.T, f *fakeRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return sock
}

func TestLookup(t *testing.T) {
	f := &fakeRuntime{
		containers: []*runtimeapi.Container{
			{Id: "c1", PodSandboxId: "s1", Metadata: &runtimeapi.ContainerMetadata{Name: "worker"}},
			// Metadata without a name: the kubelet's labels speak.
			{Id: "c2", PodSandboxId: "s2", Labels: map[string]string{labelContainerName: "sidecar"}},
		},
		sandboxes: []*runtimeapi.PodSandbox{
			{Id: "s1", Metadata: &runtimeapi.PodSandboxMetadata{Name: "checkout-0", Namespace: "shop", Uid: "u1"}},
			{Id: "s2", Labels: map[string]string{labelPodName: "billing-0", labelPodNamespace: "finance", labelPodUID: "u2"}},
		},
	}
	sock := serve(t, f)
	r := NewResolver([]string{filepath.Join(t.TempDir(), "absent.sock"), sock})
	defer r.Close()
	for id, want := range map[string]Names{
		"c1": {Pod: "checkout-0", Namespace: "shop", PodUID: "u1", Container: "worker"},
		"c2": {Pod: "billing-0", Namespace: "finance", PodUID: "u2", Container: "sidecar"},
	} {
		got, err := r.Lookup(context.Background(), id)
		if err != nil || got != want {
			t.Errorf("Lookup(%s) = %+v, %v; want %+v", id, got, err, want)
		}
		if c, ok := r.Cached(id); !ok || c != want {
			t.Errorf("Cached(%s) = %+v, %v", id, c, ok)
		}
	}
	if r.Socket() != sock {
		t.Errorf("socket %q, want the one that serves, %q", r.Socket(), sock)
	}
	calls := f.calls.Load()
	if _, err := r.Lookup(context.Background(), "c1"); err != nil || f.calls.Load() != calls {
		t.Errorf("a cached container was asked for again (%v)", err)
	}
	if _, err := r.Lookup(context.Background(), "c3"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Lookup of an unknown container: %v, want ErrUnknown", err)
	}
}

func TestNoRuntime(t *testing.T) {
	r := NewResolver([]string{filepath.Join(t.TempDir(), "absent.sock")})
	if _, err := r.Lookup(context.Background(), "c1"); !errors.Is(err, ErrNoRuntime) {
		t.Errorf("Lookup without a runtime: %v, want ErrNoRuntime", err)
	}
}

func TestFromKubelet(t *testing.T) {
	root := t.TempDir()
	const uid = "6f1e2d3c-4b5a-4697-8877-665544332211"
	pod := filepath.Join(root, "pods", uid)
	for path, text := range map[string]string{
		"etc-hosts": "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\n# Entries added by HostAliases.\n" +
			"10.1.2.3\tcheckout-5c7d9\n",
		"volumes/kubernetes.io~projected/kube-api-access-x2x9z/namespace": "shop",
		"containers/worker/a1b2c3d4":                                      "",
	} {
		p := filepath.Join(pod, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mountinfo := "1403 1386 0:138 / / rw,relatime - overlay overlay rw\n" +
		"1411 1403 254:1 /var/lib/kubelet/pods/" + uid + "/containers/worker/a1b2c3d4 /dev/termination-log rw - ext4 /dev/vda1 rw\n"
	n, err := FromKubelet(root, uid, strings.NewReader(mountinfo))
	want := Names{Pod: "checkout-5c7d9", Namespace: "shop", PodUID: uid, Container: "worker"}
	if err != nil || n != want {
		t.Errorf("FromKubelet = %+v, %v; want %+v", n, err, want)
	}
	for _, bad := range []string{"../etc", "", "a/b"} {
		if _, err := FromKubelet(root, bad, nil); !errors.Is(err, ErrNoPodDir) {
			t.Errorf("pod uid %q: %v, want ErrNoPodDir", bad, err)
		}
	}
	// A symlinked namespace file is not followed.
	ns := filepath.Join(pod, "volumes/kubernetes.io~projected/kube-api-access-x2x9z/namespace")
	os.Remove(ns)
	if err := os.Symlink("/etc/hostname", ns); err != nil {
		t.Fatal(err)
	}
	if n, _ := FromKubelet(root, uid, nil); n.Namespace != "" || n.Container != "" || n.Pod != "checkout-5c7d9" {
		t.Errorf("with a symlink and no mountinfo: %+v", n)
	}
}

func FuzzContainerFromMountinfo(f *testing.F) {
	f.Add("1411 1403 254:1 /var/lib/kubelet/pods/u/containers/worker/a1 /dev/termination-log rw - ext4 /dev/vda1 rw\n")
	f.Fuzz(func(t *testing.T, s string) {
		if name := containerFromMountinfo(strings.NewReader(s), "u"); name != "" && !isSafeName(name) {
			t.Errorf("returned %q", name)
		}
	})
}

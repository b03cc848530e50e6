// Package critest runs Kubernetes pods without a cluster, for the tests of
// the profiler's Kubernetes names: a containerd of its own (Debian's, with
// its CRI plugin) on a private socket and state directory, images built by
// the test from files (no registry) and imported, and a pod sandbox and a
// container created through the CRI API as the kubelet would.
package critest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PauseImage is the sandbox image the containerd's CRI plugin is
// configured with; Start imports it.
const PauseImage = "hostprof.test/pause:1"

// Containerd is a running containerd.
type Containerd struct {
	// Socket is its gRPC socket, where CRI clients connect.
	Socket string
	dir    string
	cmd    *exec.Cmd
	conn   *grpc.ClientConn
	// Runtime is a CRI client of it.
	Runtime runtimeapi.RuntimeServiceClient
}

// Start starts a containerd whose state lives in a temporary directory
// (the native snapshotter: no overlay on the test's file system), with CRI
// pods on the host's network (no CNI), and imports the pause image, built
// from pause (a static program that waits for a signal). It is stopped,
// its containers killed, at the test's end.
func Start(t testing.TB, pause []byte) *Containerd {
	t.Helper()
	for _, cmd := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Fatalf("%s: %v (make test-deps installs Debian's containerd and runc)", cmd, err)
		}
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "critest")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{Socket: filepath.Join(dir, "c.sock"), dir: dir}
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # Root here lacks CAP_SYS_RESOURCE: the sandboxes' -998 is capped to
  # containerd's own score.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[6]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.Socket, c.Socket+".ttrpc", PauseImage,
		filepath.Join(dir, "cni"))
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command("containerd", "--config", cfg)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop(t); logf.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(c.Socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not serve %s within 30 s; its log: %s", c.Socket, c.log())
		}
	}
	c.conn, err = grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c.Runtime = runtimeapi.NewRuntimeServiceClient(c.conn)
	c.Import(t, PauseImage, Image{"/pause": pause}, []string{"/pause"})
	return c
}

func (c *Containerd) log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "containerd.log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// stop removes every pod (killing its containers), stops containerd and
// removes its state.
func (c *Containerd) stop(t testing.TB) {
	if c.Runtime != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if pods, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, p := range pods.Items {
				_, _ = c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id})
				_, _ = c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id})
			}
		}
	}
	if c.conn != nil {
		c.conn.Close()
	}
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(unix.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	}
	// The native snapshotter's and the sandboxes' mounts, if any are left.
	_ = exec.Command("sh", "-c", "grep -o ' "+c.dir+"[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l").Run()
	if err := os.RemoveAll(c.dir); err != nil {
		t.Logf("removing containerd's state: %v", err)
	}
}

// Image is an image's files: path in the image -> content, each written
// executable.
type Image map[string][]byte

// Import builds an OCI image named ref of files, whose entry point is
// entrypoint, and imports it into the CRI plugin's namespace (k8s.io), as
// "ctr images import" does with an OCI archive.
func (c *Containerd) Import(t testing.TB, ref string, files Image, entrypoint []string) {
	t.Helper()
	archive := filepath.Join(c.dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := os.WriteFile(archive, ociArchive(ref, files, entrypoint), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ctr", "-a", c.Socket, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		t.Fatalf("importing %s: %v\n%s", ref, err, out)
	}
}

// ociArchive is an OCI image layout (index.json, blobs) as a tar archive:
// one layer holding files, a config with entrypoint, for this machine's
// architecture.
func ociArchive(ref string, files Image, entrypoint []string) []byte {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for name, data := range files {
		name = strings.TrimPrefix(name, "/")
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
		_, _ = tw.Write(data)
	}
	_ = tw.Close()
	layerDigest := digest(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": entrypoint},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json",
			"digest": digest(config), "size": len(config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar",
			"digest": layerDigest, "size": layer.Len()}},
	})
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest": digest(manifest), "size": len(manifest),
			"annotations": map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}}},
	})
	var out bytes.Buffer
	aw := tar.NewWriter(&out)
	add := func(name string, data []byte) {
		_ = aw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
		_, _ = aw.Write(data)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	for _, blob := range [][]byte{layer.Bytes(), config, manifest} {
		add("blobs/sha256/"+strings.TrimPrefix(digest(blob), "sha256:"), blob)
	}
	_ = aw.Close()
	return out.Bytes()
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Pod is a pod sandbox and one container in it, as the kubelet would make
// them.
type Pod struct {
	Name, Namespace, UID string
	ContainerName        string
	// Image names an imported image; Args are the container's command
	// line after its entry point.
	Image string
	Args  []string
	// TerminationLog, when set, is a host file mounted at
	// /dev/termination-log, as the kubelet mounts one from its pod
	// directory.
	TerminationLog string
}

// Run creates and starts the pod's sandbox (on the host's network, in the
// cgroup the kubelet's cgroupfs driver gives a best-effort pod) and its
// container; it returns the container's id.
func (c *Containerd) Run(t testing.TB, p Pod) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sandbox := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: p.UID},
		Labels: map[string]string{"io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": p.Namespace,
			"io.kubernetes.pod.uid": p.UID},
		LogDirectory: filepath.Join(c.dir, "logs", p.UID),
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			// As the kubelet's cgroupfs driver names a best-effort pod's.
			CgroupParent: "/kubepods/besteffort/pod" + p.UID,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	run, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandbox})
	if err != nil {
		t.Fatalf("RunPodSandbox %s/%s: %v; containerd's log: %s", p.Namespace, p.Name, err, c.log())
	}
	created, err := c.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: run.PodSandboxId,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: p.ContainerName},
			Image:    &runtimeapi.ImageSpec{Image: p.Image},
			Args:     p.Args,
			Mounts:   terminationLog(p.TerminationLog),
			Labels: map[string]string{"io.kubernetes.container.name": p.ContainerName,
				"io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": p.Namespace,
				"io.kubernetes.pod.uid": p.UID},
			LogPath: p.ContainerName + ".log",
		},
		SandboxConfig: sandbox,
	})
	if err != nil {
		t.Fatalf("CreateContainer %s in %s/%s: %v; containerd's log: %s", p.ContainerName, p.Namespace, p.Name, err, c.log())
	}
	if _, err := c.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatalf("StartContainer %s: %v; containerd's log: %s", created.ContainerId, err, c.log())
	}
	return created.ContainerId
}

func terminationLog(hostPath string) []*runtimeapi.Mount {
	if hostPath == "" {
		return nil
	}
	return []*runtimeapi.Mount{{ContainerPath: "/dev/termination-log", HostPath: hostPath}}
}

// PID is the host pid of a running container's process.
func (c *Containerd) PID(t testing.TB, containerID string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: containerID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct{ Pid int }
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("no pid in the status of container %s (%v): %v", containerID, err, st.Info)
	}
	return info.Pid
}

// Package cri names the containers of a Kubernetes node: the pod's name,
// namespace and uid and the container's name, asked of the node's
// container runtime through its CRI socket (containerd, CRI-O, cri-dockerd)
// and cached per container. No API server is involved: the runtime knows
// what the kubelet asked it to run.
package cri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// DefaultSockets are where container runtimes serve the CRI on a node:
// containerd (and k3s's), CRI-O and cri-dockerd.
var DefaultSockets = []string{
	"/run/containerd/containerd.sock",
	"/run/k3s/containerd/containerd.sock",
	"/run/crio/crio.sock",
	"/run/cri-dockerd.sock",
}

// Names are what the runtime knows of a container's pod.
type Names struct {
	Pod, Namespace, PodUID, Container string
}

// The labels the kubelet puts on the containers it creates, read where
// the CRI's metadata is empty.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// Errors of Lookup. ErrNoRuntime and ErrUnknown are expected: a host
// without Kubernetes, a container another runtime runs.
var (
	ErrNoRuntime = errors.New("no CRI socket")
	ErrUnknown   = errors.New("the container runtime does not know the container")
)

// Bounds of the cache and of one question.
const (
	maxCached = 4096
	// callTimeout bounds one RPC: the runtime answers from memory.
	callTimeout = 2 * time.Second
	// retryNoRuntime is how long a host without a CRI socket is not asked
	// again.
	retryNoRuntime = 30 * time.Second
)

// Resolver asks the node's runtime for containers' names and caches them.
// Its methods are safe for concurrent use.
type Resolver struct {
	sockets []string
	now     func() time.Time

	mu        sync.Mutex
	conn      *grpc.ClientConn
	client    runtimeapi.RuntimeServiceClient
	socket    string
	noRuntime time.Time // when no socket was found, zero if one is open
	cache     *libpf.LRU[string, Names]
	sandboxes *libpf.LRU[string, Names]
}

// NewResolver asks the first of sockets that serves the CRI.
func NewResolver(sockets []string) *Resolver {
	return &Resolver{sockets: sockets, now: time.Now,
		cache: libpf.NewLRU[string, Names](maxCached, 0), sandboxes: libpf.NewLRU[string, Names](maxCached, 0)}
}

// Socket is the socket in use, "" while none is.
func (r *Resolver) Socket() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.socket
}

// Cached returns a container's names if a Lookup found them.
func (r *Resolver) Cached(containerID string) (Names, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cache.Get(containerID)
}

// Remember caches names found elsewhere (the kubelet's directory).
func (r *Resolver) Remember(containerID string, n Names) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.Add(containerID, n, 0)
}

// Lookup returns a container's names, asking the runtime unless they are
// cached.
func (r *Resolver) Lookup(ctx context.Context, containerID string) (Names, error) {
	if n, ok := r.Cached(containerID); ok {
		return n, nil
	}
	client, err := r.runtime()
	if err != nil {
		return Names{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cs, err := client.ListContainers(ctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{Id: containerID}})
	if err != nil {
		r.dropConn()
		return Names{}, fmt.Errorf("listing container %s: %w", containerID, err)
	}
	var c *runtimeapi.Container
	for _, x := range cs.Containers {
		if x.Id == containerID {
			c = x
		}
	}
	if c == nil {
		return Names{}, fmt.Errorf("%w: %s", ErrUnknown, containerID)
	}
	n, err := r.sandbox(ctx, client, c.PodSandboxId)
	if err != nil {
		return Names{}, err
	}
	n.Container = c.GetMetadata().GetName()
	fill(&n, c.Labels)
	r.mu.Lock()
	r.cache.Add(containerID, n, 0)
	r.mu.Unlock()
	return n, nil
}

// sandbox returns the names of a pod sandbox, cached.
func (r *Resolver) sandbox(ctx context.Context, client runtimeapi.RuntimeServiceClient, id string) (Names, error) {
	r.mu.Lock()
	n, ok := r.sandboxes.Get(id)
	r.mu.Unlock()
	if ok || id == "" {
		return n, nil
	}
	ps, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: id}})
	if err != nil {
		r.dropConn()
		return Names{}, fmt.Errorf("listing pod sandbox %s: %w", id, err)
	}
	for _, p := range ps.Items {
		if p.Id != id {
			continue
		}
		m := p.GetMetadata()
		n = Names{Pod: m.GetName(), Namespace: m.GetNamespace(), PodUID: m.GetUid()}
		fill(&n, p.Labels)
	}
	r.mu.Lock()
	r.sandboxes.Add(id, n, 0)
	r.mu.Unlock()
	return n, nil
}

// fill takes what the CRI's metadata left empty from the kubelet's labels.
func fill(n *Names, labels map[string]string) {
	for dst, key := range map[*string]string{&n.Pod: labelPodName, &n.Namespace: labelPodNamespace,
		&n.PodUID: labelPodUID, &n.Container: labelContainerName} {
		if *dst == "" {
			*dst = labels[key]
		}
	}
}

// runtime returns a client of the first socket that serves the CRI,
// connecting if needed.
func (r *Resolver) runtime() (runtimeapi.RuntimeServiceClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.client != nil {
		return r.client, nil
	}
	if !r.noRuntime.IsZero() && r.now().Sub(r.noRuntime) < retryNoRuntime {
		return nil, ErrNoRuntime
	}
	for _, s := range r.sockets {
		if fi, err := os.Stat(s); err != nil || fi.Mode()&os.ModeSocket == 0 {
			continue
		}
		conn, err := grpc.NewClient("unix://"+s, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			continue
		}
		r.conn, r.client, r.socket, r.noRuntime = conn, runtimeapi.NewRuntimeServiceClient(conn), s, time.Time{}
		return r.client, nil
	}
	r.noRuntime = r.now()
	return nil, fmt.Errorf("%w among %v", ErrNoRuntime, r.sockets)
}

// dropConn closes the connection after a failed call: the runtime may
// have restarted, or another socket may serve now.
func (r *Resolver) dropConn() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		r.conn.Close()
	}
	r.conn, r.client, r.socket = nil, nil, ""
}

// Close closes the connection.
func (r *Resolver) Close() { r.dropConn() }

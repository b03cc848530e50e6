package processmanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/hostprof/ebpf-profiler/processmanager/cri"
)

// maxPendingNames bounds the containers waiting to be named; beyond it a
// new one is named when another of its processes is set up.
const maxPendingNames = 1024

// containerNames names processes' containers (pod, namespace, container)
// in the background: a process is set up with the names its container's
// cache entry has, and otherwise its container is queued, asked of the
// runtime by one goroutine, and every process of it renamed when the
// answer comes. Nothing is asked per sample, nor under the manager's
// lock.
type containerNames struct {
	r     *cri.Resolver
	queue chan nameRequest
	done  chan struct{}
	// kubeletRoot is where the kubelet keeps its pods' directories, asked
	// where no CRI socket answers; procFS where /proc is.
	kubeletRoot, procFS string

	mu      sync.Mutex
	pending map[string]bool
	closed  bool
}

// nameRequest asks for a container's names, for one of its processes.
type nameRequest struct {
	id, podUID string
	pid        uint32
}

func newContainerNames(sockets []string, kubeletRoot, procFS string,
	apply func(id string, n cri.Names, err error)) *containerNames {
	c := &containerNames{r: cri.NewResolver(sockets), queue: make(chan nameRequest, maxPendingNames),
		done: make(chan struct{}), pending: map[string]bool{}, kubeletRoot: kubeletRoot, procFS: procFS}
	go func() {
		defer close(c.done)
		for req := range c.queue {
			n, err := c.lookup(req)
			c.mu.Lock()
			delete(c.pending, req.id)
			c.mu.Unlock()
			apply(req.id, n, err)
		}
	}()
	return c
}

// lookup asks the runtime, or, where no CRI socket answers, reads the
// kubelet's directory of the container's pod.
func (c *containerNames) lookup(req nameRequest) (cri.Names, error) {
	n, err := c.r.Lookup(context.Background(), req.id)
	if !errors.Is(err, cri.ErrNoRuntime) || req.podUID == "" || c.kubeletRoot == "" {
		return n, err
	}
	mountinfo, merr := os.Open(fmt.Sprintf("%s/%d/mountinfo", c.procFS, req.pid))
	if merr == nil {
		defer mountinfo.Close()
	}
	n, kerr := cri.FromKubelet(c.kubeletRoot, req.podUID, mountinfo)
	if kerr != nil {
		return n, err
	}
	// A container's first process may not have its mounts yet (the
	// runtime's init): its next process looks again.
	if n.Container != "" {
		c.r.Remember(req.id, n)
	}
	return n, nil
}

// names returns the names of a process's container if they are known,
// and otherwise queues it to be asked for.
func (c *containerNames) names(req nameRequest) (cri.Names, bool) {
	if n, ok := c.r.Cached(req.id); ok {
		return n, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.pending[req.id] {
		return cri.Names{}, false
	}
	select {
	case c.queue <- req:
		c.pending[req.id] = true
	default:
	}
	return cri.Names{}, false
}

func (c *containerNames) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.queue)
	}
	c.mu.Unlock()
	<-c.done
	c.r.Close()
}

// nameContainer gives a new process its container's names, or has them
// asked for. The caller holds m.mu.
func (m *Manager) nameContainer(p *process) {
	if m.names == nil || p.info == nil || p.info.ContainerID == "" {
		return
	}
	if n, ok := m.names.names(nameRequest{id: p.info.ContainerID, podUID: p.info.PodUID, pid: p.pid}); ok {
		m.setContainerNames(p, n)
	}
}

// applyContainerNames renames the processes of a container once the
// runtime answered.
func (m *Manager) applyContainerNames(id string, n cri.Names, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if !errors.Is(err, cri.ErrNoRuntime) && !errors.Is(err, cri.ErrUnknown) {
			m.counters.criErrors++
			m.log.WithError(err).Debugf("container %s: no Kubernetes names", id)
		}
		return
	}
	m.counters.containersNamed++
	for _, p := range m.procs {
		if p.info != nil && p.info.ContainerID == id {
			m.setContainerNames(p, n)
		}
	}
}

// setContainerNames puts names on a process's info (a copy: reported
// samples keep theirs) and has its later traces converted anew. The
// caller holds m.mu.
func (m *Manager) setContainerNames(p *process, n cri.Names) {
	info := *p.info
	if info.PodName == n.Pod && info.Namespace == n.Namespace && info.ContainerName == n.Container {
		return
	}
	info.PodName, info.Namespace, info.ContainerName = n.Pod, n.Namespace, n.Container
	if info.PodUID == "" {
		info.PodUID = n.PodUID
	}
	p.info = &info
	p.gen = m.newGeneration()
}

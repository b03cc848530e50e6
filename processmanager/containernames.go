package processmanager

import (
	"context"
	"errors"
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
	queue chan string
	done  chan struct{}

	mu      sync.Mutex
	pending map[string]bool
	closed  bool
}

func newContainerNames(sockets []string, apply func(id string, n cri.Names, err error)) *containerNames {
	c := &containerNames{r: cri.NewResolver(sockets), queue: make(chan string, maxPendingNames),
		done: make(chan struct{}), pending: map[string]bool{}}
	go func() {
		defer close(c.done)
		for id := range c.queue {
			n, err := c.r.Lookup(context.Background(), id)
			c.mu.Lock()
			delete(c.pending, id)
			c.mu.Unlock()
			apply(id, n, err)
		}
	}()
	return c
}

// names returns a container's names if they are known, and otherwise
// queues it to be asked for.
func (c *containerNames) names(id string) (cri.Names, bool) {
	if n, ok := c.r.Cached(id); ok {
		return n, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.pending[id] {
		return cri.Names{}, false
	}
	select {
	case c.queue <- id:
		c.pending[id] = true
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
	if n, ok := m.names.names(p.info.ContainerID); ok {
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

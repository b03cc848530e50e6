package processmanager

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
	"github.com/hostprof/ebpf-profiler/processmanager/processctx"
)

// processContext is what the manager read of a process's OpenTelemetry
// process context (OTEP 4719).
type processContext struct {
	// addr is the header's address; publishedAt the publication read.
	addr, publishedAt uint64
	ctx               *processctx.Context
}

// splitContextMapping removes the process context's mapping from a
// process's mappings (Maps lists it beside the executable ones) and
// returns its start, 0 without one.
func splitContextMapping(entries []proc.MapsEntry) ([]proc.MapsEntry, uint64) {
	var addr uint64
	entries = slices.DeleteFunc(entries, func(e proc.MapsEntry) bool {
		if processctx.IsMapping(e.Path, e.Executable) {
			addr = e.Start
			return true
		}
		return false
	})
	return entries, addr
}

// readProcessContext reads a process's context when its mapping appears or
// moves, or when it was published again, and forgets it when the mapping
// is gone. Called with each read of the process's maps, which a sampled
// process has now and then. The caller holds m.mu.
func (m *Manager) readProcessContext(p *process, addr uint64) {
	defer m.findThreadContext(p)
	if addr == 0 {
		if p.procCtx != nil {
			p.procCtx = nil
			m.setResource(p, nil, 0)
		}
		return
	}
	mem, err := m.processMem(p)
	if err != nil {
		return
	}
	if c := p.procCtx; c != nil && c.addr == addr {
		if at, err := processctx.PublishedAt(mem, addr); err != nil || at == c.publishedAt || at == 0 {
			return
		}
	}
	ctx, err := processctx.Read(mem, addr)
	if err != nil {
		if !errors.Is(err, processctx.ErrUpdating) {
			m.counters.processContextErrors++
			m.log.WithError(err).Debugf("process %d: process context at %#x not read", p.pid, addr)
		}
		return
	}
	m.counters.processContexts++
	p.procCtx = &processContext{addr: addr, publishedAt: ctx.PublishedAt, ctx: ctx}
	m.setResource(p, ctx, monotonicOf(ctx.PublishedAt))
	m.log.Debugf("process %d: process context of service %q (%d resource attributes)", p.pid,
		ctx.Get("service.name"), len(ctx.Resource))
}

// setResource puts a process context's resource on the process's info (a
// copy: reported samples keep theirs): its attributes for the OTLP
// resource, and the service and environment names it gives, which win
// over an APM agent's. Samples taken before since (CLOCK_MONOTONIC ns;
// 0: none) keep the info before. The caller holds m.mu.
func (m *Manager) setResource(p *process, ctx *processctx.Context, since uint64) {
	before := *p.info
	before.Before, before.Since = nil, 0
	info := before
	if since > 0 {
		info.Before, info.Since = &before, since
	}
	info.Resource, info.AttributeKeys = libpf.Labels{}, nil
	if ctx != nil {
		attrs := make([]libpf.Label, 0, len(ctx.Resource))
		for _, a := range ctx.Resource {
			attrs = append(attrs, libpf.Label{Key: a.Key, Value: a.Value})
		}
		info.Resource = libpf.MakeLabels(attrs)
		info.ServiceName = cmp.Or(ctx.Get("service.name"), info.ServiceName)
		info.ServiceVersion = ctx.Get("service.version")
		info.DeploymentEnvironment = cmp.Or(ctx.Get("deployment.environment.name"), info.DeploymentEnvironment)
		if len(ctx.KeyMap) > 0 {
			keys := slices.Clone(ctx.KeyMap)
			info.AttributeKeys = &keys
		}
	}
	p.info = &info
	p.gen = m.newGeneration()
}

// monotonicOf turns a published-at time, CLOCK_BOOTTIME as the OTEP
// recommends, into the samples' CLOCK_MONOTONIC (the two differ by the
// time the host was suspended); 0 when it is not a boot time (in the
// future, or before boot): the change is then dated when it was read.
func monotonicOf(boottime uint64) uint64 {
	var b, mono unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &b) != nil || unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono) != nil {
		return 0
	}
	// Read one after the other, the two differ by a few hundred ns
	// either way when the host never slept.
	suspended := uint64(max(b.Nano()-mono.Nano(), 0))
	if boottime > uint64(b.Nano())+uint64(time.Second) || boottime < suspended {
		return 0
	}
	return boottime - suspended
}

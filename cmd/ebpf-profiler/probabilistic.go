package main

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	log "github.com/sirupsen/logrus"
)

// sampler is what probabilistic profiling switches: the tracer.
type sampler interface {
	SetSampling(on bool) error
}

// probabilistic profiling samples the host during a share of intervals
// chosen at random, as the reference profiler defines it: at the start of
// every interval a number from 0 to 99 is drawn, and the host is sampled
// for that interval when the number is below the threshold. Across a fleet
// this keeps threshold% of the hosts' samples at threshold% of the cost.
type probabilistic struct {
	threshold uint
	interval  time.Duration
	// draw returns a number in [0, 100).
	draw    func() uint
	sampler sampler
	// on is the current decision, read by the monitor.
	on atomic.Bool
}

func newProbabilistic(threshold uint, interval time.Duration, s sampler) *probabilistic {
	p := &probabilistic{threshold: threshold, interval: interval, sampler: s,
		draw: func() uint { return rand.UintN(100) }}
	p.on.Store(true)
	return p
}

// enabled reports whether probabilistic profiling is on at all: threshold
// 100 samples always.
func (p *probabilistic) enabled() bool { return p.threshold < 100 }

// decide draws for the next interval and switches sampling if the decision
// changed.
func (p *probabilistic) decide() {
	n := p.draw()
	on := n < p.threshold
	log.Debugf("Probabilistic profiling: drew %d against threshold %d: sampling %s for %v",
		n, p.threshold, onOff(on), p.interval)
	if on == p.on.Load() {
		return
	}
	if err := p.sampler.SetSampling(on); err != nil {
		log.Warnf("Probabilistic profiling: turning sampling %s: %v", onOff(on), err)
	}
	p.on.Store(on)
}

// run decides at each tick until ctx ends or ticks closes; the first
// decision is the caller's (before the tracer attaches, so that an off
// interval never samples).
func (p *probabilistic) run(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ticks:
			if !ok {
				return
			}
			p.decide()
		}
	}
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

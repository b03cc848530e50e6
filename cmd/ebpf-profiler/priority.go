package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	log "github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// The daemon's start-up (verifying its BPF programs, reading every busy
// process, extracting and loading their stack deltas) is a second or two
// of CPU. On a saturated host a process at the default priority gets a
// thread's fair share of it, and the first complete stacks came only after
// 10 s (12 busy processes on 2 CPUs). So the daemon starts at a higher
// priority, -startup-nice, and returns to the one it was started with once
// its first profile is out and its queue of stack deltas has run empty.
// A daemon started below the default priority (systemd's Nice=) was put
// there on purpose and is left alone.
//
// The boost changes when the daemon takes its CPU, not how much: the same
// start-up work is done at any priority, so the busy processes lose the
// same CPU time, at once rather than over seconds of wrong stacks. Hence
// the highest priority by default: with 17 busy processes on 2 CPUs (the
// polyglot host of TestStartupAccuracy) a restart set them up in 3.0 s at
// nice -20 against 4.8-6.9 s at nice -5, a cold start in 4.6 s against
// 6.4-10 s.

// maxStartupBoost bounds the wait for start-up to settle (a host whose
// processes keep the delta queue busy).
const maxStartupBoost = time.Minute

// priorityBoost is a raised scheduling priority, undone by returning to the
// default (the only priority it raises from).
type priorityBoost struct {
	start time.Time
}

// boostPriority raises every thread of the daemon to nice value to, if it
// runs at the default priority (0). It returns nil when it did nothing.
func boostPriority(to int) *priorityBoost {
	if to >= 0 {
		return nil
	}
	from, err := niceOf(0)
	if err != nil || from != 0 {
		return nil
	}
	if err := setNice(to); err != nil {
		log.Debugf("Start-up at the default scheduling priority: %v", err)
		setNice(0)
		return nil
	}
	log.Debugf("Starting at scheduling priority nice %d", to)
	return &priorityBoost{start: time.Now()}
}

// waitStartup returns once done says start-up is over (polled), after
// maxStartupBoost, or when ctx ends (false then).
func waitStartup(ctx context.Context, done func() bool) bool {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(maxStartupBoost)
	for !done() {
		select {
		case <-ctx.Done():
			return false
		case <-deadline:
			return true
		case <-tick.C:
		}
	}
	return true
}

// end returns the priority to the default.
func (b *priorityBoost) end() {
	if b == nil {
		return
	}
	if err := setNice(0); err != nil {
		log.Warnf("Could not return to the default scheduling priority after start-up: %v", err)
		return
	}
	log.Debugf("Start-up done after %v: back to the default scheduling priority", time.Since(b.start).Round(time.Millisecond))
}

// niceOf returns the nice value of thread tid (0: the caller).
func niceOf(tid int) (int, error) {
	// The raw system call returns 20 - nice, so that no value is negative.
	p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return 0, err
	}
	return 20 - p, nil
}

// setNice sets the nice value of every thread of the process: Linux keeps
// it per thread, and a new thread inherits its creator's. Twice, for
// threads created while the first pass ran.
func setNice(nice int) error {
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("setting nice %d on thread %d: %w", nice, tid, err)
			}
		}
	}
	return nil
}

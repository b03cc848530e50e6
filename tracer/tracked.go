package tracer

import log "github.com/sirupsen/logrus"

// The tracked_pids map (tracemgmt.h): the processes user space keeps state
// for. Once the filter is on, BPF sends exec, exit and mapping events only
// of those, and execs of programs whose deltas are not loaded. Pid 0 is
// the switch: absent or 1, every process counts as tracked.

// trackedSwitch is the key of the switch entry.
const trackedSwitch = uint32(0)

// FilterProcessEvents turns the filter on. Call it before tracking the
// first process, and only where processes are read at their first sample
// (ResolvesUnread and a process manager that defers exec'd processes).
func (t *Tracer) FilterProcessEvents() error {
	return t.objs.TrackedPIDs.Put(trackedSwitch, uint8(0))
}

// TrackProcess says user space keeps state for pid from now on; call it
// before reading the process's mappings, so that no exec in between goes
// unreported. A pid that does not fit turns the filter off for good (and
// says so once): every event is sent again, as before FilterProcessEvents.
func (t *Tracer) TrackProcess(pid uint32) {
	if pid == trackedSwitch {
		return
	}
	m := t.objs.TrackedPIDs
	if err := m.Put(pid, uint8(1)); err != nil {
		// Updating the existing switch entry needs no room.
		if err := m.Put(trackedSwitch, uint8(1)); err != nil {
			log.Errorf("Process events: could not turn their filter off: %v", err)
		}
		t.warnUntracked.Do(func() {
			log.Warnf("Process events: more processes than the filter holds (%v); events of every process "+
				"are sent from now on, each exec and exit of short commands costs a wakeup", err)
		})
	}
}

// UntrackProcess says user space forgot pid.
func (t *Tracer) UntrackProcess(pid uint32) {
	if pid == trackedSwitch {
		return
	}
	if err := ignoreMissing(t.objs.TrackedPIDs.Delete(pid)); err != nil {
		log.Debugf("Process events: untracking %d: %v", pid, err)
	}
}

package unwindmaps

import (
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/support"
)

// pageRun is one page's deltas as BPF stores them: the first starts at the
// page's first address, so BPF never looks at the page before. The runs of
// a file share one array, in page order.
type pageRun struct {
	page   uint64
	deltas []support.StackDelta
}

// deltaSeq is a file's deltas on their way to the BPF maps, yielded in
// address order: extracted, or decoded from the cache as they are laid out.
type deltaSeq struct {
	// n is how many (for sizing): marking a runtime's code may add two.
	n   int
	all iter.Seq[nativeunwind.Delta]
}

// seqOf yields d.
func seqOf(d nativeunwind.Deltas) deltaSeq { return deltaSeq{n: len(d), all: slices.Values(d)} }

// errTooManyRules is returned when the shared rule table is full.
var errTooManyRules = errors.New("unwind rule table full")

// layoutDeltas splits a file's deltas into pages of 1<<pageBits addresses
// and returns the pages' runs and the array they share (all of them, in
// order, as the pool holds them). intern returns the rule table index of a
// rule. Pages that only hold addresses without unwind information are left
// out: BPF treats a missing page like an unknown rule and tries frame
// pointers.
func layoutDeltas(d deltaSeq, pageBits uint, intern func(nativeunwind.Rule) (uint16, error)) (
	[]pageRun, []support.StackDelta, error) {
	pageSize := uint64(1) << pageBits
	// One array for every page, a little more than the deltas (each page
	// a rule spans adds one): a million deltas in slices of their own
	// made tens of MiB of garbage.
	all := make([]support.StackDelta, 0, d.n+d.n/8+1)
	var runs []pageRun
	var starts []int
	// place lays out delta, whose rule holds until end.
	place := func(delta nativeunwind.Delta, end uint64, last bool) error {
		if end <= delta.Address {
			return fmt.Errorf("deltas not sorted at %#x", delta.Address)
		}
		if delta.Rule.CFA == nativeunwind.CFAUnknown {
			// A page already started needs the gap marked; others can
			// do without it.
			if n := len(runs); n > 0 && runs[n-1].page == delta.Address>>pageBits {
				all = append(all, support.StackDelta{AddrLow: uint16(delta.Address & (pageSize - 1)), Rule: 0})
			}
			return nil
		}
		if last {
			// A last delta with a rule has no known end; code ends with
			// its page.
			end = (delta.Address | (pageSize - 1)) + 1
		}
		rule, err := intern(delta.Rule)
		if err != nil {
			return err
		}
		// The delta's rule holds on every page it touches.
		for addr := delta.Address; addr < end && addr >= delta.Address; {
			page := addr >> pageBits
			if n := len(runs); n == 0 || runs[n-1].page != page {
				runs = append(runs, pageRun{page: page})
				starts = append(starts, len(all))
				if addr&(pageSize-1) != 0 {
					// Addresses before the delta on this page have no
					// rule.
					all = append(all, support.StackDelta{})
				}
			}
			all = append(all, support.StackDelta{AddrLow: uint16(addr & (pageSize - 1)), Rule: rule})
			next := (page + 1) << pageBits
			if next == 0 {
				break // the last page of the address space
			}
			addr = next
		}
		return nil
	}
	// Each delta is placed when the next one gives its end.
	var cur nativeunwind.Delta
	started := false
	for next := range d.all {
		if started {
			if err := place(cur, next.Address, false); err != nil {
				return nil, nil, err
			}
		}
		cur, started = next, true
	}
	if started {
		if err := place(cur, ^uint64(0), true); err != nil {
			return nil, nil, err
		}
	}
	for i := range runs {
		end := len(all)
		if i+1 < len(runs) {
			end = starts[i+1]
		}
		runs[i].deltas = all[starts[i]:end:end]
	}
	return runs, all, nil
}

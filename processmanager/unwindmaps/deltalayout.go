package unwindmaps

import (
	"errors"
	"fmt"

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

// errTooManyRules is returned when the shared rule table is full.
var errTooManyRules = errors.New("unwind rule table full")

// layoutDeltas splits a file's deltas into pages of 1<<pageBits addresses
// and returns the pages' runs and the array they share (all of them, in
// order, as the pool holds them). intern returns the rule table index of a
// rule. Pages that only hold addresses without unwind information are left
// out: BPF treats a missing page like an unknown rule and tries frame
// pointers.
func layoutDeltas(d nativeunwind.Deltas, pageBits uint, intern func(nativeunwind.Rule) (uint16, error)) (
	[]pageRun, []support.StackDelta, error) {
	pageSize := uint64(1) << pageBits
	// One array for every page, a little more than the deltas (each page
	// a rule spans adds one): a million deltas in slices of their own
	// made tens of MiB of garbage.
	all := make([]support.StackDelta, 0, len(d)+len(d)/8+1)
	var runs []pageRun
	var starts []int
	for i, delta := range d {
		end := ^uint64(0)
		if i+1 < len(d) {
			end = d[i+1].Address
		}
		if end <= delta.Address {
			return nil, nil, fmt.Errorf("deltas not sorted at %#x", delta.Address)
		}
		if delta.Rule.CFA == nativeunwind.CFAUnknown {
			// A page already started needs the gap marked; others can
			// do without it.
			if n := len(runs); n > 0 && runs[n-1].page == delta.Address>>pageBits {
				all = append(all, support.StackDelta{AddrLow: uint16(delta.Address & (pageSize - 1)), Rule: 0})
			}
			continue
		}
		if i+1 == len(d) {
			// A last delta with a rule has no known end; code ends with
			// its page.
			end = (delta.Address | (pageSize - 1)) + 1
		}
		rule, err := intern(delta.Rule)
		if err != nil {
			return nil, nil, err
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

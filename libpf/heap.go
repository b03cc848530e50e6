package libpf

import "time"

// HeapProfile is one read of a program's own sampled record of its heap
// (a Go program's memory-profile buckets, the data of its
// /debug/pprof/heap): what it allocated since it started and what of that
// is still in use, per allocating stack, at Time.
type HeapProfile struct {
	Process *ProcessInfo
	Time    time.Time
	// Period is the program's sampling period in bytes (one sample per
	// Period bytes allocated, on average); the values are scaled up from
	// the samples already.
	Period  int64
	Samples []HeapSample
	// Symbolize makes the trace of a sample's Stack, anew on each call: a
	// profile keeps only the addresses of its thousands of stacks for as
	// long as it waits to be reported. Safe for concurrent use.
	Symbolize func(stack []uint64) *Trace
}

// HeapSample is one allocation site of a HeapProfile: its stack and the
// objects and bytes allocated there since the program started and still
// in use.
type HeapSample struct {
	// Stack is what the profile's Symbolize makes the site's trace of
	// (addresses in the program's executable, leaf first).
	Stack                                              []uint64
	AllocObjects, AllocBytes, InUseObjects, InUseBytes int64
}

// Trace is the trace of sample i, made anew.
func (hp *HeapProfile) Trace(i int) *Trace { return hp.Symbolize(hp.Samples[i].Stack) }

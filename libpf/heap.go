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
}

// HeapSample is one allocation site of a HeapProfile: its stack, leaf
// first, and the objects and bytes allocated there since the program
// started and still in use.
type HeapSample struct {
	Trace                                              *Trace
	AllocObjects, AllocBytes, InUseObjects, InUseBytes int64
}

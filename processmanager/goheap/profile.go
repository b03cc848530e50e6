package goheap

import (
	"math"
	"strings"

	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
)

// Frame is one frame of an allocation's stack.
type Frame struct {
	// Address is the executable's (file) address looked up: a return
	// address less one, inside its call.
	Address        uint64
	Function, File string
	Line           int
}

// Sample is one allocation site as the program's own heap profile
// (/debug/pprof/heap) shows it: its stack, innermost first, without the
// runtime's allocation frames, and its counts scaled up from the sampled
// ones.
type Sample struct {
	// Stack are the executable's addresses to look up (Resolver), a
	// return address less one for each logical frame (inlined ones
	// included): the names are made when the profile is exported, as a
	// process's thousands of stacks wait for it.
	Stack                                              []uint64
	AllocObjects, AllocBytes, InUseObjects, InUseBytes int64
}

// Samples scales buckets of a Go 1.minor program whose MemProfileRate is
// rate as runtime/pprof writes its heap profile, and trims their stacks as
// it does (resolve, see Resolver, names the functions): each return
// address is looked up at pc-1 (a bucket's stack holds one address per
// logical frame, inlined ones included), the leading frames of the runtime
// (and, from 1.24, of internal/runtime/) and runtime.goexit are dropped,
// and each pair of count and bytes is scaled by the chance that an
// allocation of the average size was sampled (runtime/pprof's
// scaleHeapSample). The buckets' stacks are reused.
func Samples(buckets []Bucket, resolve func(pc uint64) Frame, minor int, rate int64) []Sample {
	out := make([]Sample, 0, len(buckets))
	for _, b := range buckets {
		stack := b.Stack[:0]
		for _, pc := range b.Stack {
			if resolve(pc-1).Function != "runtime.goexit" {
				stack = append(stack, pc-1)
			}
		}
		skip := 0
		for skip < len(stack) && isRuntimeFrame(resolve(stack[skip]).Function, minor) {
			skip++
		}
		if skip < len(stack) {
			stack = stack[skip:]
		}
		inObj, inBytes := b.InUse()
		s := Sample{Stack: stack}
		s.AllocObjects, s.AllocBytes = scale(b.Allocs, b.AllocBytes, rate)
		s.InUseObjects, s.InUseBytes = scale(inObj, inBytes, rate)
		out = append(out, s)
	}
	return out
}

func isRuntimeFrame(name string, minor int) bool {
	return strings.HasPrefix(name, "runtime.") || (minor >= 24 && strings.HasPrefix(name, "internal/runtime/"))
}

// scale estimates the allocations a sampled count and its bytes stand
// for: an allocation of size s is sampled with probability 1-e^(-s/rate).
func scale(count, bytes uint64, rate int64) (int64, int64) {
	if count == 0 || bytes == 0 {
		return 0, 0
	}
	if rate <= 1 {
		return int64(count), int64(bytes)
	}
	avg := float64(bytes) / float64(count)
	s := 1 / (1 - math.Exp(-avg/float64(rate)))
	return int64(float64(count) * s), int64(float64(bytes) * s)
}

// maxResolved bounds the addresses a Resolver remembers.
const maxResolved = 1 << 16

// Resolver returns a function that resolves an address of an executable
// with lookup (its debug information's: frames there, innermost first)
// to its innermost function, file and line ("?" where none covers it),
// remembering the answers: stacks share most of their addresses.
func Resolver(lookup func(addr uint64) ([]debuginfo.Frame, error)) func(pc uint64) Frame {
	seen := map[uint64]Frame{}
	return func(pc uint64) Frame {
		if fr, ok := seen[pc]; ok {
			return fr
		}
		fr := Frame{Address: pc, Function: "?"}
		if frames, err := lookup(pc); err == nil && len(frames) > 0 {
			fr = Frame{Address: pc, Function: frames[0].Function, File: frames[0].File, Line: int(frames[0].Line)}
		}
		if len(seen) >= maxResolved {
			clear(seen)
		}
		seen[pc] = fr
		return fr
	}
}

// Command prog is the workload of nativeunwind's pclntab tests.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"
)

var (
	started atomic.Uint32
	sink    int
)

// main must run on the main thread, which the tracer follows.
func init() { runtime.LockOSThread() }

func main() {
	debug.SetGCPercent(-1) // no GC work while single-stepped
	if len(os.Args) < 2 || os.Args[1] != "step" {
		fmt.Println(work(3))
		return
	}
	fmt.Printf("tid %d flag %#x\n", syscall.Gettid(), uintptr(unsafe.Pointer(&started)))
	for started.Load() == 0 {
	}
	done(work(3))
}

// done is where the tracer stops stepping.
//
//go:noinline
func done(r int) {
	sink = r
	os.Exit(0)
}

// work, top, mid and leaf form the call chain the tracer checks frame by
// frame; their frames are of different sizes, one of them larger than a
// page so that its prologue takes the large-frame path.
//
//go:noinline
func work(n int) int {
	go func() {}() // runtime.newproc runs newproc1 on the system stack
	s := top(n)
	s += grow(12, n)
	s += cgoWork()
	return s + len(format(n))
}

//go:noinline
func top(n int) int {
	var a [8]int
	for i := range a {
		a[i] = mid(n + i)
	}
	return a[n%8]
}

//go:noinline
func mid(n int) int {
	var big [600]int
	for i := 0; i < 100; i++ {
		big[i] = leaf(i, n)
	}
	return big[n]
}

//go:noinline
func leaf(i, n int) int {
	if i%37 == 0 {
		return generic(i, n) + (&counter{n: n}).add(i)
	}
	return i * n
}

func generic[T int | int64](a, b T) T { return a*b + 1 }

type counter struct{ n int }

//go:noinline
func (c *counter) add(i int) int {
	f := func(j int) int { return c.n + j }
	return f(i)
}

// grow recurses with a sizeable frame, so the stack must grow
// (runtime.morestack, newstack, copystack on the system stack).
//
//go:noinline
func grow(depth, n int) int {
	var pad [64]int
	pad[depth%64] = n
	if depth == 0 {
		return pad[0]
	}
	return grow(depth-1, n) + pad[depth%64]
}

//go:noinline
func format(n int) string {
	var b strings.Builder
	for i := 0; i < 2; i++ {
		fmt.Fprintf(&b, "%d:%s;", n+i, strings.Repeat("x", i))
	}
	return b.String()
}

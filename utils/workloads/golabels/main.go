// Command golabels is a test workload for goroutine labels: goroutines
// spin in loops of their own, each under its own pprof labels, for
// SECONDS. Usage: golabels SECONDS
//
//	main.alphaLoop  under tenant=alpha (pprof.Do), with endpoint=/a
//	main.betaLoop   under tenant=beta (pprof.Do), with endpoint=/b
//	main.plainLoop  under no labels
//	main.manyLoop   under 12 labels, k00..k11 (pprof.SetGoroutineLabels),
//	                k00's value (LongValue) longer than a sample keeps
//
// Each loop calls runtime.Gosched now and then, so that goroutines move
// between threads: a label must follow its goroutine, not its thread.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

var sink [4]uint64

// spin burns CPU until end, yielding every few milliseconds.
//
//go:noinline
func spin(slot int, end time.Time) {
	for time.Now().Before(end) {
		for i := uint64(0); i < 200_000; i++ {
			sink[slot] += i * i
		}
		runtime.Gosched()
	}
}

//go:noinline
func alphaLoop(end time.Time) { spin(0, end) }

//go:noinline
func betaLoop(end time.Time) { spin(1, end) }

//go:noinline
func plainLoop(end time.Time) { spin(2, end) }

//go:noinline
func manyLoop(end time.Time) { spin(3, end) }

// LongValue is the value of k00 under manyLoop: longer than 48 bytes.
var LongValue = strings.Repeat("v", 64)

func main() {
	seconds := 5.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	run := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	ctx := context.Background()
	run(func() {
		pprof.Do(ctx, pprof.Labels("tenant", "alpha", "endpoint", "/a"), func(context.Context) { alphaLoop(end) })
	})
	run(func() {
		pprof.Do(ctx, pprof.Labels("tenant", "beta", "endpoint", "/b"), func(context.Context) { betaLoop(end) })
	})
	run(func() { plainLoop(end) })
	run(func() {
		var kv []string
		for i := 0; i < 12; i++ {
			v := fmt.Sprintf("v%02d", i)
			if i == 0 {
				v = LongValue
			}
			kv = append(kv, fmt.Sprintf("k%02d", i), v)
		}
		pprof.SetGoroutineLabels(pprof.WithLabels(ctx, pprof.Labels(kv...)))
		manyLoop(end)
	})
	wg.Wait()
	fmt.Println(runtime.Version())
}

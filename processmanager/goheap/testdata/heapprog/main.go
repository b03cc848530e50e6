// heapprog allocates on known stacks (and with "many" or "mid" as its
// first argument, at 11,000 or 2,200 sites): retainLeaf keeps 200 allocations of
// 64 KiB (every allocation sampled with "all" as its first argument,
// else one per 512 KiB, the default), churnLeaf allocates and drops
// 64 MiB, retainSmall keeps 100,000 objects of 48 bytes. It prints what
// its own runtime.MemProfile says of retainLeaf's bucket ("want OBJECTS
// INUSE_BYTES ALLOC_BYTES"), writes its own heap profile (runtime/pprof)
// to the file its second argument names, if any, prints "ready", and
// waits for its standard input to end, for the tests to read its memory.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
)

var retained [][]byte

type small struct{ a, b, c, d, e, f uint64 }

var smalls []*small

//go:noinline
func retainLeaf(n, size int) {
	for i := 0; i < n; i++ {
		retained = append(retained, make([]byte, size))
	}
}

//go:noinline
func churnLeaf(total, size int) int {
	sum := 0
	for i := 0; i < total/size; i++ {
		b := make([]byte, size)
		sum += len(b)
	}
	return sum
}

// manyLeaf keeps one object of each size class below 32 KiB at each
// recursion depth down from depth: thousands of buckets (mode "many").
//
//go:noinline
func manyLeaf(depth int) {
	if depth > 0 {
		manyLeaf(depth - 1)
	}
	for size := 8; size <= 32<<10; size += size / 8 {
		retained = append(retained, make([]byte, size))
	}
}

// manyA and manyB are two call paths into manyLeaf: twice the buckets,
// some 11,000.
//
//go:noinline
func manyA(depth int) { manyLeaf(depth) }

//go:noinline
func manyB(depth int) { manyLeaf(depth) }

//go:noinline
func retainSmall(n int) {
	for i := 0; i < n; i++ {
		smalls = append(smalls, &small{a: uint64(n)})
	}
}

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	if mode == "all" || mode == "many" || mode == "mid" {
		runtime.MemProfileRate = 1
	}
	switch mode {
	case "many":
		manyA(100)
		manyB(100)
	case "mid":
		// Some 2,200 buckets up to 25 frames deep: a service's.
		manyA(20)
		manyB(20)
	}
	retainLeaf(200, 64<<10)
	churnLeaf(64<<20, 32<<10)
	retainSmall(100000)
	runtime.GC()
	runtime.GC()
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+100)
	n, _ = runtime.MemProfile(recs, true)
	for _, r := range recs[:n] {
		for _, pc := range r.Stack() {
			if fn := runtime.FuncForPC(pc - 1); fn != nil && fn.Name() == "main.retainLeaf" && r.AllocBytes >= 64<<10 {
				fmt.Printf("want %d %d %d\n", r.InUseObjects(), r.InUseBytes(), r.AllocBytes)
			}
		}
	}
	if len(os.Args) > 2 {
		f, err := os.Create(os.Args[2])
		if err == nil {
			err = pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	fmt.Fprintln(io.Discard, len(retained), len(smalls))
}

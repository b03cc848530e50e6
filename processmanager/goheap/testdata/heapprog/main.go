// heapprog retains 200 allocations of 64 KiB under main.retainLeaf with
// every allocation sampled, then prints what its own runtime.MemProfile
// says of that bucket ("want OBJECTS INUSE_BYTES ALLOC_BYTES") and waits
// for its standard input to end, for TestReadBuckets to read its memory.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
)

var retained [][]byte

//go:noinline
func retainLeaf(n, size int) {
	for range n {
		retained = append(retained, make([]byte, size))
	}
}

func main() {
	runtime.MemProfileRate = 1
	retainLeaf(200, 64<<10)
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
	io.Copy(io.Discard, os.Stdin)
	fmt.Fprintln(io.Discard, len(retained))
}

// Command goheap is a test workload for Go heap profiles: it allocates on
// known stacks and serves its own heap profile, so that what a profiler
// reads from its memory can be compared with what the program says.
// Usage: goheap ADDR SECONDS
//
//	main.retainLeaf   keeps 64 MiB alive (1,024 buffers of 64 KiB)
//	main.retainMid    keeps 16 MiB alive (4,096 of 4 KiB)
//	main.retainSmall  keeps 6 MiB alive (131,072 objects of 48 bytes)
//	main.churnLeaf    allocates 1 GiB a minute in 32 KiB buffers and drops
//	                  them at once
//
// It serves net/http/pprof on ADDR (GET /debug/pprof/heap; port 0 picks
// one), prints "ready ADDRESS" once the retained memory is allocated, and
// exits after SECONDS.
package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"strconv"
	"time"
)

var (
	retained [][]byte
	smalls   []*small
	// churned keeps the last buffer churnLeaf made: the buffers escape to
	// the heap (a buffer that does not is made on the stack).
	churned []byte
)

type small struct{ a, b, c, d, e, f uint64 }

//go:noinline
func retainLeaf() {
	for i := 0; i < 1024; i++ {
		retained = append(retained, make([]byte, 64<<10))
	}
}

//go:noinline
func retainMid() {
	for i := 0; i < 4096; i++ {
		retained = append(retained, make([]byte, 4<<10))
	}
}

//go:noinline
func retainSmall() {
	for i := 0; i < 128<<10; i++ {
		smalls = append(smalls, &small{a: uint64(i)})
	}
}

// churnLeaf allocates n buffers of 32 KiB and keeps none.
//
//go:noinline
func churnLeaf(n int) {
	for i := 0; i < n; i++ {
		churned = make([]byte, 32<<10)
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: goheap ADDR SECONDS")
		os.Exit(2)
	}
	secs, err := strconv.ParseFloat(os.Args[2], 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	retainLeaf()
	retainMid()
	retainSmall()
	go http.Serve(ln, nil)
	fmt.Println("ready", ln.Addr())
	// 1 GiB a minute: 32,768 buffers of 32 KiB, 546 every second, in
	// batches every 10 ms.
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for time.Now().Before(end) {
		churnLeaf(546 / 100)
		time.Sleep(10 * time.Millisecond)
	}
}

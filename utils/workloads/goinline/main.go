// Command goinline is a test workload whose hot loop in main.top calls
// main.leaf, small enough that the compiler inlines it: samples in the
// loop show main.leaf as an inlined frame above main.top.
// Prints "ready" once, then runs for SECONDS.
// Usage: goinline SECONDS
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

var sink uint64

func leaf(i uint64) uint64 {
	return ((i*0x9e3779b97f4a7c15^i>>7)*(i|1)^(i*i)>>29)*0xbf58476d1ce4e5b9 ^ (i*i*i)>>17 // mark:leaf
}

//go:noinline
func top(n uint64) {
	for i := uint64(0); i < n; i++ {
		sink += leaf(i) // mark:call
	}
}

func main() {
	seconds := 5.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	fmt.Println("ready")
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		top(1_000_000)
	}
}

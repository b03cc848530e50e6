// Command gochain is a test workload whose hot path is main.main ->
// main.goTop -> main.goMid -> main.goLeaf. Usage: gochain SECONDS
package main

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

//go:noinline
func goLeaf() {
	for i := uint64(0); i < 2_000_000; i++ {
		sink += i * i
	}
}

//go:noinline
func goMid() { goLeaf(); sink++ }

//go:noinline
func goTop() { goMid(); sink++ }

func main() {
	seconds := 5.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		goTop()
	}
}

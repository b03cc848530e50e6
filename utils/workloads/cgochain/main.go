// Command cgochain is a cgo test workload whose hot path crosses into C:
// main.main -> main.goTop -> C.c_leaf (through the cgo call machinery).
// Usage: cgochain SECONDS
package main

/*
static volatile unsigned long sink;

__attribute__((noinline)) void c_leaf(void)
{
  for (unsigned long i = 0; i < 2000000; i++)
    sink += i * i;
}
*/
import "C"

import (
	"os"
	"strconv"
	"time"
)

//go:noinline
func goTop() { C.c_leaf() }

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

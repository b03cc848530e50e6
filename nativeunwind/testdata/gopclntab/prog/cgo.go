//go:build cgo

package main

// static int twice(int x) { return 2 * x; }
import "C"

// cgoWork calls C, which runs on the system stack (runtime.asmcgocall).
//
//go:noinline
func cgoWork() int { return int(C.twice(21)) }

//go:build !cgo

package main

func cgoWork() int { return 0 }

// Package testpkg is built with `go test -c` by nativeunwind's tests.
package testpkg

// Sum adds up xs.
func Sum(xs ...int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

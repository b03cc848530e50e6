package testpkg

import "testing"

func TestSum(t *testing.T) {
	if Sum(1, 2, 3) != 6 {
		t.Fatal("Sum(1, 2, 3) != 6")
	}
}

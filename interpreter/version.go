package interpreter

import "fmt"

// Version is a runtime's release as its binary states it: 5.36.0 is
// {5, 36, 0}. A runtime whose binaries state no patch level where it is
// read (it is kept apart, or not known) leaves Patch 0 and names the
// version with MajorMinor.
type Version struct{ Major, Minor, Patch int }

// String is "Major.Minor.Patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// MajorMinor is "Major.Minor", the release series.
func (v Version) MajorMinor() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

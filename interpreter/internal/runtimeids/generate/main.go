// Command generate writes runtimeids.File in the package go generate runs
// it for: given a runtime's name, the runtime's ID; given none, package
// interpreter's bounds of runtime ids.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/runtimeids"
	"github.com/hostprof/ebpf-profiler/support"
)

func main() {
	if err := run(os.Getenv("GOPACKAGE"), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "runtimeids:", err)
		os.Exit(1)
	}
}

func run(pkg string, args []string) error {
	if pkg == "" {
		return errors.New("GOPACKAGE is not set: run it with go generate")
	}
	shared, err := support.LoadShared()
	if err != nil {
		return err
	}
	var src []byte
	switch {
	case len(args) == 0 && pkg == "interpreter":
		src, err = runtimeids.RangeSource(shared)
	case len(args) == 1:
		src, err = runtimeids.RuntimeSource(pkg, args[0], shared)
	default:
		return errors.New("usage: generate [runtime name]; without a name only in package interpreter")
	}
	if err != nil {
		return err
	}
	return os.WriteFile(runtimeids.File, src, 0o644)
}

// Package llvmsym runs LLVM's symbolizer, the oracle the native line
// tests compare the daemon's debug-information readers with.
// .ci/install-test-deps.sh installs it with clang.
package llvmsym

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Command is the symbolizer of the pinned LLVM.
const Command = "llvm-symbolizer-16"

// Frame is one frame of the symbolizer's answer: Function as the debug
// information (or the symbol table, for the function holding the
// address) spells it, mangled; File and Line as the line table gives
// them. Unknown parts are empty or zero.
type Frame struct {
	Function, File string
	Line           int
}

// Symbolize returns the frames at each of addrs in bin, innermost first.
func Symbolize(bin string, addrs []uint64) ([][]Frame, error) {
	var in strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&in, "%#x\n", a)
	}
	cmd := exec.Command(Command, "--obj="+bin, "--inlining", "--no-demangle", "--functions=linkage")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Command, err)
	}
	// Each address's answer is a block of (function, file:line:column)
	// line pairs; a blank line ends it.
	blocks := strings.Split(strings.TrimSpace(string(out)), "\n\n")
	if len(blocks) != len(addrs) {
		return nil, fmt.Errorf("%s answered %d of %d addresses", Command, len(blocks), len(addrs))
	}
	res := make([][]Frame, len(addrs))
	for i, b := range blocks {
		lines := strings.Split(b, "\n")
		for j := 0; j+1 < len(lines); j += 2 {
			f := Frame{Function: lines[j]}
			if f.Function == "??" {
				f.Function = ""
			}
			if loc := strings.Split(lines[j+1], ":"); len(loc) >= 2 && loc[0] != "??" {
				f.File = loc[0]
				f.Line, _ = strconv.Atoi(loc[1])
			}
			res[i] = append(res[i], f)
		}
	}
	return res, nil
}

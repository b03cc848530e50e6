// Package gofetch finds the Go toolchains the goroutine label tests build
// their workload with: the machine's own (1.26, /usr/local/go) and
// Debian's 1.19, 1.21-1.25 and 1.27, which fetch-go.sh unpacks (make
// test-deps). The workload is built here for the target architecture
// (cross-compiled for the kernel matrix's arm64 VMs), so no toolchain runs
// in a VM.
package gofetch

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions lists every tested Go release, oldest first.
var Versions = []string{"1.19", "1.21", "1.22", "1.23", "1.24", "1.25", "1.26", "1.27"}

// System is the release of the machine's own Go, which builds the
// project.
const System = "1.26"

// Command returns the go command of a tested release and the environment
// it needs (its GOROOT, and no switch to another toolchain), or an error
// that says how to install it.
func Command(version string) (string, []string, error) {
	if version == System {
		return "go", []string{"GOTOOLCHAIN=local"}, nil
	}
	root := filepath.Join(fetchcache.Dir("go-"+version), "usr", "lib", "go-"+version)
	if _, err := os.Stat(filepath.Join(fetchcache.Dir("go-"+version), ".complete")); err != nil {
		return "", nil, fmt.Errorf("no Go %s (%w): make test-deps installs it (utils/gofetch/fetch-go.sh %s)",
			version, err, version)
	}
	return filepath.Join(root, "bin", "go"), []string{"GOTOOLCHAIN=local", "GOROOT=" + root}, nil
}

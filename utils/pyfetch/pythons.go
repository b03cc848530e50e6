// Package pyfetch names the CPython releases newer than pyenv has that
// fetch-python.sh unpacks from Debian unstable (make test-deps): the
// Python tests run them, and utils/pyoffsets compiles the offset table
// from their headers.
package pyfetch

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Fetched lists the fetched releases, oldest first. .ci/install-test-deps.sh
// fetches the same list for amd64 and arm64.
var Fetched = []string{"3.14", "3.15"}

// Dir is the cache directory fetch-python.sh unpacks version for the
// Debian architecture arch (amd64, arm64: named as GOARCH) into.
func Dir(version, arch string) string {
	return fetchcache.Dir("python-" + version + "-" + arch)
}

// Python returns the wrapper that runs a fetched version here (its own
// loader and libraries, Debian's python executable), or an error that says
// how to install it.
func Python(version string) (string, error) {
	d := Dir(version, runtime.GOARCH)
	for _, p := range []string{filepath.Join(d, ".complete"), filepath.Join(d, "bin", "python3")} {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("no CPython %s (%w): make test-deps installs it (utils/pyfetch/fetch-python.sh %s)",
				version, err, version)
		}
	}
	return filepath.Join(d, "bin", "python3"), nil
}

// DebugPython returns the wrapper that runs a fetched version's debug build
// (Py_DEBUG) here, or an error that says how to install it.
func DebugPython(version string) (string, error) {
	p := filepath.Join(Dir(version, runtime.GOARCH), "bin", "python3d")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no CPython %s debug build (%w): make test-deps installs it (utils/pyfetch/fetch-python.sh %s)",
			version, err, version)
	}
	return p, nil
}

// TailCalled lists the releases build-python-tailcall.sh builds with the
// tail-calling interpreter (amd64 only).
var TailCalled = []string{"3.14"}

// TailCallPython returns a tail-calling build of version (amd64), or an
// error that says how to build it.
func TailCallPython(version string) (string, error) {
	d := fetchcache.Dir("python-" + version + "-tailcall-amd64")
	p := filepath.Join(d, "root", "bin", "python"+version)
	for _, f := range []string{filepath.Join(d, ".complete"), p} {
		if _, err := os.Stat(f); err != nil {
			return "", fmt.Errorf("no tail-calling CPython %s (%w): make test-deps builds it (utils/pyfetch/build-python-tailcall.sh %s)",
				version, err, version)
		}
	}
	return p, nil
}

// Package jdkfetch finds the JDKs the HotSpot tests run: Debian 12's own
// OpenJDK 17 and the builds fetch-jdk.sh unpacks (make test-deps), and all
// of them built for arm64, which the kernel matrix's arm64 VMs run.
package jdkfetch

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// SystemJava is the JDK Debian 12 ships, installed on every test machine.
const SystemJava = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"

// system is the version Debian 12 installs; on another architecture it is
// fetched as the others.
const system = "17"

func isSystem(v, arch string) bool { return v == system && arch == "amd64" }

// tested are the versions the tests run, oldest first.
var tested = []string{"8", "11", "17", "21", "25", "26"}

// Fetched lists the versions fetch-jdk.sh fetches for arch.
func Fetched(arch string) []string {
	return slices.DeleteFunc(slices.Clone(tested), func(v string) bool { return isSystem(v, arch) })
}

// Java returns the java executable of a tested JDK version ("11", "17",
// …) for this machine, or an error that says how to install it.
func Java(version string) (string, error) { return For(version, runtime.GOARCH) }

// For returns the java executable of a tested version for arch (GOARCH):
// the system's for 17 on amd64, fetch-jdk.sh's cache otherwise.
func For(v, arch string) (string, error) {
	if !slices.Contains(tested, v) {
		return "", fmt.Errorf("JDK %s is not one of the tested versions %v", v, tested)
	}
	if isSystem(v, arch) {
		if _, err := os.Stat(SystemJava); err != nil {
			return "", fmt.Errorf("no JDK %s (%w): make test-deps installs it", v, err)
		}
		return SystemJava, nil
	}
	java := filepath.Join(Dir(v, arch), "root", "usr", "lib", "jvm", "java-"+v+"-openjdk-"+arch, "bin", "java")
	for _, p := range []string{java, filepath.Join(Dir(v, arch), ".complete")} {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("no JDK %s for %s (%w): make test-deps installs it (utils/jdkfetch/fetch-jdk.sh %s %s)",
				v, arch, err, v, arch)
		}
	}
	return java, nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version: its unpacked root.
func Tree(v, arch string) ([]string, error) {
	if isSystem(v, arch) {
		return nil, fmt.Errorf("JDK %s is the system's on %s", v, arch)
	}
	if _, err := For(v, arch); err != nil {
		return nil, err
	}
	d := Dir(v, arch)
	return []string{filepath.Join(d, "root"), filepath.Join(d, ".complete")}, nil
}

// Dir is the cache directory fetch-jdk.sh unpacks a version for arch into.
func Dir(v, arch string) string {
	return fetchcache.Dir("jdk-" + v + "-" + arch)
}

// Versions lists every tested version, oldest first.
func Versions() []string { return slices.Clone(tested) }

// Package jdkfetch finds the JDKs the HotSpot tests run: Debian 12's own
// OpenJDK 17 and the builds fetch-jdk.sh unpacks (make test-deps).
package jdkfetch

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// SystemJava is the JDK Debian 12 ships, installed on every test machine.
const SystemJava = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java"

// Fetched lists the versions fetch-jdk.sh fetches.
var Fetched = []string{"11", "21", "25"}

// Java returns the java executable of a tested JDK version ("11", "17",
// …), or an error that says how to install it.
func Java(version string) (string, error) {
	java := SystemJava
	if version != "17" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		java = filepath.Join(cache, "ebpf-profiler", "jdk-"+version+"-amd64", "root", "usr", "lib", "jvm",
			"java-"+version+"-openjdk-amd64", "bin", "java")
	}
	if _, err := os.Stat(java); err != nil {
		return "", fmt.Errorf("no JDK %s (%w): make test-deps installs it (utils/jdkfetch/fetch-jdk.sh %s)", version, err, version)
	}
	return java, nil
}

// Versions lists every tested version, oldest first.
func Versions() []string {
	vs := append([]string{"17"}, Fetched...)
	sort.Slice(vs, func(i, j int) bool {
		a, _ := strconv.Atoi(vs[i])
		b, _ := strconv.Atoi(vs[j])
		return a < b
	})
	return vs
}

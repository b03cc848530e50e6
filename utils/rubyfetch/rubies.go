// Package rubyfetch finds the CRuby builds the Ruby tests run, which
// fetch-ruby.sh unpacks (make test-deps).
package rubyfetch

import (
	"fmt"
	"os"
	"path/filepath"
)

// Versions lists every tested version, oldest first.
var Versions = []string{"3.1", "3.3", "3.4"}

// dir is the cache directory fetch-ruby.sh unpacks version into.
func dir(version string) string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "ebpf-profiler", "ruby-"+version+"-amd64")
}

// Ruby returns the wrapper that runs a tested version ("3.1", …), or an
// error that says how to install it.
func Ruby(version string) (string, error) {
	ruby := filepath.Join(dir(version), "bin", "ruby")
	if _, err := os.Stat(filepath.Join(dir(version), ".complete")); err != nil {
		return "", fmt.Errorf("no Ruby %s (%w): make test-deps installs it (utils/rubyfetch/fetch-ruby.sh %s)", version, err, version)
	}
	return ruby, nil
}

// Libruby returns the path of a tested version's libruby.
func Libruby(version string) (string, error) {
	if _, err := Ruby(version); err != nil {
		return "", err
	}
	libs, _ := filepath.Glob(filepath.Join(dir(version), "root", "usr", "lib", "x86_64-linux-gnu", "libruby-"+version+".so."+version+".*"))
	if len(libs) != 1 {
		return "", fmt.Errorf("Ruby %s: %d libruby files unpacked, want 1", version, len(libs))
	}
	return libs[0], nil
}

// Package rubyfetch finds the CRuby builds the Ruby tests run, which
// fetch-ruby.sh unpacks and build-ruby-yjit.sh builds (make test-deps).
package rubyfetch

import (
	"errors"
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

// ErrNoYJIT is YJIT's error for a version that no tested build runs with
// YJIT: Debian builds 3.3 and 3.4 with --disable-yjit, and
// build-ruby-yjit.sh builds those two from source.
var ErrNoYJIT = errors.New("no CRuby build with YJIT")

// yjitRoot is the prefix build-ruby-yjit.sh installs version's YJIT build
// into.
func yjitRoot(version string) string {
	return filepath.Join(dir(version+"-yjit"), "root")
}

// YJIT returns the ruby that runs version with YJIT available (--yjit):
// Debian's build for 3.1, the source builds for 3.3 and 3.4. It returns an error
// that says how to build it if it is missing, and one wrapping ErrNoYJIT
// for versions without any YJIT build.
func YJIT(version string) (string, error) {
	switch version {
	case "3.1":
		return Ruby(version)
	case "3.3", "3.4":
		if _, err := os.Stat(filepath.Join(dir(version+"-yjit"), ".complete")); err != nil {
			return "", fmt.Errorf("no Ruby %s with YJIT (%w): make test-deps builds it (utils/rubyfetch/build-ruby-yjit.sh %s)", version, err, version)
		}
		return filepath.Join(yjitRoot(version), "bin", "ruby"), nil
	}
	return "", fmt.Errorf("Ruby %s: %w", version, ErrNoYJIT)
}

// LibrubyYJIT returns the path of the libruby the ruby of YJIT(version)
// maps.
func LibrubyYJIT(version string) (string, error) {
	if _, err := YJIT(version); err != nil {
		return "", err
	}
	if version == "3.1" {
		return Libruby(version)
	}
	libs, _ := filepath.Glob(filepath.Join(yjitRoot(version), "lib", "libruby-"+version+".so."+version+".*"))
	if len(libs) != 1 {
		return "", fmt.Errorf("Ruby %s with YJIT: %d libruby files installed, want 1", version, len(libs))
	}
	return libs[0], nil
}

// Static returns the ruby executable with version's interpreter linked in
// (no libruby), as ruby-build builds it by default: build-ruby-yjit.sh
// builds 3.4 so.
func Static(version string) (string, error) {
	d := dir(version + "-static")
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", fmt.Errorf("no static Ruby %s (%w): make test-deps builds it (utils/rubyfetch/build-ruby-yjit.sh %s static)", version, err, version)
	}
	return filepath.Join(d, "root", "bin", "ruby"), nil
}

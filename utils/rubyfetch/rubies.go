// Package rubyfetch finds the CRuby builds the Ruby tests run, which
// fetch-ruby.sh unpacks and build-ruby-yjit.sh builds (make test-deps).
package rubyfetch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions lists every tested version, oldest first.
var Versions = []string{"3.1", "3.3", "3.4"}

// dir is the cache directory fetch-ruby.sh unpacks version into for this
// machine.
func dir(version string) string { return dirFor(version, runtime.GOARCH) }

// dirFor is dir of the build for arch (GOARCH).
func dirFor(version, arch string) string {
	return fetchcache.Dir("ruby-" + version + "-" + arch)
}

// triplets are the multiarch directories, by GOARCH.
var triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Ruby returns the wrapper that runs a tested version ("3.1", …), or an
// error that says how to install it.
func Ruby(version string) (string, error) {
	ruby := filepath.Join(dir(version), "bin", "ruby")
	if _, err := os.Stat(filepath.Join(dir(version), ".complete")); err != nil {
		return "", fmt.Errorf("no Ruby %s (%w): make test-deps installs it (utils/rubyfetch/fetch-ruby.sh %s)", version, err, version)
	}
	return ruby, nil
}

// Command returns a command that runs a tested version here with args:
// its ruby executable with RUBYLIB naming its unpacked standard library
// (what the wrapper Ruby returns does, without a shell).
func Command(version string, args ...string) (*exec.Cmd, error) {
	d := dir(version)
	lib, err := os.ReadFile(filepath.Join(d, "rubylib"))
	if err != nil {
		return nil, fmt.Errorf("no Ruby %s (%w): make test-deps installs it (utils/rubyfetch/fetch-ruby.sh %s %s)",
			version, err, version, runtime.GOARCH)
	}
	cmd := exec.Command(filepath.Join(d, "root", "usr", "bin", "ruby"+version), args...)
	cmd.Env = append(os.Environ(), "RUBYLIB="+strings.TrimSpace(string(lib)))
	return cmd, nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version (Command): the unpacked root and its library path.
func Tree(version, arch string) ([]string, error) {
	d := dirFor(version, arch)
	paths := []string{filepath.Join(d, "root"), filepath.Join(d, "rubylib"), filepath.Join(d, ".complete")}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("no Ruby %s for %s (%w): make test-deps installs it (utils/rubyfetch/fetch-ruby.sh %s %s)",
				version, arch, err, version, arch)
		}
	}
	return paths, nil
}

// Libruby returns the path of a tested version's libruby.
func Libruby(version string) (string, error) {
	if _, err := Ruby(version); err != nil {
		return "", err
	}
	return LibrubyFor(version, runtime.GOARCH)
}

// LibrubyFor returns the path of a tested version's libruby built for
// arch (fetch-ruby.sh VERSION ARCH).
func LibrubyFor(version, arch string) (string, error) {
	d := dirFor(version, arch)
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", fmt.Errorf("no Ruby %s for %s (%w): make test-deps installs it (utils/rubyfetch/fetch-ruby.sh %s %s)",
			version, arch, err, version, arch)
	}
	libs, _ := filepath.Glob(filepath.Join(d, "root", "usr", "lib", triplets[arch], "libruby-"+version+".so."+version+".*"))
	if len(libs) != 1 {
		return "", fmt.Errorf("Ruby %s for %s: %d libruby files unpacked, want 1", version, arch, len(libs))
	}
	return libs[0], nil
}

// DebianVersion returns the Debian version of a fetched build for arch
// (its libruby package's).
func DebianVersion(version, arch string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dirFor(version, arch), ".complete"))
	if err != nil {
		return "", fmt.Errorf("no Ruby %s for %s: %w", version, arch, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// ErrNoYJIT is YJIT's error for a version that no tested build runs with
// YJIT: Debian builds 3.3 and 3.4 with --disable-yjit, and
// build-ruby-yjit.sh builds those two from source.
var ErrNoYJIT = errors.New("no CRuby build with YJIT")

// sourceBuilds are the builds with YJIT that make test-deps makes from
// source (build-ruby-yjit.sh), by version: 3.3's with the interpreter
// linked into the ruby executable (static), as ruby-build builds it by
// default, 3.4's with a libruby, as Debian does.
var sourceBuilds = map[string]string{"3.3": "static", "3.4": "shared"}

// sourceBuild returns the install prefix of version's source build and
// its kind, or an error that says how to build it.
func sourceBuild(version string) (root, kind string, err error) {
	kind, ok := sourceBuilds[version]
	if !ok {
		return "", "", fmt.Errorf("Ruby %s: %w", version, ErrNoYJIT)
	}
	d := dir(version + "-yjit")
	if kind == "static" {
		d = dir(version + "-static")
	}
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", "", fmt.Errorf("no Ruby %s built from source (%w): make test-deps builds it (utils/rubyfetch/build-ruby-yjit.sh %s %s)",
			version, err, version, kind)
	}
	return filepath.Join(d, "root"), kind, nil
}

// YJIT returns the ruby that runs version with YJIT available (--yjit):
// Debian's build for 3.1, the source builds for 3.3 and 3.4. It returns an
// error that says how to build it if it is missing, and one wrapping
// ErrNoYJIT for versions without any YJIT build.
func YJIT(version string) (string, error) { return YJITFor(version, runtime.GOARCH) }

// YJITFor is YJIT for a build of arch: only x86_64 builds have YJIT
// (Debian's arm64 3.1 runs --yjit interpreted; internals.md §12.8).
func YJITFor(version, arch string) (string, error) {
	if arch != "amd64" {
		return "", fmt.Errorf("Ruby %s for %s: %w", version, arch, ErrNoYJIT)
	}
	if version == "3.1" {
		return Ruby(version)
	}
	root, _, err := sourceBuild(version)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "ruby"), nil
}

// LibrubyYJIT returns the file the interpreter of YJIT(version) is in:
// its libruby, or the ruby executable of a static build.
func LibrubyYJIT(version string) (string, error) {
	if version == "3.1" {
		return Libruby(version)
	}
	root, kind, err := sourceBuild(version)
	if err != nil {
		return "", err
	}
	if kind == "static" {
		return filepath.Join(root, "bin", "ruby"), nil
	}
	libs, _ := filepath.Glob(filepath.Join(root, "lib", "libruby-"+version+".so."+version+".*"))
	if len(libs) != 1 {
		return "", fmt.Errorf("Ruby %s built from source: %d libruby files installed, want 1", version, len(libs))
	}
	return libs[0], nil
}

// Static returns the version of the static source build (3.3) and its
// ruby executable.
func Static() (version, ruby string, err error) {
	for v, kind := range sourceBuilds {
		if kind == "static" {
			ruby, err := YJIT(v)
			return v, ruby, err
		}
	}
	return "", "", errors.New("no static Ruby build")
}

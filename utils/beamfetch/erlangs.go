// Package beamfetch finds the Erlang/OTP builds the BEAM tests run: Debian
// trixie's OTP 27 and sid's OTP 29 (with sid's Elixir), which
// fetch-erlang.sh unpacks (make test-deps), for this machine and for arm64
// (unpacked only: the unit tests decode its beam.smp).
package beamfetch

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions lists every tested OTP release, oldest first.
var Versions = []string{"27", "29"}

// ElixirVersion is the OTP release fetch-erlang.sh also unpacks Debian's
// elixir for.
const ElixirVersion = "29"

// Arches lists the architectures (GOARCH names, which are Debian's here)
// fetch-erlang.sh unpacks.
var Arches = []string{"amd64", "arm64"}

// Dir is the cache directory fetch-erlang.sh unpacks a version for arch
// (GOARCH) into.
func Dir(version, arch string) string {
	return fetchcache.Dir("erlang-" + version + "-" + arch)
}

// fetched checks that fetch-erlang.sh finished a version for arch and
// returns the Debian package version it recorded.
func fetched(version, arch string) (string, error) {
	b, err := os.ReadFile(filepath.Join(Dir(version, arch), ".complete"))
	if err != nil {
		return "", fmt.Errorf("no Erlang/OTP %s for %s (%w): make test-deps installs it (utils/beamfetch/fetch-erlang.sh %s %s)",
			version, arch, err, version, arch)
	}
	return strings.TrimSpace(string(b)), nil
}

// DebianVersion returns the version of Debian's erlang-base package a
// fetched build came from ("1:27.3.4.1+dfsg-1+deb13u4").
func DebianVersion(version, arch string) (string, error) {
	return fetched(version, arch)
}

// tool returns one of fetch-erlang.sh's wrappers for this machine.
func tool(version, name string) (string, error) {
	if _, err := fetched(version, runtime.GOARCH); err != nil {
		return "", err
	}
	p := filepath.Join(Dir(version, runtime.GOARCH), "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("Erlang/OTP %s: %w: fetch it again (utils/beamfetch/fetch-erlang.sh %s)", version, err, version)
	}
	return p, nil
}

// Erl returns the wrapper that runs a tested version's erl here (it execs
// Debian's erl script, erlexec, then the stripped beam.smp).
func Erl(version string) (string, error) { return tool(version, "erl") }

// Erlc returns the wrapper that runs a tested version's compiler here.
func Erlc(version string) (string, error) { return tool(version, "erlc") }

// Escript returns the wrapper that runs a tested version's escript here.
func Escript(version string) (string, error) { return tool(version, "escript") }

// Elixir returns the wrapper that runs Debian's elixir on ElixirVersion here.
func Elixir() (string, error) { return tool(ElixirVersion, "elixir") }

// BeamSMP returns the emulator a fetched version for arch runs: Debian's
// stripped erts-*/bin/beam.smp (the JIT flavour, the only one Debian
// ships), pointed at the unpacked libc.
func BeamSMP(version, arch string) (string, error) {
	if _, err := fetched(version, arch); err != nil {
		return "", err
	}
	m, _ := filepath.Glob(filepath.Join(Dir(version, arch), "root", "usr", "lib", "erlang", "erts-*", "bin", "beam.smp"))
	if len(m) != 1 {
		return "", fmt.Errorf("Erlang/OTP %s for %s: %d beam.smp files, want 1: fetch it again (utils/beamfetch/fetch-erlang.sh %s %s)",
			version, arch, len(m), version, arch)
	}
	return m[0], nil
}

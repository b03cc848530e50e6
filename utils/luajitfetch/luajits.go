// Package luajitfetch finds the LuaJIT builds the LuaJIT tests run: Debian
// trixie's and sid's builds of OpenResty's LuaJIT 2.1, which fetch-luajit.sh
// unpacks for amd64 and arm64 (make test-deps), as the luajit command and as
// libluajit-5.1.so.2 embedded in a small C host (host/embed.c).
package luajitfetch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions lists every tested version, oldest first: "2.1-" and the date
// of OpenResty's snapshot Debian packages (2.1.0+openresty20250117 is
// trixie's, 2.1.0+openresty20251030 sid's).
var Versions = []string{"2.1-20250117", "2.1-20251030"}

// Arches lists the architectures (GOARCH) each version is fetched for.
var Arches = []string{"amd64", "arm64"}

var triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Dir is the cache directory fetch-luajit.sh unpacks a version for arch
// (GOARCH) into.
func Dir(version, arch string) string {
	return fetchcache.Dir("luajit-" + version + "-" + arch)
}

// DebianVersion returns the Debian package version fetch-luajit.sh
// unpacked, e.g. "2.1.0+openresty20250117-2", or an error that says how
// to install it.
func DebianVersion(version, arch string) (string, error) {
	b, err := os.ReadFile(filepath.Join(Dir(version, arch), ".complete"))
	if err != nil {
		return "", fmt.Errorf("no LuaJIT %s for %s (%w): make test-deps installs it (utils/luajitfetch/fetch-luajit.sh %s %s)",
			version, arch, err, version, arch)
	}
	return strings.TrimSpace(string(b)), nil
}

// path returns a file of a fetched version for arch, checking that the
// fetch finished and the file is there.
func path(version, arch string, elems ...string) (string, error) {
	if _, err := DebianVersion(version, arch); err != nil {
		return "", err
	}
	p := filepath.Join(append([]string{Dir(version, arch)}, elems...)...)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("LuaJIT %s for %s: %w: fetch it again (utils/luajitfetch/fetch-luajit.sh %s %s)",
			version, arch, err, version, arch)
	}
	return p, nil
}

// LuaJIT returns the command that runs a tested version here: the
// wrapper that sets LUA_PATH to the fetched jit.* modules (-jdump, -jv)
// and execs Executable's file. Command runs it without a shell.
func LuaJIT(version string) (string, error) {
	return path(version, runtime.GOARCH, "bin", "luajit")
}

// Embed returns the C host (embed.c) linked against a tested version's
// libluajit-5.1.so.2 for this machine: `luajit-embed SCRIPT [ARG...]`.
func Embed(version string) (string, error) {
	return EmbedFor(version, runtime.GOARCH)
}

// EmbedFor is Embed of the build for arch.
func EmbedFor(version, arch string) (string, error) {
	return path(version, arch, "bin", "luajit-embed")
}

// Executable returns the luajit executable of a version for arch (GOARCH):
// the VM is linked into it, it does not load libluajit-5.1.so.2.
func Executable(version, arch string) (string, error) {
	p, err := path(version, arch, "root", "usr", "bin", "luajit")
	if err != nil {
		return "", err
	}
	// usr/bin/luajit is a link to the versioned file in some builds.
	return filepath.EvalSymlinks(p)
}

// Library returns libluajit-5.1.so.2 of a version for arch (the file the
// link names, as a process maps it).
func Library(version, arch string) (string, error) {
	t, ok := triplets[arch]
	if !ok {
		return "", fmt.Errorf("LuaJIT %s: no Debian build for %s", version, arch)
	}
	p, err := path(version, arch, "root", "usr", "lib", t, "libluajit-5.1.so.2")
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(p)
}

// Include returns the directory of a version's headers (lua.h, luajit.h)
// from libluajit-5.1-dev.
func Include(version, arch string) (string, error) {
	return path(version, arch, "root", "usr", "include", "luajit-2.1")
}

// Command returns a command that runs a tested version here with args,
// without a shell.
func Command(version string, args ...string) (*exec.Cmd, error) {
	exe, err := Executable(version, runtime.GOARCH)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "LUA_PATH="+filepath.Join(Dir(version, runtime.GOARCH), "root", "usr", "share", "luajit-2.1", "?.lua")+";;")
	return cmd, nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version: the unpacked root, the wrappers and the marker.
func Tree(version, arch string) ([]string, error) {
	if _, err := DebianVersion(version, arch); err != nil {
		return nil, err
	}
	d := Dir(version, arch)
	return []string{filepath.Join(d, "root"), filepath.Join(d, "bin"), filepath.Join(d, ".complete")}, nil
}

// Package phpfetch finds the PHP builds the PHP tests run: Debian 12's 8.2
// (packages install-test-deps.sh installs) and trixie's 8.4, which
// fetch-php.sh unpacks beside the system with its own libc; and both
// built for arm64, which the kernel matrix's arm64 VMs run.
package phpfetch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions are the PHP releases the tests run, oldest first.
var Versions = []string{"8.2", "8.4"}

// system is the release Debian 12 installs; on another architecture it
// is fetched as the others.
const system = "8.2"

func isSystem(v, arch string) bool { return v == system && arch == "amd64" }

// Build is one PHP release's programs.
type Build struct {
	Version string
	// CLI and FPM are the php and php-fpm executables; Args go before a
	// script's on their command lines (no php.ini: the tests set what they
	// use).
	CLI, FPM string
	Args     []string
	// OPcache is the opcache.so zend_extension.
	OPcache string
	// Headers is the directory of its headers (php-config --include-dir).
	Headers string
	// Apache is the Apache module (libphp), unpacked for the releases
	// fetch-php.sh fetches (detection is tested on it; it is not run).
	Apache string
}

// Command is the CLI running args after the build's own.
func (b *Build) Command(args ...string) *exec.Cmd {
	return exec.Command(b.CLI, append(append([]string{}, b.Args...), args...)...)
}

// api is each release's module API number, the name of its extension
// directory.
var api = map[string]string{"8.2": "20220829", "8.4": "20240924"}

// PHP returns the build of version v for this machine.
func PHP(v string) (*Build, error) { return For(v, runtime.GOARCH) }

// For returns the build of version v for arch (GOARCH): the system's for
// 8.2 on amd64, fetch-php.sh's cache otherwise (run it first:
// install-test-deps.sh does).
func For(v, arch string) (*Build, error) {
	if api[v] == "" {
		return nil, fmt.Errorf("PHP %s is not one of the tested releases %v", v, Versions)
	}
	root := "/"
	if !isSystem(v, arch) {
		root = filepath.Join(Dir(v, arch), "root")
	}
	b := &Build{Version: v, CLI: filepath.Join(root, "usr/bin/php"+v), FPM: filepath.Join(root, "usr/sbin/php-fpm"+v),
		OPcache: filepath.Join(root, "usr/lib/php", api[v], "opcache.so"), Args: []string{"-n"},
		Headers: filepath.Join(root, "usr/include/php", api[v])}
	files := []string{b.CLI, b.FPM, b.OPcache, b.Headers}
	if !isSystem(v, arch) {
		b.Apache = filepath.Join(root, "usr/lib/apache2/modules/libphp"+v+".so")
		files = append(files, b.Apache, filepath.Join(Dir(v, arch), ".complete"))
	}
	for _, p := range files {
		if _, err := os.Stat(p); err != nil {
			fetch := ""
			if !isSystem(v, arch) {
				fetch = fmt.Sprintf(": utils/phpfetch/fetch-php.sh %s %s", v, arch)
			}
			return nil, fmt.Errorf("PHP %s for %s: %w (make test-deps installs it%s)", v, arch, err, fetch)
		}
	}
	return b, nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version: its unpacked root.
func Tree(v, arch string) ([]string, error) {
	if isSystem(v, arch) {
		return nil, fmt.Errorf("PHP %s is the system's on %s", v, arch)
	}
	if _, err := For(v, arch); err != nil {
		return nil, err
	}
	d := Dir(v, arch)
	return []string{filepath.Join(d, "root"), filepath.Join(d, ".complete")}, nil
}

// Dir is the cache directory fetch-php.sh unpacks a version for arch
// into.
func Dir(v, arch string) string {
	return fetchcache.Dir("php-" + v + "-" + arch)
}

// Package perlfetch finds the perl builds the Perl tests run: Debian 12's
// own 5.36, and bullseye's 5.32 and trixie's 5.40, which fetch-perl.sh
// unpacks (make test-deps).
package perlfetch

import (
	"fmt"
	"os"
	"path/filepath"
)

// Versions lists every tested version, oldest first.
var Versions = []string{"5.32", "5.36", "5.40"}

// system is the version Debian 12 installs as /usr/bin/perl.
const system = "5.36"

// dir is the cache directory fetch-perl.sh unpacks version into.
func dir(version string) string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "ebpf-profiler", "perl-"+version+"-amd64")
}

// Perl returns the command that runs a tested version ("5.32", …): the
// system's /usr/bin/perl, or fetch-perl.sh's wrapper; or an error that
// says how to install it.
func Perl(version string) (string, error) {
	if version == system {
		if _, err := os.Stat("/usr/bin/perl"); err != nil {
			return "", fmt.Errorf("no perl %s: %w (Debian 12's perl package)", version, err)
		}
		return "/usr/bin/perl", nil
	}
	if _, err := os.Stat(filepath.Join(dir(version), ".complete")); err != nil {
		return "", fmt.Errorf("no perl %s (%w): make test-deps installs it (utils/perlfetch/fetch-perl.sh %s)", version, err, version)
	}
	return filepath.Join(dir(version), "bin", "perl"), nil
}

// Executable returns the perl executable a tested version runs, with the
// interpreter linked in (what the wrapper Perl returns execs).
func Executable(version string) (string, error) {
	if _, err := Perl(version); err != nil {
		return "", err
	}
	if version == system {
		return "/usr/bin/perl", nil
	}
	return filepath.Join(dir(version), "root", "usr", "bin", "perl"), nil
}

// Libperl returns a tested version's libperl.so and the launcher that
// runs perl through it (Debian's perl5.XX-x86_64-linux-gnu), the system's
// version only.
func Libperl(version string) (lib, launcher string, err error) {
	if version != system {
		return "", "", fmt.Errorf("perl %s: only the system's %s is run through its libperl", version, system)
	}
	libs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libperl.so." + version + ".*")
	launcher = "/usr/bin/perl" + version + "-x86_64-linux-gnu"
	if len(libs) != 1 {
		return "", "", fmt.Errorf("perl %s: %d libperl files, want 1 (Debian 12's libperl%s package)", version, len(libs), version)
	}
	if _, err := os.Stat(launcher); err != nil {
		return "", "", fmt.Errorf("perl %s: %w (Debian 12's perl package)", version, err)
	}
	return libs[0], launcher, nil
}

// DebugInfo returns the dwz file of a tested version's libperl from
// Debian's perl-debug (its struct types), which fetch-perl-debug.sh
// unpacks, or an error that says how to fetch it.
func DebugInfo(version string) (string, error) {
	d := dir("debug-" + version)
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", fmt.Errorf("no perl-debug %s (%w): make test-deps fetches it (utils/perlfetch/fetch-perl-debug.sh %s)", version, err, version)
	}
	return filepath.Join(d, "libperl"+version+".debug"), nil
}

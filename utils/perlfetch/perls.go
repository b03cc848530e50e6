// Package perlfetch finds the perl builds the Perl tests run: Debian 12's
// own 5.36, and bullseye's 5.32, trixie's 5.40 and sid's 5.42, which
// fetch-perl.sh unpacks (make test-deps); and all four built for arm64,
// which the kernel matrix's arm64 VMs run.
package perlfetch

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// Versions lists every tested version, oldest first.
var Versions = []string{"5.32", "5.36", "5.40", "5.42"}

// system is the version Debian 12 installs as /usr/bin/perl; on another
// architecture (the kernel matrix's arm64 VMs) it is fetched as the others.
const system = "5.36"

func isSystem(version, arch string) bool { return version == system && arch == "amd64" }

// Dir is the cache directory fetch-perl.sh unpacks a version for arch
// (GOARCH) into.
func Dir(version, arch string) string {
	return fetchcache.Dir("perl-" + version + "-" + arch)
}

// fetched checks that fetch-perl.sh finished a version for arch.
func fetched(version, arch string) error {
	if _, err := os.Stat(filepath.Join(Dir(version, arch), ".complete")); err != nil {
		return fmt.Errorf("no perl %s for %s (%w): make test-deps installs it (utils/perlfetch/fetch-perl.sh %s %s)",
			version, arch, err, version, arch)
	}
	return nil
}

// Perl returns the command that runs a tested version here ("5.32", …):
// the system's /usr/bin/perl, or fetch-perl.sh's shell wrapper; or an
// error that says how to install it. Command runs it without a shell.
func Perl(version string) (string, error) {
	if isSystem(version, runtime.GOARCH) {
		if _, err := os.Stat("/usr/bin/perl"); err != nil {
			return "", fmt.Errorf("no perl %s: %w (Debian 12's perl package)", version, err)
		}
		return "/usr/bin/perl", nil
	}
	if err := fetched(version, runtime.GOARCH); err != nil {
		return "", err
	}
	return filepath.Join(Dir(version, runtime.GOARCH), "bin", "perl"), nil
}

// Command returns a command that runs a tested version here with args:
// its perl executable, with PERL5LIB naming a fetched build's own
// modules first (what fetch-perl.sh's wrapper does, without a shell).
func Command(version string, args ...string) (*exec.Cmd, error) {
	exe, err := Executable(version)
	if err != nil {
		return nil, err
	}
	return withModules(exec.Command(exe, args...), version)
}

// withModules sets PERL5LIB in cmd's environment to a fetched version's
// module directories (the system's perl needs none).
func withModules(cmd *exec.Cmd, version string) (*exec.Cmd, error) {
	if isSystem(version, runtime.GOARCH) {
		return cmd, nil
	}
	inc, err := os.ReadFile(filepath.Join(Dir(version, runtime.GOARCH), "perl5lib"))
	if err != nil {
		return nil, fmt.Errorf("perl %s: %w: fetch it again (utils/perlfetch/fetch-perl.sh %s)", version, err, version)
	}
	cmd.Env = append(os.Environ(), "PERL5LIB="+strings.TrimSpace(string(inc)))
	return cmd, nil
}

// Executable returns the perl executable a tested version runs here, with
// the interpreter linked in (what the wrapper Perl returns execs).
func Executable(version string) (string, error) {
	return ExecutableFor(version, runtime.GOARCH)
}

// ExecutableFor is Executable of the build for arch.
func ExecutableFor(version, arch string) (string, error) {
	if isSystem(version, arch) {
		return Perl(version)
	}
	if err := fetched(version, arch); err != nil {
		return "", err
	}
	return filepath.Join(Dir(version, arch), "root", "usr", "bin", "perl"), nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version: the unpacked root and the module path.
func Tree(version, arch string) ([]string, error) {
	if isSystem(version, arch) {
		return nil, fmt.Errorf("perl %s is the system's on %s", version, arch)
	}
	if err := fetched(version, arch); err != nil {
		return nil, err
	}
	d := Dir(version, arch)
	return []string{filepath.Join(d, "root"), filepath.Join(d, "perl5lib"), filepath.Join(d, ".complete")}, nil
}

// Libperl returns a tested version's libperl.so and the launcher that
// runs perl through it (Debian's perl5.XX-TRIPLET), both for this machine:
// the system's, or those fetch-perl.sh unpacked and pointed at their root.
func Libperl(version string) (lib, launcher string, err error) {
	return LibperlFor(version, runtime.GOARCH)
}

// LibperlFor is Libperl of the build for arch.
func LibperlFor(version, arch string) (lib, launcher string, err error) {
	triplet, ok := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]
	if !ok {
		return "", "", fmt.Errorf("perl %s: no Debian build for %s", version, arch)
	}
	root := "/"
	if !isSystem(version, arch) {
		if err := fetched(version, arch); err != nil {
			return "", "", err
		}
		root = filepath.Join(Dir(version, arch), "root")
	}
	libDir := filepath.Join(root, "usr", "lib", triplet)
	libs, _ := filepath.Glob(filepath.Join(libDir, "libperl.so."+version+".*"))
	launcher = filepath.Join(root, "usr", "bin", "perl"+version+"-"+triplet)
	if len(libs) != 1 {
		return "", "", fmt.Errorf("perl %s: %d libperl files in %s, want 1 (Debian's libperl%s package)", version, len(libs), root, version)
	}
	f, err := elf.Open(launcher)
	if err != nil {
		return "", "", fmt.Errorf("perl %s: %w (Debian's libperl%s package)", version, err, version)
	}
	defer f.Close()
	if root != "/" {
		// fetch-perl.sh points the launcher at the unpacked libraries.
		rpath, _ := f.DynString(elf.DT_RPATH)
		if !slices.Contains(strings.Split(strings.Join(rpath, ":"), ":"), libDir) {
			return "", "", fmt.Errorf("perl %s: %s does not load its libperl from %s: fetch it again (utils/perlfetch/fetch-perl.sh %s)",
				version, launcher, libDir, version)
		}
	}
	return libs[0], launcher, nil
}

// LibperlPerl returns the command that runs a tested version here through
// its libperl, without a shell: the system's launcher, or fetch-perl.sh's
// wrapper around a fetched one.
func LibperlPerl(version string) (string, error) {
	_, launcher, err := Libperl(version)
	if err != nil || isSystem(version, runtime.GOARCH) {
		return launcher, err
	}
	return filepath.Join(Dir(version, runtime.GOARCH), "bin", "perl-libperl"), nil
}

// LibperlCommand is Command for the launcher Libperl returns.
func LibperlCommand(version string, args ...string) (*exec.Cmd, error) {
	_, launcher, err := Libperl(version)
	if err != nil {
		return nil, err
	}
	return withModules(exec.Command(launcher, args...), version)
}

// DebugInfo returns the dwz file of a tested version's libperl for arch from
// Debian's perl-debug (its struct types), which fetch-perl-debug.sh
// unpacks, or an error that says how to fetch it.
func DebugInfo(version, arch string) (string, error) {
	d := Dir("debug-"+version, arch)
	if _, err := os.Stat(filepath.Join(d, ".complete")); err != nil {
		return "", fmt.Errorf("no perl-debug %s for %s (%w): make test-deps fetches it (utils/perlfetch/fetch-perl-debug.sh %s %s)",
			version, arch, err, version, arch)
	}
	return filepath.Join(d, "libperl"+version+".debug"), nil
}

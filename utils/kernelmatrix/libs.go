package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// target is what a VM architecture needs from this machine.
type target struct {
	goarch string
	// hostLibDir holds the architecture's shared libraries here (the
	// cross libc for a foreign one); guestLibDir is where they go in the
	// VM, on its loader's search path.
	hostLibDir, guestLibDir string
	qemu                    []string
	// cpus is the VM's vCPU count (qemu -smp), each a host thread.
	cpus    string
	console string
	// memory is the VM's (qemu -m): the initramfs, runtimes included,
	// is unpacked into it.
	memory string
}

var targets = map[string]target{
	"amd64": {
		goarch: "amd64", hostLibDir: "/lib/x86_64-linux-gnu", guestLibDir: "/lib/x86_64-linux-gnu",
		// TCG: KVM here is nested and cannot boot stock kernels. "max" has
		// every instruction set extension qemu emulates.
		qemu: []string{"qemu-system-x86_64", "-cpu", "max"},
		// One vCPU: with two, qemu 7.2 (multi-threaded TCG) lets one
		// vCPU run code the other has just patched back (the kernel's
		// static keys, flipped whenever a perf event or tracepoint is
		// opened or closed), and the kernel dies on a stale int3
		// ("Oops: int3" in __schedule). Opening and closing a
		// context-switch perf event in a loop panicked 6.12 and 7.2
		// within 12 s, with -cpu max or qemu64; CI met it at boot and
		// mid-test. Single-threaded TCG does not crash but stalls a vCPU
		// while the other runs: a sleeping thread's own clock then ran
		// 4-14% past the off-CPU time the kernel saw.
		cpus:    "1",
		console: "ttyS0",
		memory:  "1G",
	},
	"arm64": {
		goarch: "arm64", hostLibDir: "/usr/aarch64-linux-gnu/lib", guestLibDir: "/lib/aarch64-linux-gnu",
		// "max" includes pointer authentication (ARMv8.3), so signed
		// return addresses are real; qemu's own cipher for it ("impdef")
		// is much faster to emulate than the architected QARMA.
		qemu:    []string{"qemu-system-aarch64", "-M", "virt", "-cpu", "max,pauth-impdef=on"},
		cpus:    "2",
		console: "ttyAMA0",
		// The 6.12 VM's runtimes are 2.5 GB unpacked (six JDKs, six
		// Nodes, four perls, ...), into a tmpfs the kernel caps at half
		// the memory: at 5G the unpacking failed.
		memory: "8G",
	},
}

// copySharedLibraries copies into root the dynamic loader and the shared
// libraries the ELF files under dir need, from the target's library
// directory on this machine (libraries beside the file, found through
// $ORIGIN, are left alone).
func copySharedLibraries(tg target, root, dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		return err
	}
	return copyLibrariesOf(tg, root, files)
}

// copyLibrariesOf copies into root the dynamic loader and the shared
// libraries the ELF files need (files that are not ELF are left alone).
func copyLibrariesOf(tg target, root string, files []string) error {
	seen := map[string]bool{}
	var visit func(path string) error
	visit = func(path string) error {
		f, err := elf.Open(path)
		if err != nil {
			return nil // not ELF: a symbol list
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: reading PT_INTERP: %w", path, err)
			}
			interp := string(b[:len(b)-1]) // NUL-terminated
			if !seen[interp] {
				seen[interp] = true
				if err := copyFile(filepath.Join(tg.hostLibDir, filepath.Base(interp)), filepath.Join(root, interp)); err != nil {
					return err
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), lib)); err == nil {
				continue
			}
			dst := filepath.Join(root, tg.guestLibDir, lib)
			if err := copyFile(filepath.Join(tg.hostLibDir, lib), dst); err != nil {
				return err
			}
			if err := visit(dst); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range files {
		if err := visit(f); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src, following symbolic links, to dst, creating its
// directory.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	info, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, info.Mode().Perm())
}

// tree is a file or directory (absolute path) a test needs in the VM at
// the same path.
type tree struct{ test, path string }

// readTrees reads the tests' list of trees (vmTrees: a test's name and a
// path a line; a missing list is empty).
func readTrees(list string) ([]tree, error) {
	b, err := os.ReadFile(list)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []tree
	for _, line := range strings.Split(string(b), "\n") {
		if test, path, ok := strings.Cut(line, "\t"); ok {
			out = append(out, tree{test, path})
		}
	}
	return out, nil
}

// copyTrees copies into root, each at its own path, the files and
// directories. Symbolic links are kept as they are; documentation is left
// out. A file (an executable) gets the shared libraries it needs from the
// target's; a directory holds its own.
func copyTrees(tg target, root string, paths []string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	done := map[string]bool{}
	var files []string
	for _, top := range paths {
		if done[top] || !filepath.IsAbs(top) {
			continue
		}
		done[top] = true
		err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && undocumented(path) {
				return fs.SkipDir
			}
			dst := filepath.Join(root, path)
			switch {
			case d.IsDir():
				return os.MkdirAll(dst, 0o755)
			case d.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(path)
				if err != nil {
					return err
				}
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return err
				}
				return os.Symlink(target, dst)
			case d.Type().IsRegular():
				return copyFile(path, dst)
			}
			return nil // sockets, fifos: nothing a runtime needs
		})
		if err != nil {
			return fmt.Errorf("copying %s into the VM: %w", top, err)
		}
		if info, err := os.Stat(top); err == nil && info.Mode().IsRegular() {
			files = append(files, filepath.Join(root, top))
		}
	}
	return copyLibrariesOf(tg, root, files)
}

// undocumented: directories of documentation, manual pages and message
// catalogues, which no test reads.
func undocumented(path string) bool {
	for _, d := range []string{"/usr/share/doc", "/usr/share/man", "/usr/share/locale", "/usr/share/info", "/usr/share/lintian"} {
		if strings.HasSuffix(path, d) {
			return true
		}
	}
	return false
}

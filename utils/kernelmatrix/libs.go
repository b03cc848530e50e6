package main

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// target is what a VM architecture needs from this machine.
type target struct {
	goarch string
	// hostLibDir holds the architecture's shared libraries here (the
	// cross libc for a foreign one); guestLibDir is where they go in the
	// VM, on its loader's search path.
	hostLibDir, guestLibDir string
	qemu                    []string
	console                 string
}

var targets = map[string]target{
	"amd64": {
		goarch: "amd64", hostLibDir: "/lib/x86_64-linux-gnu", guestLibDir: "/lib/x86_64-linux-gnu",
		// TCG: KVM here is nested and cannot boot stock kernels. "max" has
		// every instruction set extension qemu emulates.
		qemu:    []string{"qemu-system-x86_64", "-cpu", "max"},
		console: "ttyS0",
	},
	"arm64": {
		goarch: "arm64", hostLibDir: "/usr/aarch64-linux-gnu/lib", guestLibDir: "/lib/aarch64-linux-gnu",
		// "max" includes pointer authentication (ARMv8.3), so signed
		// return addresses are real; qemu's own cipher for it ("impdef")
		// is much faster to emulate than the architected QARMA.
		qemu:    []string{"qemu-system-aarch64", "-M", "virt", "-cpu", "max,pauth-impdef=on"},
		console: "ttyAMA0",
	},
}

// copySharedLibraries copies into root the dynamic loader and the shared
// libraries the ELF files under dir need, from the target's library
// directory on this machine (libraries beside the file, found through
// $ORIGIN, are left alone).
func copySharedLibraries(tg target, root, dir string) error {
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
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return visit(path)
	})
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

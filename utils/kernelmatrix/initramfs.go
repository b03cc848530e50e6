package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// writeInitramfs writes root as a gzip-compressed cpio archive in the
// "newc" format the kernel unpacks into its root file system
// (Documentation/driver-api/early-userspace/buffer-format.rst), with
// /dev/console added: the kernel opens it for PID 1's standard streams
// before anything could mount devtmpfs. Owners are root and every time is
// archiveTime, so the same tree gives the same archive.
func writeInitramfs(root, out string) error { return writeArchive(root, out, true) }

// writeArchive writes root as writeInitramfs does, /dev/console only if
// console is set: an archive the kernel unpacks after another (archives
// concatenated in one initrd add to the same file system).
func writeArchive(root, out string, console bool) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		f.Close()
		return err
	}
	w := &cpioWriter{w: zw}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		name, _ := filepath.Rel(root, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return w.entry(name, unix.S_IFDIR|0o755, 0, nil)
		case info.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return w.entry(name, unix.S_IFREG|uint32(info.Mode().Perm()), 0, data)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return w.entry(name, unix.S_IFLNK|0o777, 0, []byte(target))
		}
		return fmt.Errorf("%s: not a file, directory or symbolic link", path)
	})
	if err == nil && console {
		err = w.entry("dev", unix.S_IFDIR|0o755, 0, nil)
	}
	if err == nil && console {
		err = w.entry("dev/console", unix.S_IFCHR|0o600, unix.Mkdev(5, 1), nil)
	}
	if err == nil {
		err = w.entry("TRAILER!!!", 0, 0, nil)
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// archiveTime is every entry's modification time (2000-01-01 UTC): fixed,
// and not zero, which PHP's OPcache takes for a failed stat (it then never
// caches, nor JIT-compiles, the file).
const archiveTime = 946684800

// cpioWriter writes "newc" entries; WalkDir's lexical order puts every
// directory before its contents, as unpacking needs.
type cpioWriter struct {
	w   io.Writer
	ino uint32
}

func (c *cpioWriter) entry(name string, mode uint32, rdev uint64, data []byte) error {
	c.ino++
	nlink := 1
	if mode&unix.S_IFMT == unix.S_IFDIR {
		nlink = 2
	}
	fields := []uint32{
		c.ino, mode, 0, 0, uint32(nlink), archiveTime, uint32(len(data)),
		0, 0, unix.Major(rdev), unix.Minor(rdev), uint32(len(name) + 1), 0,
	}
	var hdr strings.Builder
	hdr.WriteString("070701")
	for _, v := range fields {
		fmt.Fprintf(&hdr, "%08X", v)
	}
	hdr.WriteString(name)
	hdr.WriteByte(0)
	if _, err := io.WriteString(c.w, pad4(hdr.String())); err != nil {
		return err
	}
	_, err := io.WriteString(c.w, pad4(string(data)))
	return err
}

// pad4 pads s with NULs to a multiple of four bytes.
func pad4(s string) string {
	return s + strings.Repeat("\x00", (4-len(s)%4)%4)
}

// Package debuginfo finds and reads the debug information of native
// executables: the source file and line of a code address and the calls
// the compiler inlined there, from DWARF (in the file itself, in a
// separate debug file found by build id or .gnu_debuglink) or, for Go
// executables, from the pclntab. Everything is read on demand from
// memory-mapped files; a File holds its mappings until it is closed.
package debuginfo

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Frame is one source-level frame at an address.
type Frame struct {
	// Function is the function's linkage (mangled) name where the debug
	// information has one, else its name; empty when unknown.
	Function string
	File     string
	Line     uint32
	// Inlined says the compiler inlined Function into the next frame's.
	Inlined bool
}

// Options say where to look and how much to read.
type Options struct {
	// DebugDirs are the global debug directories searched by build id
	// (DIR/.build-id/xx/yyyy.debug) and by debug link (DIR/<file's
	// directory>/NAME); /usr/lib/debug on Debian.
	DebugDirs []string
	// MaxDecompressed bounds the bytes of compressed debug sections
	// inflated into memory for one file; a file that needs more is
	// refused with ErrTooLarge.
	MaxDecompressed int64
	// InflateDir, when set, is where compressed sections are inflated:
	// into unlinked files there, mapped. Their pages are then the page
	// cache's (reclaimable, written to disk under memory pressure) and
	// resident in the daemon only while they are read, instead of heap
	// the garbage collector doubles. Empty, or where no file can be
	// made there, they are inflated on the heap.
	InflateDir string
}

// ErrNoDebugInfo says that neither the file nor a debug file found for it
// has line information.
var ErrNoDebugInfo = errors.New("no debug information")

// ErrTooLarge says that a file's compressed debug sections inflate to more
// than Options.MaxDecompressed.
var ErrTooLarge = errors.New("debug information larger than the limit")

// Executable is a mapped file to find debug information for.
type Executable struct {
	// File is the open file; Open does not keep it.
	File *os.File
	// Root is the file system root the file's path is in (the process's
	// /proc/PID/root); Path is its path there. They locate .gnu_debuglink
	// targets beside it.
	Root, Path string
}

// File is the debug information of one executable. It is not safe for
// concurrent use.
type File struct {
	// Source says where the information came from: "pclntab", "file",
	// "build-id" or "debuglink".
	Source string
	maps   [][]byte
	lines  lineSource
	cost   int64
}

// lineSource resolves addresses of the executable.
type lineSource interface {
	lookup(addr uint64) ([]Frame, error)
}

// Cost is about how many bytes the File keeps: mapped debug sections,
// inflated sections and indexes.
func (f *File) Cost() int64 { return f.cost }

// Lookup returns the frames at the executable's file virtual address
// addr, innermost first; all but the last are inlined. It returns nil and
// no error for addresses the information does not cover.
func (f *File) Lookup(addr uint64) (frames []Frame, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		// debug/dwarf trusts some lengths in the data, and a mapped
		// file truncated under us faults (SIGBUS, made a panic by
		// SetPanicOnFault): hostile files must cost an error, not the
		// daemon.
		if p := recover(); p != nil {
			frames, err = nil, fmt.Errorf("debug information at %#x: panic: %v", addr, p)
		}
	}()
	return f.lines.lookup(addr)
}

// Close unmaps the files.
func (f *File) Close() error {
	var err error
	for _, m := range f.maps {
		err = errors.Join(err, unix.Munmap(m))
	}
	f.maps = nil
	return err
}

// Open finds the debug information of exe: a Go pclntab, DWARF in the file
// itself, or a debug file by build id or debug link. It returns an error
// wrapping ErrNoDebugInfo when there is none.
func Open(exe Executable, opts Options) (_ *File, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reading debug information: panic: %v", p)
		}
	}()
	img, err := mapFile(exe.File)
	if err != nil {
		return nil, err
	}
	out := &File{maps: [][]byte{img}}
	defer func() {
		if err != nil {
			out.Close()
		}
	}()
	ef, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		return nil, fmt.Errorf("parsing ELF: %w", err)
	}
	if src, cost, err := openGo(ef, img); err == nil {
		out.Source, out.lines, out.cost = "pclntab", src, cost
		out.DropResident()
		return out, nil
	}
	if hasDWARF(ef) {
		out.Source = "file"
		return out, out.openDWARF(ef, img, opts)
	}
	debugFile, source, err := findDebugFile(ef, exe, opts)
	if err != nil {
		return nil, err
	}
	defer debugFile.Close()
	dimg, err := mapFile(debugFile)
	if err != nil {
		return nil, err
	}
	out.maps = append(out.maps, dimg)
	def, err := elf.NewFile(bytes.NewReader(dimg))
	if err != nil {
		return nil, fmt.Errorf("parsing debug file %s: %w", debugFile.Name(), err)
	}
	if !hasDWARF(def) {
		return nil, fmt.Errorf("%w: debug file %s has no DWARF", ErrNoDebugInfo, debugFile.Name())
	}
	out.Source = source
	return out, out.openDWARF(def, dimg, opts)
}

func (f *File) openDWARF(ef *elf.File, img []byte, opts Options) error {
	in := &inflater{dir: opts.InflateDir, budget: opts.MaxDecompressed}
	d, cost, err := openDWARF(ef, img, in)
	f.maps = append(f.maps, in.maps...)
	if err != nil {
		return err
	}
	f.lines, f.cost = d, cost
	f.DropResident()
	return nil
}

// DropResident drops the resident pages of the File's mappings: parsing
// and indexing touched most pages of the tables, lookups need few. Dropped
// from the daemon's memory, they stay in the page cache and come back when
// read. Not safe to call concurrently with Close.
func (f *File) DropResident() {
	for _, m := range f.maps {
		_ = unix.Madvise(m, unix.MADV_DONTNEED)
	}
}

// mapFile maps a whole regular file read-only.
func mapFile(f *os.File) ([]byte, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("%s is not a regular file", f.Name())
	}
	if st.Size == 0 {
		return nil, fmt.Errorf("%s is empty", f.Name())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", f.Name(), err)
	}
	return b, nil
}

// hasDWARF says whether f has line tables.
func hasDWARF(f *elf.File) bool {
	for _, name := range []string{".debug_info", ".zdebug_info"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS && s.Size > 0 {
			return true
		}
	}
	return false
}

// findDebugFile looks for exe's separate debug file: by build id in each
// debug directory, then by its debug link beside it, in its .debug
// directory and under each debug directory. A candidate must match the
// executable: by build id where both have one, else by the link's CRC.
func findDebugFile(ef *elf.File, exe Executable, opts Options) (*os.File, string, error) {
	if f, err := OpenByBuildID(ef, opts.DebugDirs); err == nil {
		return f, "build-id", nil
	}
	buildID := gnuBuildID(ef)
	link, crc, ok := debugLink(ef)
	if !ok {
		return nil, "", fmt.Errorf("%w: none in the file, none by build id, no debug link", ErrNoDebugInfo)
	}
	dir := filepath.Dir(exe.Path)
	cands := []string{
		filepath.Join(exe.Root, dir, link),
		filepath.Join(exe.Root, dir, ".debug", link),
	}
	for _, d := range opts.DebugDirs {
		cands = append(cands, filepath.Join(d, dir, link))
	}
	for _, p := range cands {
		if p == filepath.Join(exe.Root, exe.Path) {
			continue
		}
		if f, ok := openCandidate(p, buildID, &crc); ok {
			return f, "debuglink", nil
		}
	}
	return nil, "", fmt.Errorf("%w: none in the file, none by build id, debug link %q not found", ErrNoDebugInfo, link)
}

// OpenByBuildID opens the separate debug file of ef found by its GNU build
// id in dirs (DIR/.build-id/xx/yyyy.debug), checked to carry the same id;
// ErrNoDebugInfo when ef has no build id or no dir has its file.
func OpenByBuildID(ef *elf.File, dirs []string) (*os.File, error) {
	buildID := gnuBuildID(ef)
	if len(buildID) < 2 {
		return nil, fmt.Errorf("%w: no build id", ErrNoDebugInfo)
	}
	hexID := fmt.Sprintf("%x", buildID)
	for _, dir := range dirs {
		if f, ok := openCandidate(filepath.Join(dir, ".build-id", hexID[:2], hexID[2:]+".debug"), buildID, nil); ok {
			return f, nil
		}
	}
	return nil, fmt.Errorf("%w: no debug file for build id %s", ErrNoDebugInfo, hexID)
}

// openCandidate opens a possible debug file and checks that it belongs to
// the executable: same GNU build id where both have one, else the debug
// link's CRC-32 of the whole file.
func openCandidate(path string, buildID []byte, crc *uint32) (*os.File, bool) {
	// O_NONBLOCK: a FIFO planted under a debug name must not hang us.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), path)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		f.Close()
		return nil, false
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		f.Close()
		return nil, false
	}
	if id := gnuBuildID(ef); len(id) > 0 && len(buildID) > 0 {
		if bytes.Equal(id, buildID) {
			return f, true
		}
		f.Close()
		return nil, false
	}
	if crc == nil {
		f.Close()
		return nil, false
	}
	h := crc32.NewIEEE()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, st.Size)); err != nil || h.Sum32() != *crc {
		f.Close()
		return nil, false
	}
	return f, true
}

// gnuBuildID returns the descriptor of the NT_GNU_BUILD_ID note.
func gnuBuildID(f *elf.File) []byte {
	s := f.Section(".note.gnu.build-id")
	if s == nil || s.Size > 1<<12 {
		return nil
	}
	b, err := s.Data()
	if err != nil || len(b) < 16 {
		return nil
	}
	namesz, descsz, typ := f.ByteOrder.Uint32(b), f.ByteOrder.Uint32(b[4:]), f.ByteOrder.Uint32(b[8:])
	nameEnd := 12 + (uint64(namesz)+3)&^3
	if typ != 3 || namesz != 4 || nameEnd+uint64(descsz) > uint64(len(b)) || string(b[12:15]) != "GNU" {
		return nil
	}
	return b[nameEnd : nameEnd+uint64(descsz)]
}

// debugLink returns the file name and CRC-32 of .gnu_debuglink: a
// NUL-terminated name padded to 4 bytes, then the CRC. A name with a path
// separator or naming a directory is refused: it would leave the
// directories we search.
func debugLink(f *elf.File) (string, uint32, bool) {
	s := f.Section(".gnu_debuglink")
	if s == nil || s.Size > 4096 {
		return "", 0, false
	}
	b, err := s.Data()
	if err != nil {
		return "", 0, false
	}
	n := bytes.IndexByte(b, 0)
	if n <= 0 {
		return "", 0, false
	}
	name := string(b[:n])
	crcAt := (n + 4) &^ 3
	if crcAt+4 > len(b) || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return "", 0, false
	}
	// The CRC is in the file's byte order (GDB manual, "Separate Debug
	// Files").
	return name, f.ByteOrder.Uint32(b[crcAt:]), true
}

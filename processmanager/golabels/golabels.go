// Package golabels finds what BPF needs to read a Go program's goroutine
// labels (runtime/pprof's Do, SetGoroutineLabels) at sample time: where
// the running thread's g is, the runtime's struct offsets from g to the
// labels of the goroutine the thread runs, and how the labels are laid
// out. It reads the executable file only (the Go version from its build
// information, offsets from a table per release or else the file's
// DWARF), so the result is shared by every process of the file.
package golabels

import (
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/hostprof/ebpf-profiler/processmanager/elftls"
)

// Errors of Read. ErrNotGo is expected (most programs are not Go's).
var (
	ErrNotGo = errors.New("not a Go program")
	// ErrUnsupported: a Go release whose offsets are neither in the table
	// nor in the file's DWARF, or older than labels BPF can read.
	ErrUnsupported = errors.New("Go release not supported for goroutine labels")
	// ErrNoG: where the running thread's g is could not be found.
	ErrNoG = errors.New("no way to the running goroutine")
)

// Layout is how BPF reaches the labels of the goroutine a thread runs.
type Layout struct {
	// Version is the Go release the program was built with ("go1.24.4").
	Version string
	// GInRegister: the thread's g is in a register while Go code runs
	// (arm64's x28; programs without cgo keep it nowhere else). Otherwise
	// it is at the thread pointer + TLSOffset.
	GInRegister bool
	TLSOffset   int64
	// GM, MCurg and GLabels are the offsets of g.m, m.curg and g.labels.
	GM, MCurg, GLabels uint16
	// LabelsMap: g.labels points to a map[string]string (Go 1.9-1.23);
	// else to a struct whose first field is a []struct{key, value string}
	// (Go 1.24 on).
	LabelsMap bool
}

// releaseOffsets are the offsets per Go release, read from the DWARF of
// programs each release's toolchain built for amd64 and arm64 (the same on
// both; TestOffsetTable builds them again with every toolchain
// utils/gofetch fetches and checks). Releases not listed (1.18, 1.20, newer
// ones) need the program's DWARF.
var releaseOffsets = map[int]offsets{
	19: {gM: 48, mCurg: 192, gLabels: 360},
	21: {gM: 48, mCurg: 192, gLabels: 344},
	22: {gM: 48, mCurg: 192, gLabels: 344},
	23: {gM: 48, mCurg: 192, gLabels: 352},
	24: {gM: 48, mCurg: 192, gLabels: 352},
	25: {gM: 48, mCurg: 184, gLabels: 344},
	26: {gM: 48, mCurg: 184, gLabels: 352},
	27: {gM: 48, mCurg: 184, gLabels: 352},
}

// Releases whose labels BPF reads: g.labels appeared in Go 1.9; labels
// are a map until 1.23 and a slice from 1.24.
const (
	firstRelease     = 18
	firstSliceLabels = 24
)

// Read finds the layout of a Go executable, r its bytes and symtab its
// symbol table (nil when it has none). ErrNotGo when f has no Go build
// information.
func Read(f *elf.File, r io.ReaderAt, symtab []elf.Symbol) (*Layout, error) {
	bi, err := buildinfo.Read(r)
	if err != nil {
		return nil, ErrNotGo
	}
	for _, s := range bi.Settings {
		// A library's runtime keeps g in the dynamic TLS of its module,
		// which BPF does not reach from an offset.
		if s.Key == "-buildmode" && (s.Value == "c-shared" || s.Value == "plugin") {
			return nil, fmt.Errorf("%w: a %s library", ErrUnsupported, s.Value)
		}
	}
	minor, ok := releaseMinor(bi.GoVersion)
	if !ok || minor < firstRelease {
		return nil, fmt.Errorf("%w: %q", ErrUnsupported, bi.GoVersion)
	}
	l := &Layout{Version: bi.GoVersion, LabelsMap: minor < firstSliceLabels}
	o, known := releaseOffsets[minor]
	if !known {
		if o, err = offsetsFromDWARF(f); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUnsupported, bi.GoVersion, err)
		}
	}
	l.GM, l.MCurg, l.GLabels = uint16(o.gM), uint16(o.mCurg), uint16(o.gLabels)
	if err := l.findG(f, symtab); err != nil {
		return nil, err
	}
	return l, nil
}

// goRelease matches a Go release's version: "go1.24.4", "go1.22rc1",
// "go1.24.4 X:boringcrypto".
var goRelease = regexp.MustCompile(`^go1\.(\d+)(\D|$)`)

// releaseMinor is the minor release of a Go version string.
func releaseMinor(v string) (int, bool) {
	m := goRelease.FindStringSubmatch(v)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil && n < 1000
}

// findG finds where a thread's g is. The Go linker keeps it in the
// executable's static TLS: runtime.tlsg (amd64) or runtime.tls_g (arm64),
// a variable of the TLS segment. On x86_64 (TLS variant II) the segment
// ends at the thread pointer, so the variable is at its value minus the
// segment's size, rounded up to its alignment; a program linked without
// cgo has no segment and uses -8 (runtime.settls points the fs base 8
// bytes past m.tls[0]). On arm64 (variant I) the segment starts 16 bytes
// past the thread pointer (rounded up to its alignment); a program without
// cgo has no segment and keeps g in x28 only, as does, for us, a stripped
// one (its segment holds two variables, and x28 is g while Go code runs).
func (l *Layout) findG(f *elf.File, symtab []elf.Symbol) error {
	tls := elftls.Segment(f)
	var name string
	switch f.Machine {
	case elf.EM_X86_64:
		name = "runtime.tlsg"
	case elf.EM_AARCH64:
		name = "runtime.tls_g"
	default:
		return fmt.Errorf("%w: %v code", ErrNoG, f.Machine)
	}
	value, found, err := tlsSymbolValue(symtab, tls, name)
	switch {
	case err != nil:
		return err
	case f.Machine == elf.EM_AARCH64 && !found:
		l.GInRegister = true
		return nil
	case tls == nil:
		l.TLSOffset = -8
		return nil
	case !found && tls.Memsz != 8:
		return fmt.Errorf("%w: no %s in a TLS segment of %d bytes", ErrNoG, name, tls.Memsz)
	}
	// Found, or stripped with the segment holding that variable alone
	// (8 bytes, at 0).
	l.TLSOffset, err = elftls.ExecutableOffset(f.Machine, tls, value)
	return err
}

// tlsSymbolValue is the value (offset in the TLS segment tls, nil when
// there is none) of the TLS variable name, if symtab has it.
func tlsSymbolValue(symtab []elf.Symbol, tls *elf.Prog, name string) (uint64, bool, error) {
	if tls == nil {
		return 0, false, nil
	}
	for _, s := range symtab {
		if elf.ST_TYPE(s.Info) == elf.STT_TLS && s.Name == name {
			if s.Value+8 > tls.Memsz {
				return 0, false, fmt.Errorf("%w: %s at %#x is outside the TLS segment", ErrNoG, s.Name, s.Value)
			}
			return s.Value, true, nil
		}
	}
	return 0, false, nil
}

// offsets are the runtime's struct offsets on the way from a thread's g to
// its goroutine's labels: g.m, m.curg (the goroutine the thread runs,
// whichever g it is on: its own, the system stack's or the signal
// handler's) and g.labels.
type offsets struct {
	gM, mCurg, gLabels int64
}

// maxOffset bounds a struct offset BPF is given (a u16).
const maxOffset = 1<<16 - 1

// Package perl unwinds Perl 5 stacks (5.32 to 5.42, threaded builds such
// as Debian's, x86_64 and arm64). This part reads what a libperl.so, or a
// perl executable with the interpreter linked in, says of itself: its
// version, its runops loops and where the pthread key of the thread's
// interpreter is. internals.md says what each step rests on.
package perl

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// ErrNotPerl says a file holds no Perl interpreter.
var ErrNotPerl = errors.New("not a Perl interpreter")

// Binary is what a libperl or perl executable says of itself; addresses
// are the file's virtual addresses.
type Binary struct {
	// Version: PL_revision, PL_version and PL_subversion are its Major,
	// Minor and Patch.
	Version interpreter.Version
	// Runops are the runops loops, [start, end): Perl_runops_standard
	// and Perl_runops_debug (PL_runops is one of them unless an XS module
	// installs its own, internals.md §7).
	Runops [][2]uint64
	// ThrKey is PL_thr_key, the pthread key (a u32) every thread's
	// interpreter is bound to (§1.4); 0 in a perl built without threads.
	ThrKey uint64
	// InterpSize is PL_interp_size, sizeof(struct interpreter) of the
	// build (§2): a check of the build against the layout.
	InterpSize uint64
}

// Symbols every Perl 5 exports (internals.md §1.2, §2): its version bytes,
// the pthread key, the interpreter's size and the runops loops.
const (
	revisionSymbol   = "PL_revision"
	versionSymbol    = "PL_version"
	subversionSymbol = "PL_subversion"
	thrKeySymbol     = "PL_thr_key"
	interpSizeSymbol = "PL_interp_size"
	runopsStandard   = "Perl_runops_standard"
	runopsDebug      = "Perl_runops_debug"
)

// Detect reads a Perl interpreter's facts from f, whose exported symbols
// are dynsym. Other files (among them Debian's launcher
// perl5.36-x86_64-linux-gnu, which imports the interpreter from libperl)
// give ErrNotPerl.
func Detect(f *elf.File, dynsym []elf.Symbol) (*Binary, error) {
	syms := map[string]elf.Symbol{}
	for _, s := range dynsym {
		switch s.Name {
		case revisionSymbol, versionSymbol, subversionSymbol, thrKeySymbol, interpSizeSymbol, runopsStandard, runopsDebug:
			if s.Section != elf.SHN_UNDEF {
				syms[s.Name] = s
			}
		}
	}
	std, ok := syms[runopsStandard]
	if !ok {
		return nil, ErrNotPerl
	}
	b := &Binary{}
	var v [3]int
	for i, name := range []string{revisionSymbol, versionSymbol, subversionSymbol} {
		s, ok := syms[name]
		if !ok {
			return nil, ErrNotPerl
		}
		buf, err := interpreter.ReadELF(f, s.Value, 1)
		if err != nil || len(buf) != 1 {
			return nil, fmt.Errorf("perl: reading %s: %v", name, err)
		}
		v[i] = int(buf[0])
	}
	b.Version = interpreter.Version{Major: v[0], Minor: v[1], Patch: v[2]}
	if b.Version.Major != 5 {
		return nil, fmt.Errorf("perl %v: not Perl 5", b.Version)
	}
	for _, s := range []elf.Symbol{std, syms[runopsDebug]} {
		if s.Value != 0 && s.Size != 0 {
			b.Runops = append(b.Runops, [2]uint64{s.Value, s.Value + s.Size})
		}
	}
	if len(b.Runops) == 0 {
		return nil, fmt.Errorf("perl %v: %s has no size", b.Version, runopsStandard)
	}
	if s, ok := syms[thrKeySymbol]; ok && s.Size == 4 {
		b.ThrKey = s.Value
	}
	if s, ok := syms[interpSizeSymbol]; ok {
		buf, err := interpreter.ReadELF(f, s.Value, 2)
		if err != nil || len(buf) != 2 {
			return nil, fmt.Errorf("perl %v: reading %s: %v", b.Version, interpSizeSymbol, err)
		}
		b.InterpSize = uint64(binary.LittleEndian.Uint16(buf))
	}
	return b, nil
}

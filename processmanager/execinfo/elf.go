package execinfo

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hostprof/ebpf-profiler/interpreter"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/processmanager/debuginfo"
	"github.com/hostprof/ebpf-profiler/processmanager/golabels"
	"github.com/hostprof/ebpf-profiler/processmanager/threadctx"
	"github.com/hostprof/ebpf-profiler/support"
	"github.com/hostprof/ebpf-profiler/tracecorr"
)

// ELF is what the process manager needs of an ELF file: where its segments
// load, its build ids and its function symbols. It is a pure function of the
// file's bytes, and is not to be changed once built: every process mapping
// the file shares it.
type ELF struct {
	loads      []loadSegment
	GNUBuildID string
	GoBuildID  string
	// Runtimes are the language runtimes found in the file;
	// recogniseErrs say which found it theirs but could not read it.
	Runtimes      []RuntimeMatch
	recogniseErrs []error
	// TSD says where the C library this file is keeps thread-specific
	// data; nil unless the file defines pthread_getspecific, with TSDErr
	// set if its code could not be decoded.
	TSD    *libc.TSDLayout
	TSDErr error
	// APM is set for an APM agent's library (see files.go).
	APM *tracecorr.Library
	// GoLabels says how BPF reads the goroutine labels of a Go program's
	// threads; nil for other files, with GoLabelsErr set for a Go program
	// whose labels cannot be read.
	GoLabels    *golabels.Layout
	GoLabelsErr error
	// Go says the file is a Go program (or library): it has a Go build
	// id or build information.
	Go bool
	// ThreadCtx is where the file keeps the OpenTelemetry thread context
	// pointer (OTEP 4947), nil when it defines none; ThreadCtxErr says
	// why one it defines cannot be read.
	ThreadCtx    *threadctx.Var
	ThreadCtxErr error
	// symbols is nil when the file has no function symbols: none in
	// .symtab, .dynsym or, for Go binaries, .gopclntab.
	symbols *symbolTable
}

// Lookup returns the name of the function containing addr, a file address.
func (d *ELF) Lookup(addr uint64) (string, bool) { return d.symbols.lookup(addr) }

// loadSegment is a PT_LOAD program header.
type loadSegment struct {
	vaddr, offset, filesz uint64
	executable            bool
}

// maxNoteSize bounds how much of a note section or segment is read, so a
// corrupt header cannot make us allocate gigabytes.
const maxNoteSize = 1 << 20

// pageMask masks the offset within a page.
var pageMask = uint64(os.Getpagesize() - 1)

var errNotELF = errors.New("not an ELF file")

// isELF reports whether r starts with the ELF magic.
func isELF(r io.ReaderAt) bool {
	var magic [4]byte
	_, err := r.ReadAt(magic[:], 0)
	return err == nil && string(magic[:]) == elf.ELFMAG
}

// RuntimeMatch is a runtime found in a file.
type RuntimeMatch struct {
	Runtime *interpreter.Runtime
	Binary  interpreter.Binary
}

// parseELF reads the load segments, build ids and symbols of an ELF file,
// and finds which of the runtimes rts it holds (path is its name). Corrupt
// files yield an error, never a panic: debug/elf is hardened and fuzzed,
// and a recover turns any panic it still has into an error because these
// bytes come from arbitrary files on the host.
func parseELF(r io.ReaderAt, path string, rts []*interpreter.Runtime, debugDirs []string) (d *ELF, err error) {
	if !isELF(r) {
		return nil, errNotELF
	}
	defer func() {
		if p := recover(); p != nil {
			d, err = nil, fmt.Errorf("parsing ELF: panic: %v", p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("parsing ELF: %w", err)
	}
	d = &ELF{}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			d.loads = append(d.loads, loadSegment{
				vaddr:      p.Vaddr,
				offset:     p.Off,
				filesz:     p.Filesz,
				executable: p.Flags&elf.PF_X != 0,
			})
		}
	}
	d.GNUBuildID, d.GoBuildID = findBuildIDs(f)
	// Both tables, once, for the daemon's symbol table and every
	// runtime's look.
	// A damaged .symtab leaves .dynsym's names.
	symtab, symtabErr := nativeunwind.ReadSymbols(f, elf.SHT_SYMTAB)
	dynsym, err := nativeunwind.ReadSymbols(f, elf.SHT_DYNSYM)
	syms := symtab
	if len(syms) == 0 || symtabErr != nil {
		syms = dynsym
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return nil, fmt.Errorf("reading ELF symbols: %w", err)
		}
	}
	named := syms
	if len(symtab) == 0 && len(debugDirs) > 0 {
		// Only for names: the runtimes and the TSD layout read the
		// file's own tables.
		if dsyms, err := debugFileSymbols(f, debugDirs); err == nil && len(dsyms) > 0 {
			named = dsyms
		}
	}
	cands := elfSymbolCandidates(f, named)
	// Go binaries are often stripped; their .gopclntab still names every
	// Go function. A damaged table costs the names it could not give. The
	// table is used in place where the file can be mapped; the names are
	// copies.
	_ = nativeunwind.WithMappedFile(r, func(mapped []byte) error {
		if goSyms, err := nativeunwind.ReadGoSymbols(f, mapped); err == nil {
			goCands, _ := goSymbolCandidates(goSyms)
			cands = append(cands, goCands...)
		}
		return nil
	})
	d.symbols = buildSymbolTable(cands)
	if d.ThreadCtx, err = threadctx.Find(f, dynsym); err != nil && !errors.Is(err, threadctx.ErrNoVariable) {
		d.ThreadCtxErr = err
	}
	if d.GoBuildID != "" || f.Section(".go.buildinfo") != nil {
		d.Go = true
		d.GoLabels, d.GoLabelsErr = golabels.Read(f, r, symtab)
	}
	d.Runtimes, d.recogniseErrs = recogniseRuntimes(&interpreter.File{
		Path: path, ELF: f, FunctionRanges: func() ([][2]uint64, error) { return nativeunwind.FunctionRanges(f) },
		DynamicSymbols: dynsym, Symbols: symtab,
	}, rts)
	if definesGetspecific(syms) {
		if l, err := libc.TSDLayoutFromLibc(f); err == nil {
			d.TSD = &l
		} else {
			d.TSDErr = err
		}
	}
	return d, nil
}

// debugFileSymbols reads the .symtab of a stripped file's separate debug
// file, found by build id: a distribution's libraries keep only their
// exported symbols, and their internal functions (libc's start_thread,
// where every thread's stack begins) would otherwise stay unnamed until
// the debug file is opened for source lines, seconds later on a busy host.
func debugFileSymbols(f *elf.File, dirs []string) ([]elf.Symbol, error) {
	df, err := debuginfo.OpenByBuildID(f, dirs)
	if err != nil {
		return nil, err
	}
	defer df.Close()
	ef, err := elf.NewFile(df)
	if err != nil {
		return nil, err
	}
	return nativeunwind.ReadSymbols(ef, elf.SHT_SYMTAB)
}

// recogniseRuntimes asks each runtime whether the file holds it. A runtime
// that finds its file unreadable costs only itself: its error is returned
// to be counted.
func recogniseRuntimes(f *interpreter.File, rts []*interpreter.Runtime) (out []RuntimeMatch, errs []error) {
	for _, rt := range rts {
		if rt.Recognise == nil {
			continue
		}
		switch bin, err := rt.Recognise(f); {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", rt.Name, err))
		case bin != nil:
			out = append(out, RuntimeMatch{rt, bin})
		}
	}
	return out, errs
}

// readAgentLibrary reads an APM agent library's correlation symbols.
func readAgentLibrary(r io.ReaderAt) (lib *tracecorr.Library, err error) {
	defer func() {
		if p := recover(); p != nil {
			lib, err = nil, fmt.Errorf("parsing ELF: panic: %v", p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, err
	}
	return tracecorr.ReadLibrary(f)
}

// definesGetspecific says whether a symbol table defines
// pthread_getspecific: the file is a C library (or links one statically).
func definesGetspecific(syms []elf.Symbol) bool {
	for _, s := range syms {
		if s.Name == "pthread_getspecific" && s.Section != elf.SHN_UNDEF && s.Value != 0 {
			return true
		}
	}
	return false
}

// Bias returns the value to add to a file address (ELF virtual address) to
// get the process address, for a mapping of the file at start from file
// offset off. The mapping holds the PT_LOAD segment that covers off; its
// file offset p_offset sits at p_vaddr, so a process address a is file
// address a - start + off - p_offset + p_vaddr.
func (d *ELF) Bias(start, off uint64) (uint64, bool) {
	var best *loadSegment
	for i := range d.loads {
		s := &d.loads[i]
		// The kernel maps a segment from its page-aligned offset, which may
		// be below p_offset; mappings start at page boundaries.
		if off < s.offset&^pageMask || off >= s.offset+max(s.filesz, 1) {
			continue
		}
		// Prefer the executable segment: that is the one we are asked about.
		if best == nil || (s.executable && !best.executable) {
			best = s
		}
	}
	if best == nil {
		return 0, false
	}
	return start - off + best.offset - best.vaddr, true
}

// KnownFile returns what BPF's known_files says of the file: p_vaddr -
// p_offset of the executable segments (what turns a file offset in
// executable code into a file address) and the lowest one's p_vaddr (where
// the kernel's start_code of a process running the file points), or false
// if there are none or they disagree on the first.
func (d *ELF) KnownFile() (support.KnownFile, bool) {
	var k support.KnownFile
	found := false
	for _, s := range d.loads {
		if !s.executable {
			continue
		}
		a := int64(s.vaddr - s.offset)
		if found && a != k.VaddrAdjust {
			return support.KnownFile{}, false
		}
		if !found || s.vaddr < k.TextVaddr {
			k.TextVaddr = s.vaddr
		}
		k.VaddrAdjust, found = a, true
	}
	return k, found
}

// findBuildIDs returns the hex GNU build id and the Go build id of a file,
// from its note sections or, when section headers are missing, from its
// PT_NOTE segments.
func findBuildIDs(f *elf.File) (gnu, goID string) {
	visit := func(data []byte, align uint64) {
		for n := range elfNotes(data, align, f.ByteOrder) {
			switch {
			case n.name == "GNU" && n.typ == ntGNUBuildID && gnu == "":
				gnu = hex.EncodeToString(n.desc)
			case n.name == "Go" && n.typ == ntGoBuildID && goID == "":
				goID = string(n.desc)
			}
		}
	}
	var found bool
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOTE && s.Size <= maxNoteSize {
			found = true
			if data, err := s.Data(); err == nil {
				visit(data, s.Addralign)
			}
		}
	}
	if found {
		return gnu, goID
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_NOTE && p.Filesz <= maxNoteSize {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err == nil {
				visit(data, p.Align)
			}
		}
	}
	return gnu, goID
}

const (
	// ntGNUBuildID is NT_GNU_BUILD_ID, the type of the "GNU" build id note.
	ntGNUBuildID = 3
	// ntGoBuildID is the type of the "Go" note the Go linker writes into
	// .note.go.buildid.
	ntGoBuildID = 4
)

type elfNote struct {
	name string
	typ  uint32
	desc []byte
}

// elfNotes iterates over an ELF note stream (Elf_Nhdr records: namesz,
// descsz, type, then name and desc each padded to the alignment, which is 4
// except in notes aligned to 8). It stops at the first malformed record.
func elfNotes(data []byte, align uint64, order binary.ByteOrder) func(yield func(elfNote) bool) {
	pad := uint64(4)
	if align == 8 {
		pad = 8
	}
	roundUp := func(n uint64) uint64 { return (n + pad - 1) &^ (pad - 1) }
	return func(yield func(elfNote) bool) {
		for len(data) >= 12 {
			nameSize := uint64(order.Uint32(data[0:]))
			descSize := uint64(order.Uint32(data[4:]))
			typ := order.Uint32(data[8:])
			rest := data[12:]
			nameEnd := roundUp(nameSize)
			if nameEnd > uint64(len(rest)) {
				return
			}
			descEnd := nameEnd + roundUp(descSize)
			if descSize > uint64(len(rest)) || descEnd > uint64(len(rest)) {
				// The last note's desc may lack its padding.
				if nameEnd+descSize != uint64(len(rest)) {
					return
				}
				descEnd = uint64(len(rest))
			}
			name := string(bytes.TrimRight(rest[:nameSize], "\x00"))
			if !yield(elfNote{name: name, typ: typ, desc: rest[nameEnd : nameEnd+descSize]}) {
				return
			}
			data = rest[descEnd:]
		}
	}
}

// GNUBuildIDFromNotes returns the hex GNU build id in a raw note stream such
// as /sys/kernel/notes or a module's .note.gnu.build-id.
func GNUBuildIDFromNotes(data []byte) (string, error) {
	for n := range elfNotes(data, 4, binary.NativeEndian) {
		if n.name == "GNU" && n.typ == ntGNUBuildID && len(n.desc) > 0 {
			return hex.EncodeToString(n.desc), nil
		}
	}
	return "", errors.New("no GNU build id note")
}

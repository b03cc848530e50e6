package python

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// ErrNotPython says an ELF file holds no CPython interpreter.
var ErrNotPython = errors.New("not a CPython interpreter")

// Interpreter is a CPython interpreter found in an ELF file: libpython3.X.so,
// or a python3.X executable that links it statically.
type Interpreter struct {
	Version Version
	// Micro is the patch release where the binary states it, else -1.
	Micro int
	// File virtual addresses of the symbols the unwinder starts from; 0
	// where the version has none: _PyRuntime (3.7+) and
	// _PyThreadState_Current (3.6).
	Runtime, ThreadStateCurrent uint64
	// EvalFrame is [start, end) of _PyEval_EvalFrameDefault, the native
	// frame that Python frames replace in a mixed stack.
	EvalFrame [2]uint64
	// Debug is set for a debug build (Py_DEBUG, such as Debian's
	// python3.X-dbg): its objects carry reference-count debugging
	// fields, so its struct layouts are not the release builds'.
	Debug bool
}

// debugBuildSymbol is defined only where Py_REF_DEBUG is, which Py_DEBUG
// implies (Objects/object.c, 3.6-3.13).
const debugBuildSymbol = "_Py_NegativeRefcount"

// versionMarkers are public C API functions each minor release added and
// later ones kept ("New in version 3.x" in the C API documentation): the
// newest one present gives the minor version before 3.11, which has no
// Py_Version. 3.6 is the oldest with _PyEval_EvalFrameDefault (PEP 523).
var versionMarkers = []struct {
	symbol string
	minor  int
}{
	{"PyAIter_Check", 10},
	{"PyFrame_GetBack", 9},
	{"PyConfig_Clear", 8},
	{"PyContextVar_New", 7},
}

// microString matches the end of a string that ends in PY_VERSION
// ("3.9.18", "3.13.0rc1", "3.12.1+"): the linker may store it as the tail
// of a longer string, such as the build directory.
var microString = regexp.MustCompile(`(?:^|[^0-9.])3\.([0-9]{1,2})\.([0-9]{1,3})(?:(?:a|b|rc)[0-9]+)?\+?$`)

// maxRodata bounds how much read-only data Detect scans for the micro
// version: libpython's .rodata is a few hundred KiB.
const maxRodata = 64 << 20

// Detect says whether f holds a CPython interpreter and which version. The
// version comes from the binary, never from the file name: Py_Version
// (3.11+), else the newest API function it exports, with the micro version
// from the PY_VERSION string in .rodata where that can be found. Files of
// other programs give ErrNotPython.
func Detect(f *elf.File) (*Interpreter, error) {
	dyn, _ := f.DynamicSymbols()
	symtab, _ := f.Symbols()
	return detect(f, dyn, symtab)
}

// detect is Detect with f's .dynsym and .symtab read already.
func detect(f *elf.File, dyn, symtab []elf.Symbol) (*Interpreter, error) {
	syms := symbolTable(dyn, symtab)
	eval, ok := syms["_PyEval_EvalFrameDefault"]
	if !ok {
		return nil, ErrNotPython
	}
	in := &Interpreter{
		Micro:              -1,
		Runtime:            syms["_PyRuntime"].Value,
		ThreadStateCurrent: syms["_PyThreadState_Current"].Value,
		EvalFrame:          [2]uint64{eval.Value, eval.Value + eval.Size},
	}
	_, in.Debug = syms[debugBuildSymbol]
	if s, ok := syms["Py_Version"]; ok {
		hex, err := readUint(f, s)
		if err != nil {
			return nil, fmt.Errorf("reading Py_Version: %w", err)
		}
		// PY_VERSION_HEX: major, minor, micro, release level and serial
		// in bytes from the most significant down (Include/patchlevel.h).
		in.Version = Version{Major: int(hex >> 24 & 0xff), Minor: int(hex >> 16 & 0xff)}
		in.Micro = int(hex >> 8 & 0xff)
	} else {
		in.Version = Version{Major: 3, Minor: 6}
		for _, m := range versionMarkers {
			if _, ok := syms[m.symbol]; ok {
				in.Version.Minor = m.minor
				break
			}
		}
		in.Micro = rodataMicro(f, in.Version)
	}
	if in.Version.Major != 3 {
		return nil, fmt.Errorf("CPython %v: only Python 3 is supported", in.Version.MajorMinor())
	}
	return in, nil
}

// detectSymbols are the symbols Detect reads.
var detectSymbols = func() map[string]bool {
	m := map[string]bool{"_PyEval_EvalFrameDefault": true, "_PyRuntime": true, "_PyThreadState_Current": true,
		debugBuildSymbol: true, "Py_Version": true}
	for _, v := range versionMarkers {
		m[v.symbol] = true
	}
	return m
}()

// symbolTable returns the defined symbols of tables that Detect reads, by
// name; a later one wins.
func symbolTable(tables ...[]elf.Symbol) map[string]elf.Symbol {
	out := map[string]elf.Symbol{}
	for _, syms := range tables {
		for _, s := range syms {
			if s.Section != elf.SHN_UNDEF && s.Value != 0 && detectSymbols[s.Name] {
				out[s.Name] = s
			}
		}
	}
	return out
}

// readUint reads the unsigned integer a data symbol holds.
func readUint(f *elf.File, s elf.Symbol) (uint64, error) {
	if s.Size != 4 && s.Size != 8 {
		return 0, fmt.Errorf("symbol %s has %d bytes", s.Name, s.Size)
	}
	buf := make([]byte, s.Size)
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || s.Value < p.Vaddr || s.Value+s.Size > p.Vaddr+p.Filesz {
			continue
		}
		if _, err := p.ReadAt(buf, int64(s.Value-p.Vaddr)); err != nil {
			return 0, err
		}
		if s.Size == 4 {
			return uint64(f.ByteOrder.Uint32(buf)), nil
		}
		return f.ByteOrder.Uint64(buf), nil
	}
	return 0, fmt.Errorf("symbol %s at %#x is in no loaded segment", s.Name, s.Value)
}

// rodataMicro finds the micro version of v in the PY_VERSION string among
// the NUL-terminated strings of .rodata, or returns -1.
func rodataMicro(f *elf.File, v Version) int {
	sec := f.Section(".rodata")
	if sec == nil || sec.Type == elf.SHT_NOBITS || sec.Size > maxRodata {
		return -1
	}
	data, err := sec.Data()
	if err != nil {
		return -1
	}
	for s := range bytes.SplitSeq(data, []byte{0}) {
		m := microString.FindSubmatch(s)
		if m == nil {
			continue
		}
		if minor, _ := strconv.Atoi(string(m[1])); minor != v.Minor {
			continue
		}
		micro, _ := strconv.Atoi(string(m[2]))
		return micro
	}
	return -1
}

package python

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/tlsvar"
	"github.com/hostprof/ebpf-profiler/interpreter/libc"
)

// ErrNoThreadStateKey says the interpreter has no thread state key (yet, or
// any more): it creates it while initializing and deletes it when
// finalizing, so a process seen early should be read again later.
var ErrNoThreadStateKey = errors.New("CPython's thread state key is not created")

// ThreadStateKeyLocation is where a CPython binary keeps the pthread key
// its threads bind their PyThreadState to, as file virtual addresses, or
// (3.15+) the thread-local variable that holds it.
type ThreadStateKeyLocation struct {
	// TLS is the thread-local variable (3.15+); the fields below are then
	// unset.
	TLS *tlsvar.Ref
	// Key is the key: Py_tss_t._key in _PyRuntime (3.7+), an unsigned
	// pthread_key_t; the static int autoTLSkey (3.6), -1 until created
	// (Python/pystate.c).
	Key     uint64
	KeySize int
	// Initialized is Py_tss_t._is_initialized (3.7+), 1 while the key
	// exists; 0 in 3.6, which has none.
	Initialized uint64
}

// FindThreadStateKey says where the interpreter in f keeps its thread state
// key. 3.6 keeps it in a static variable that only .symtab names: a
// stripped 3.6 gives an error. 3.15+ keeps the thread state itself in a
// thread-local variable, found in the code of the exported function that
// reads it.
func FindThreadStateKey(f *elf.File, in *Interpreter, off *Offsets) (ThreadStateKeyLocation, error) {
	if off.ThreadStateFrom == ThreadStateFromGILStateTLS {
		return findGILStateTLS(f, off)
	}
	if off.Version.Minor <= 6 {
		syms, err := f.Symbols()
		if err != nil {
			return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v keeps its thread state key in %s, a static variable: %w",
				off.Version.MajorMinor(), TLSKeySymbol, err)
		}
		for _, s := range syms {
			if s.Name == TLSKeySymbol && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_OBJECT {
				if s.Size != 4 {
					return ThreadStateKeyLocation{}, fmt.Errorf("%s has %d bytes, want an int", TLSKeySymbol, s.Size)
				}
				return ThreadStateKeyLocation{Key: s.Value, KeySize: 4}, nil
			}
		}
		return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: no %s in .symtab (stripped?)", off.Version.MajorMinor(), TLSKeySymbol)
	}
	switch {
	case in.Runtime == 0:
		return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v without %s", off.Version.MajorMinor(), RuntimeSymbol)
	case off.Runtime.AutoTSSKey == NoField || off.TSS.Key == NoField || off.TSS.IsInitialized == NoField:
		return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: no Py_tss_t autoTSSkey offsets", off.Version.MajorMinor())
	case off.TSS.KeySize != 4:
		return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: Py_tss_t._key has %d bytes, want a 4-byte pthread_key_t",
			off.Version.MajorMinor(), off.TSS.KeySize)
	}
	tss := in.Runtime + uint64(off.Runtime.AutoTSSKey)
	return ThreadStateKeyLocation{
		Key:         tss + uint64(off.TSS.Key),
		KeySize:     off.TSS.KeySize,
		Initialized: tss + uint64(off.TSS.IsInitialized),
	}, nil
}

// findGILStateTLS finds _Py_tss_gilstate from the code of
// PyGILState_GetThisThreadState, which returns it.
func findGILStateTLS(f *elf.File, off *Offsets) (ThreadStateKeyLocation, error) {
	dynsym, err := f.DynamicSymbols()
	if err != nil {
		return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: reading .dynsym: %w", off.Version.MajorMinor(), err)
	}
	for _, s := range dynsym {
		if s.Name != GILStateReaderSymbol || s.Section == elf.SHN_UNDEF || elf.ST_TYPE(s.Info) != elf.STT_FUNC {
			continue
		}
		ref, err := tlsvar.Find(f, s, dynsym)
		if err != nil {
			return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: the thread state's thread-local variable: %w",
				off.Version.MajorMinor(), err)
		}
		return ThreadStateKeyLocation{TLS: &ref}, nil
	}
	return ThreadStateKeyLocation{}, fmt.Errorf("CPython %v: no %s", off.Version.MajorMinor(), GILStateReaderSymbol)
}

// ThreadStateKey reads the pthread key of the interpreter's thread states
// from the memory of a process (such as /proc/PID/mem) that maps the file
// with the load bias bias (its address minus its file virtual address).
// ErrNoThreadStateKey says the key is not created.
func ThreadStateKey(loc ThreadStateKeyLocation, mem io.ReaderAt, bias uint64) (uint32, error) {
	read := func(vaddr uint64) (uint32, error) {
		var buf [4]byte
		if _, err := mem.ReadAt(buf[:], int64(vaddr+bias)); err != nil {
			return 0, fmt.Errorf("reading the thread state key at %#x: %w", vaddr+bias, err)
		}
		return binary.LittleEndian.Uint32(buf[:]), nil
	}
	if loc.KeySize != 4 {
		return 0, fmt.Errorf("thread state key of %d bytes", loc.KeySize)
	}
	if loc.Initialized != 0 {
		init, err := read(loc.Initialized)
		if err != nil {
			return 0, err
		}
		if init != 1 {
			return 0, fmt.Errorf("autoTSSkey._is_initialized is %d: %w", int32(init), ErrNoThreadStateKey)
		}
	}
	key, err := read(loc.Key)
	if err != nil {
		return 0, err
	}
	switch {
	case loc.Initialized == 0 && int32(key) == -1:
		return 0, fmt.Errorf("%s is -1: %w", TLSKeySymbol, ErrNoThreadStateKey)
	case key >= libc.MaxKeys:
		return 0, fmt.Errorf("thread state key %d: no C library hands out keys beyond %d", key, libc.MaxKeys)
	}
	return key, nil
}

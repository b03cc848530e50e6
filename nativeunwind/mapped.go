package nativeunwind

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// maxMappedFile bounds what WithMappedFile maps: more than any binary a
// process runs, less than the address space a mistake could take.
const maxMappedFile = 4 << 30

// WithMappedFile calls fn with the whole file r reads mapped read-only, or
// with nil when r is not an open file or cannot be mapped; the mapping is
// gone when fn returns, so fn must keep nothing that points into it.
// Sections used in place cost no heap: a Go binary's .gopclntab (10-15 MiB)
// read into the heap by three set-ups at once was half of a restart's
// peak heap, where the pages of a mapping leave the resident set at once.
// A file truncated while it is mapped faults on access: the fault is
// returned as an error, never a crash.
func WithMappedFile(r io.ReaderAt, fn func(mapped []byte) error) (err error) {
	mapped := mapFile(r)
	if mapped == nil {
		return fn(nil)
	}
	defer unix.Munmap(mapped)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if f, ok := p.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("the file changed while it was read (fault at %#x)", f.Addr())
			return
		}
		panic(p)
	}()
	return fn(mapped)
}

// mapFile maps r's file if r is an open regular file; nil otherwise.
func mapFile(r io.ReaderAt) []byte {
	f, ok := r.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() <= 0 || st.Size() > maxMappedFile {
		return nil
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	return b
}

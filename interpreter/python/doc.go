// Package python is what the profiler knows of CPython: the layout of its
// structures per version (offsets*.go, generated from each release's
// headers by utils/pyoffsets and checked against DWARF and against the
// debug offsets a live 3.13+ interpreter publishes), how to find it in a
// binary and its version (detect.go), where its thread state key is
// (tsd_key.go; the C library's thread-specific data is package libc's), how
// its code objects map instruction offsets to source lines
// (linetable*.go), and the symbolizer that names a frame from its code
// object (symbolize*.go). runtime.go plugs it into package interpreter; the
// BPF unwinder is support/ebpf/cpython.ebpf.c.
package python

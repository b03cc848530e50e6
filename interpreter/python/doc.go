// Package python is what the profiler knows of CPython: the layout of its
// structures per version (offsets*.go, generated from each release's
// headers by utils/pyoffsets and checked against DWARF and against the
// debug offsets a live 3.13+ interpreter publishes) and how its code
// objects map instruction offsets to source lines (linetable*.go). The BPF
// unwinder and the user-space symbolizer of Python frames build on these.
package python

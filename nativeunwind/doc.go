// Package nativeunwind turns an executable file's unwind information into
// stack deltas: for every address range of its code, how to find the
// caller's frame (the canonical frame address, the return address and the
// frame pointer) without frame pointers or symbols. The sources are
// .eh_frame (with .eh_frame_hdr), .debug_frame and, for Go, .gopclntab;
// files without section headers are read through their program headers.
//
// Everything here is a pure function of a file's bytes: no BPF, no /proc.
// Malformed input yields an error naming the offset and the problem, never a
// panic or an endless loop.
package nativeunwind

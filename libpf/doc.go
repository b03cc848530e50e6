// Package libpf is the profiler's small shared vocabulary: file ids, trace
// hashes, frame kinds and the user-space trace and sample types that flow from
// the process manager to the reporter, and the bounded LRU cache that the
// packages holding per-file or per-object state share. It depends on nothing
// else of ours.
package libpf

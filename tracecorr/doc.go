// Package tracecorr implements the APM agent side of trace correlation
// (../shared/reference/apm-profiler-correlation-spec.txt): it recognizes an
// APM agent's native library in a process, finds what the BPF unwinder
// needs to read each thread's trace context (the thread-local variable's
// offset from the thread pointer, through its TLS descriptor), reads the
// agent's process storage, and (later) sends registration and correlation
// datagrams to the agent's socket.
//
// Everything read here comes from another program's files and memory: every
// length is bounded before anything is allocated, and what does not add up
// is an error, never a panic.
package tracecorr

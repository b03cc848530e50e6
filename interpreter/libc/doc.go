// Package libc learns what runtimes' unwinders need of a process's C
// library from the library's own code: where it keeps thread-specific data
// (pthread_getspecific), for each C library and architecture.
package libc

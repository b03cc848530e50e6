// Package support is the Go side of the definitions BPF and user space share:
// the compiled BPF objects, the layout of the records BPF emits, and the
// program and counter ids. support/ebpf/types.h is the source of truth; tests
// check this package against the BTF of the compiled objects.
package support

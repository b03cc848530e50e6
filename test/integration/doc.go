// Package integration holds the BPF integration tests: they load the real
// programs into the running kernel, profile workloads with known call chains
// and check the stacks that come out. They need root and run when
// EBPF_PROFILER_TEST_INTEGRATION=1 (`make test` sets it).
package integration

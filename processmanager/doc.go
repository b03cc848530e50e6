// Package processmanager owns the state of every profiled process — its
// executable mappings, the files behind them, its process info — and turns
// raw BPF traces (support.Trace) into user-space traces (libpf.Trace).
//
// A Manager reads processes lazily, through a process.Source (procfs unless
// Config says otherwise): a process is looked at when its first trace
// arrives, and its mappings are re-read (rate limited) when an address falls
// outside every known one. Per-file data (file id, build ids, symbols;
// package execinfo) is cached by file identity, so a library mapped by a
// thousand processes is parsed once. A Handler sits in front of the
// Manager on the tracer's event pump: it converts each distinct BPF trace
// once and reports every sample.
// Reading processes is the lifecycle goroutine's (lifecycle.go): the pump
// converts the traces of processes already read and hands the lifecycle
// the others, and every process event.
package processmanager

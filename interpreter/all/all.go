// Package all registers every language runtime: importing it is what
// makes them known to the daemon. A new runtime adds its line here.
package all

import (
	_ "github.com/hostprof/ebpf-profiler/interpreter/beam"
	_ "github.com/hostprof/ebpf-profiler/interpreter/hotspot"
	_ "github.com/hostprof/ebpf-profiler/interpreter/luajit"
	_ "github.com/hostprof/ebpf-profiler/interpreter/perfmap"
	_ "github.com/hostprof/ebpf-profiler/interpreter/perl"
	_ "github.com/hostprof/ebpf-profiler/interpreter/php"
	_ "github.com/hostprof/ebpf-profiler/interpreter/python"
	_ "github.com/hostprof/ebpf-profiler/interpreter/ruby"
	_ "github.com/hostprof/ebpf-profiler/interpreter/v8"
)

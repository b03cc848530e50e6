package support

import _ "embed"

// ObjectName is the committed BPF object for this architecture.
const ObjectName = "tracer.ebpf.arm64.o"

//go:embed ebpf/tracer.ebpf.arm64.o
var tracerObject []byte

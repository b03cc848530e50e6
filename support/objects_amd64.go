package support

import _ "embed"

// ObjectName is the committed BPF object for this architecture.
const ObjectName = "tracer.ebpf.amd64.o"

//go:embed ebpf/tracer.ebpf.amd64.o
var tracerObject []byte

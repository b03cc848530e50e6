package support

import (
	"bytes"
	"fmt"

	"github.com/cilium/ebpf"
)

// LoadSpec parses the embedded BPF object for this architecture. Parsing
// does not touch the kernel.
func LoadSpec() (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(tracerObject))
	if err != nil {
		return nil, fmt.Errorf("parsing embedded BPF object: %w", err)
	}
	return spec, nil
}

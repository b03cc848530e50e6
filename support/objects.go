package support

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
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

// LoadShared reads the shared definitions of the embedded BPF object, for
// what needs them without loading it (tests, code generators).
func LoadShared() (*Shared, error) {
	spec, err := LoadSpec()
	if err != nil {
		return nil, err
	}
	return ReadShared(spec)
}

// ObjectHash is the SHA-256 of the embedded BPF object, hex-encoded: what
// `sha256sum support/ebpf/` + ObjectName prints for the object this binary
// runs.
func ObjectHash() string {
	sum := sha256.Sum256(tracerObject)
	return hex.EncodeToString(sum[:])
}

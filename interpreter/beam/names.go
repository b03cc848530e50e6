package beam

import (
	"io"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// addrNamer reports a BEAM frame by its PC alone, until the symbolizer
// (symbolize.go) names it.
type addrNamer struct{}

func newNamer(io.ReaderAt, Tables, int) frameNamer { return addrNamer{} }

func (addrNamer) frame(pc uint64, _ bool) (libpf.Frame, error) {
	return libpf.Frame{Address: pc}, nil
}

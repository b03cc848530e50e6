package debuginfo

import (
	"debug/elf"
	"errors"

	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// goLines resolves a Go executable's addresses through its pclntab, which
// stripped binaries keep: lines and the inlining tree.
type goLines struct {
	g *nativeunwind.GoLines
}

// openGo reads the pclntab of ef, whose bytes are img (mapped: the table
// is used in place); the error wraps nativeunwind.ErrNoGoPclntab for
// other files. The cost is the table's size.
func openGo(ef *elf.File, img []byte) (*goLines, int64, error) {
	g, err := nativeunwind.ReadGoLines(ef, img)
	if err != nil {
		return nil, 0, err
	}
	var cost int64
	if s := ef.Section(".gopclntab"); s != nil {
		cost = int64(s.Size)
	}
	return &goLines{g}, cost, nil
}

func (l *goLines) lookup(addr uint64) ([]Frame, error) {
	gfs, err := l.g.Lookup(addr)
	if errors.Is(err, nativeunwind.ErrNotGoCode) {
		return nil, nil
	}
	frames := make([]Frame, len(gfs))
	for i, f := range gfs {
		frames[i] = Frame{Function: f.Func.Name, File: f.File, Line: uint32(max(f.Line, 0)), Inlined: f.Inlined}
	}
	return frames, err
}

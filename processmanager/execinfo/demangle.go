package execinfo

import (
	"fmt"
	"strings"

	"github.com/ianlancetaylor/demangle"
)

// DemangleMode says how native symbol names are shown.
type DemangleMode int

const (
	// DemangleSimplified drops parameter lists and template arguments
	// (cfso::cf_so_leaf), as perf and pprof show names by default.
	DemangleSimplified DemangleMode = iota
	// DemangleFull keeps them (cfso::cf_so_leaf(unsigned long)).
	DemangleFull
	// DemangleNone shows names as the symbol table spells them.
	DemangleNone
)

// ParseDemangleMode parses the -demangle flag's value.
func ParseDemangleMode(s string) (DemangleMode, error) {
	switch s {
	case "simplified":
		return DemangleSimplified, nil
	case "full":
		return DemangleFull, nil
	case "none":
		return DemangleNone, nil
	}
	return 0, fmt.Errorf("demangle mode %q: want simplified, full or none", s)
}

// maxDemangled bounds the cache of demangled names.
const maxDemangled = 1 << 16

// maxDemangledLength bounds a demangled name: 2^16 bytes (a template-heavy
// C++ name can expand without end).
var maxDemangledLength = demangle.MaxLength(16)

// Demangler turns mangled C++ (Itanium, as GCC and Clang write it) and
// Rust (legacy and v0) names into the names their sources use, through
// the demangler Go's pprof uses. A name that does not demangle stays as it
// is, counted. It is not safe for concurrent use: its caller serializes
// calls (the process manager calls it under its lock).
type Demangler struct {
	opts  []demangle.Option
	none  bool
	cache map[string]string
	// failures counts names that looked mangled but did not demangle.
	failures uint64
}

// NewDemangler returns a Demangler showing names as mode says.
func NewDemangler(mode DemangleMode) *Demangler {
	d := &Demangler{none: mode == DemangleNone, cache: map[string]string{}}
	d.opts = []demangle.Option{maxDemangledLength}
	if mode == DemangleSimplified {
		d.opts = append(d.opts, demangle.NoParams, demangle.NoEnclosingParams, demangle.NoTemplateParams)
	}
	return d
}

// isMangled says whether name has a prefix of a mangling the demangler
// reads: _Z (Itanium C++, Rust legacy), _R (Rust v0).
func isMangled(name string) bool {
	return strings.HasPrefix(name, "_Z") || strings.HasPrefix(name, "_R")
}

// Name returns the readable name of a symbol and whether it differs from
// the symbol's own.
func (d *Demangler) Name(sym string) (string, bool) {
	if d.none || !isMangled(sym) {
		return sym, false
	}
	if out, ok := d.cache[sym]; ok {
		return out, out != sym
	}
	out, err := demangle.ToString(sym, d.opts...)
	if err != nil || out == "" {
		d.failures++
		out = sym
	}
	if len(d.cache) >= maxDemangled {
		clear(d.cache)
	}
	d.cache[sym] = out
	return out, out != sym
}

// Failures is the number of names that looked mangled but did not demangle.
func (d *Demangler) Failures() uint64 { return d.failures }

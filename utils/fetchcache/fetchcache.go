// Package fetchcache is where the runtime fetch scripts (utils/*fetch)
// unpack what they fetch, as their Go packages find it.
package fetchcache

import (
	"os"
	"path/filepath"
)

// Dir is the directory name under the scripts' cache:
// ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/name.
func Dir(name string) string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "ebpf-profiler", name)
}

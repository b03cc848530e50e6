// Package nodefetch finds the Node.js builds the V8 tests run: the
// machine's own Node 20 and the official builds fetch-node.sh unpacks
// (make test-deps).
package nodefetch

import (
	"fmt"
	"os"
	"path/filepath"
)

// SystemNode is the machine's Node.js 20.
const SystemNode = "/usr/bin/node"

// Fetched lists the major versions fetch-node.sh fetches.
var Fetched = []string{"18", "22", "24"}

// Node returns the node executable of a tested major version ("18", "20",
// …), or an error that says how to install it.
func Node(version string) (string, error) {
	node := SystemNode
	if version != "20" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		node = filepath.Join(cache, "ebpf-profiler", "node-"+version+"-x64", "package", "bin", "node")
	}
	if _, err := os.Stat(node); err != nil {
		return "", fmt.Errorf("no Node.js %s (%w): make test-deps installs it (utils/nodefetch/fetch-node.sh %s)",
			version, err, version)
	}
	return node, nil
}

// Versions lists every tested major version, oldest first.
func Versions() []string { return []string{"18", "20", "22", "24"} }

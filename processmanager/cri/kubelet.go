package cri

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DefaultKubeletRoot is the kubelet's --root-dir.
const DefaultKubeletRoot = "/var/lib/kubelet"

// Bounds of what is read of the kubelet's files.
const (
	maxHostsBytes     = 64 << 10
	maxNamespaceBytes = 256
	maxMountinfoLines = 1 << 16
)

// ErrNoPodDir says the kubelet keeps no directory for the pod here.
var ErrNoPodDir = errors.New("no kubelet pod directory")

// FromKubelet names a container from the kubelet's directory of its pod,
// where no CRI socket answers: the pod's name is the hostname its
// etc-hosts file ends with (the kubelet writes the pod's name there unless
// the pod sets another hostname), its namespace is in the service account
// token's projected volume (volumes/kubernetes.io~projected/*/namespace),
// and the container's name is the directory of the termination log file
// the kubelet mounts into it (containers/<name>/<id>), which the
// container's process's mountinfo (mountinfo) shows. A name that cannot be
// found is left empty.
func FromKubelet(root, podUID string, mountinfo io.Reader) (Names, error) {
	if !isSafeName(podUID) {
		return Names{}, fmt.Errorf("%w: pod uid %q", ErrNoPodDir, podUID)
	}
	dir := filepath.Join(root, "pods", podUID)
	if _, err := os.Stat(dir); err != nil {
		return Names{}, fmt.Errorf("%w: %v", ErrNoPodDir, err)
	}
	n := Names{PodUID: podUID}
	if b, err := readBounded(filepath.Join(dir, "etc-hosts"), maxHostsBytes); err == nil {
		n.Pod = hostnameOf(b)
	}
	tokens, _ := filepath.Glob(filepath.Join(dir, "volumes", "kubernetes.io~projected", "*", "namespace"))
	for _, t := range tokens {
		if b, err := readBounded(t, maxNamespaceBytes); err == nil && isSafeName(strings.TrimSpace(string(b))) {
			n.Namespace = strings.TrimSpace(string(b))
			break
		}
	}
	if mountinfo != nil {
		n.Container = containerFromMountinfo(mountinfo, podUID)
	}
	return n, nil
}

// readBounded reads a regular file of at most max bytes, not following a
// symlink at its end.
func readBounded(path string, max int64) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > max {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, max)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// hostnameOf is the last hostname of an etc-hosts file's last entry.
func hostnameOf(b []byte) string {
	var name string
	for line := range strings.SplitSeq(string(b), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		if f := strings.Fields(line); len(f) >= 2 && isSafeName(f[1]) {
			name = f[1]
		}
	}
	return name
}

// containerFromMountinfo finds, among a process's mounts, the termination
// log the kubelet mounted from .../pods/<uid>/containers/<name>/<id>, and
// returns <name>.
func containerFromMountinfo(r io.Reader, podUID string) string {
	s := bufio.NewScanner(r)
	marker := "/pods/" + podUID + "/containers/"
	for n := 0; s.Scan() && n < maxMountinfoLines; n++ {
		// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT ...; ROOT is the
		// mounted path within its file system.
		f := strings.Fields(s.Text())
		if len(f) < 5 {
			continue
		}
		i := strings.Index(f[3], marker)
		if i < 0 {
			continue
		}
		rest := f[3][i+len(marker):]
		if name, _, ok := strings.Cut(rest, "/"); ok && isSafeName(name) {
			return name
		}
	}
	return ""
}

// isSafeName says whether s can be a Kubernetes name or uid: DNS labels
// and subdomains, at most 253 bytes.
func isSafeName(s string) bool {
	if s == "" || len(s) > 253 || s == "." || s == ".." {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '.' && c != '_' {
			return false
		}
	}
	return true
}

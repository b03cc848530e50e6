package processmanager

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// readProcessInfo describes a process from its /proc directory. Every field
// is best effort: a kernel thread has no executable, a process outside
// containers no container id. comm is the name to fall back on.
func readProcessInfo(procFS string, pid uint32, comm string) *libpf.ProcessInfo {
	info := &libpf.ProcessInfo{PID: libpf.PID(pid)}
	dir := fmt.Sprintf("%s/%d", procFS, pid)
	if exe, err := os.Readlink(dir + "/exe"); err == nil {
		info.ExecutablePath = strings.TrimSuffix(exe, deletedSuffix)
		info.ExecutableName = path.Base(info.ExecutablePath)
	}
	if info.ExecutableName == "" {
		if b, err := os.ReadFile(dir + "/comm"); err == nil {
			info.ExecutableName = strings.TrimSpace(string(b))
		}
	}
	if info.ExecutableName == "" {
		info.ExecutableName = comm
	}
	if f, err := os.Open(dir + "/cgroup"); err == nil {
		info.ContainerID = containerIDFromCgroup(f)
		f.Close()
	}
	return info
}

// containerRuntimePrefixes are what container runtimes and systemd put in
// front of a container id in a cgroup path component, as in
// "docker-<id>.scope" or "cri-containerd-<id>.scope".
var containerRuntimePrefixes = []string{
	"docker-", "cri-containerd-", "containerd-", "crio-", "libpod-",
}

// containerIDFromCgroup finds the container id in a /proc/PID/cgroup file,
// cgroup v1 ("N:controllers:/path") or v2 ("0::/path"). Container runtimes
// name the cgroup after the 64-hex-digit container id, either as a whole path
// component (docker and kubepods under cgroupfs: ".../<id>") or wrapped by
// systemd (".../docker-<id>.scope", "cri-containerd-<id>.scope",
// "crio-<id>.scope", "libpod-<id>.scope"). The deepest such component wins,
// which is the innermost container when containers nest.
func containerIDFromCgroup(r io.Reader) string {
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		// The path is after the second colon; controllers may not contain
		// colons but the path may.
		_, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, cgroupPath, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		if id := containerIDFromPath(cgroupPath); id != "" {
			return id
		}
	}
	return ""
}

func containerIDFromPath(p string) string {
	for p != "" {
		i := strings.LastIndexByte(p, '/')
		component := p[i+1:]
		p = p[:max(i, 0)]
		if id := containerIDFromComponent(component); id != "" {
			return id
		}
	}
	return ""
}

func containerIDFromComponent(c string) string {
	c = strings.TrimSuffix(c, ".scope")
	// crio-conmon-<id> is the container's monitor process, not the container.
	if strings.Contains(c, "conmon") {
		return ""
	}
	for _, prefix := range containerRuntimePrefixes {
		if rest, ok := strings.CutPrefix(c, prefix); ok {
			c = rest
			break
		}
	}
	if isHexID(c) {
		return c
	}
	return ""
}

func isHexID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// procStat is what we need of /proc/PID/stat.
type procStat struct {
	state byte
	// startTime is when the process started, in clock ticks after boot; with
	// the pid it identifies a process across pid reuse.
	startTime uint64
	// cpuTicks is the CPU time its threads used, user and system, in
	// clock ticks.
	cpuTicks uint64
}

// parseProcStat parses /proc/PID/stat: "pid (comm) state ppid ... ", where
// starttime is field 22. comm may contain spaces and parentheses, so fields
// are counted from the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	var st procStat
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return st, fmt.Errorf("stat %q: no comm", b)
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state), so field N is fields[N-3].
	const startTimeField = 22 - 3
	if len(fields) <= startTimeField || len(fields[0]) != 1 {
		return st, fmt.Errorf("stat %q: too few fields", b)
	}
	st.state = fields[0][0]
	var err error
	if st.startTime, err = strconv.ParseUint(fields[startTimeField], 10, 64); err != nil {
		return st, fmt.Errorf("stat: starttime: %w", err)
	}
	// utime and stime, fields 14 and 15.
	for _, f := range fields[14-3 : 15-3+1] {
		ticks, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return st, fmt.Errorf("stat: CPU time: %w", err)
		}
		st.cpuTicks += ticks
	}
	return st, nil
}

// readProcStat reads /proc/PID/stat; a zombie or dead process counts as
// exited since nothing about it can be read anymore.
func readProcStat(procFS string, pid uint32) (procStat, error) {
	p := fmt.Sprintf("%s/%d/stat", procFS, pid)
	b, err := os.ReadFile(p)
	if err != nil {
		return procStat{}, procErr(p, err)
	}
	st, err := parseProcStat(b)
	if err != nil {
		return st, fmt.Errorf("reading %s: %w", p, err)
	}
	if st.state == 'Z' || st.state == 'X' {
		return st, fmt.Errorf("reading %s: %w (state %c)", p, ErrProcessExited, st.state)
	}
	return st, nil
}

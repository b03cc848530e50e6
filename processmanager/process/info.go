package process

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

// Info describes a process from its procfs directory. Every field is best
// effort: a kernel thread has no executable, a process outside containers
// no container id.
func (fs FS) Info(pid uint32, comm string) *libpf.ProcessInfo {
	info := &libpf.ProcessInfo{PID: libpf.PID(pid)}
	dir := fs.dir(pid)
	if exe, err := fs.Executable(pid); err == nil {
		info.ExecutablePath = exe
		info.ExecutableName = path.Base(exe)
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
		info.ContainerID, info.PodUID = containerFromCgroup(f)
		f.Close()
	}
	return info
}

// Executable returns the path of the process's executable, as Info gives
// it.
func (fs FS) Executable(pid uint32) (string, error) {
	exe, err := os.Readlink(fs.dir(pid) + "/exe")
	return strings.TrimSuffix(exe, deletedSuffix), err
}

// containerRuntimePrefixes are what container runtimes and systemd put in
// front of a container id in a cgroup path component, as in
// "docker-<id>.scope" or "cri-containerd-<id>.scope".
var containerRuntimePrefixes = []string{
	"docker-", "cri-containerd-", "containerd-", "crio-", "libpod-",
}

// containerFromCgroup finds the container id and the Kubernetes pod uid
// in a /proc/PID/cgroup file, cgroup v1 ("N:controllers:/path") or v2
// ("0::/path"). Container runtimes name the cgroup after the
// 64-hex-digit container id, either as a whole path component (docker and
// kubepods under cgroupfs: ".../<id>") or wrapped by systemd
// (".../docker-<id>.scope", "cri-containerd-<id>.scope",
// "crio-<id>.scope", "libpod-<id>.scope"). The deepest such component
// wins, which is the innermost container when containers nest. The
// kubelet puts a pod's containers under a cgroup named after the pod's
// uid: "pod<uid>" (cgroupfs driver) or "kubepods-<qos>-pod<uid>.slice"
// with the uid's dashes as underscores (systemd driver); the pod is the
// one above the container (or, with no container, the deepest).
func containerFromCgroup(r io.Reader) (id, podUID string) {
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
		id, podUID = containerFromPath(cgroupPath)
		if id != "" || podUID != "" {
			return id, podUID
		}
	}
	return "", ""
}

func containerFromPath(p string) (id, podUID string) {
	for p != "" && podUID == "" {
		i := strings.LastIndexByte(p, '/')
		component := p[i+1:]
		p = p[:max(i, 0)]
		if id == "" {
			if id = containerIDFromComponent(component); id != "" {
				continue
			}
		}
		podUID = podUIDFromComponent(component)
	}
	return id, podUID
}

// podUIDFromComponent is the pod uid a cgroup path component names, if
// it names one: "pod<uid>" or "kubepods[-<qos>]-pod<uid>.slice".
func podUIDFromComponent(c string) string {
	if rest, ok := strings.CutSuffix(c, ".slice"); ok {
		i := strings.LastIndex(rest, "-pod")
		if !strings.HasPrefix(rest, "kubepods-") || i < 0 {
			return ""
		}
		c = "pod" + strings.ReplaceAll(rest[i+len("-pod"):], "_", "-")
	}
	uid, ok := strings.CutPrefix(c, "pod")
	if ok && isPodUID(uid) {
		return uid
	}
	return ""
}

// isPodUID says whether s is a pod uid: a UUID (8-4-4-4-12 lower-case
// hex digits), or, for a static pod, the 32 hex digits of its manifest's
// hash.
func isPodUID(s string) bool {
	switch len(s) {
	case 32:
		return isHex(s)
	case 36:
		for _, i := range []int{8, 13, 18, 23} {
			if s[i] != '-' {
				return false
			}
		}
		return isHex(s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:])
	}
	return false
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

func isHexID(s string) bool { return len(s) == 64 && isHex(s) }

// isHex says whether s is lower-case hex digits only.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Stat is what the profiler needs of /proc/PID/stat.
type Stat struct {
	State byte
	// StartTime is when the process started, in clock ticks after boot;
	// with the pid it identifies a process across pid reuse.
	StartTime uint64
	// CPUTicks is the CPU time its threads used, user and system, in
	// clock ticks.
	CPUTicks uint64
}

// parseStat parses /proc/PID/stat: "pid (comm) state ppid ... ", where
// starttime is field 22. comm may contain spaces and parentheses, so fields
// are counted from the last ')'.
func parseStat(b []byte) (Stat, error) {
	var st Stat
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
	st.State = fields[0][0]
	var err error
	if st.StartTime, err = strconv.ParseUint(fields[startTimeField], 10, 64); err != nil {
		return st, fmt.Errorf("stat: starttime: %w", err)
	}
	// utime and stime, fields 14 and 15.
	for _, f := range fields[14-3 : 15-3+1] {
		ticks, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return st, fmt.Errorf("stat: CPU time: %w", err)
		}
		st.CPUTicks += ticks
	}
	return st, nil
}

// Stat reads /proc/PID/stat; a zombie or dead process counts as exited
// since nothing about it can be read anymore.
func (fs FS) Stat(pid uint32) (Stat, error) {
	p := fs.dir(pid) + "/stat"
	b, err := os.ReadFile(p)
	if err != nil {
		return Stat{}, procErr(p, err)
	}
	st, err := parseStat(b)
	if err != nil {
		return st, fmt.Errorf("reading %s: %w", p, err)
	}
	if st.State == 'Z' || st.State == 'X' {
		return st, fmt.Errorf("reading %s: %w (state %c)", p, ErrExited, st.State)
	}
	return st, nil
}

// NamespacePID reads the last NSpid of /proc/PID/status: the pid in the
// innermost pid namespace (its only one outside containers).
func (fs FS) NamespacePID(pid uint32) (uint32, error) {
	path := fs.dir(pid) + "/status"
	f, err := os.Open(path)
	if err != nil {
		return 0, procErr(path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			break
		}
		nspid, err := strconv.ParseUint(fields[len(fields)-1], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%s: NSpid %q: %w", path, rest, err)
		}
		return uint32(nspid), nil
	}
	if err := sc.Err(); err != nil {
		return 0, procErr(path, err)
	}
	return 0, fmt.Errorf("%s: no NSpid line", path)
}

package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/collector"
	"github.com/hostprof/ebpf-profiler/utils/testcerts"
	"github.com/hostprof/ebpf-profiler/utils/testenv"
)

// unitPath is the systemd unit operators install.
const unitPath = "support/systemd/ebpf-profiler.service"

// unitSettings reads the [Service] settings of the unit, by key.
func unitSettings(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), unitPath))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			out[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unitCapabilities are the capabilities the unit grants, lower case without
// the CAP_ prefix, as setpriv takes them.
func unitCapabilities(t *testing.T) []string {
	t.Helper()
	s := unitSettings(t)
	ambient, bounding := strings.Fields(s["AmbientCapabilities"]), strings.Fields(s["CapabilityBoundingSet"])
	slices.Sort(ambient)
	slices.Sort(bounding)
	if len(ambient) == 0 || !slices.Equal(ambient, bounding) {
		t.Fatalf("the unit's AmbientCapabilities %v and CapabilityBoundingSet %v should be the same set", ambient, bounding)
	}
	if s["NoNewPrivileges"] != "yes" || s["DynamicUser"] != "yes" {
		t.Fatalf("the unit should run as a dynamic user with NoNewPrivileges=yes: %v", s)
	}
	caps := make([]string, len(ambient))
	for i, c := range ambient {
		caps[i] = strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return caps
}

// nobody is the unprivileged user the least-privilege tests run the daemon
// as, standing in for the unit's dynamic user.
const nobody = "65534"

// setprivArgs runs a command as nobody holding exactly caps, with
// no_new_privs, as the systemd unit does.
func setprivArgs(caps []string) []string {
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	return []string{"setpriv", "--reuid=" + nobody, "--regid=" + nobody, "--clear-groups",
		"--inh-caps=" + set, "--ambient-caps=" + set, "--bounding-set=" + set, "--no-new-privs"}
}

// binaryForNobody copies the profiler where nobody may execute it (test
// temp dirs are root's, mode 0700).
func binaryForNobody(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ebpf-profiler-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(profilerBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ebpf-profiler")
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// TestLeastPrivilege runs the daemon as nobody with only the systemd unit's
// capabilities and checks the export is complete: the workload's stacks,
// its file ids (opened through /proc/PID/map_files) and symbolized kernel
// frames (/proc/kallsyms).
func TestLeastPrivilege(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	caps := unitCapabilities(t)
	t.Logf("unit capabilities: %v", caps)
	c := startCollector(t)
	d := startDaemonVia(t, setprivArgs(caps), binaryForNobody(t),
		"-collection-agent="+c.Addr, "-disable-tls", "-reporter-interval=1s", "-samples-per-second=100")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if uid := statusField(string(status), "Uid"); strings.Fields(uid)[1] != nobody {
		t.Errorf("daemon ran with uids %q, want effective uid %s", uid, nobody)
	}
	t.Logf("daemon's CapEff %s, NoNewPrivs %s", statusField(string(status), "CapEff"),
		statusField(string(status), "NoNewPrivs"))
	pid, pds := exportWorkload(t, c, d, workloadDuration)
	log, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if w := linesWith(string(log), "Without CAP_"); w != "" {
		t.Errorf("the unit's capabilities left the daemon short of some:\n%s", w)
	}
	checkExportedContent(t, pds, pid)
}

func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestMissingCapability drops one capability of the unit's at a time: a
// daemon without one it cannot sample without refuses to start and names
// it; one without a capability that completes the output starts and says
// what it will miss.
func TestMissingCapability(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	caps := unitCapabilities(t)
	bin := binaryForNobody(t)
	outDir := filepath.Join(filepath.Dir(bin), "pprof")
	if err := os.Mkdir(outDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(outDir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		drop string
		// fatal: the daemon exits 1.
		fatal bool
		want  string
	}{
		{"bpf", true, "lacks CAP_BPF:"},
		{"perfmon", true, "lacks CAP_PERFMON:"},
		{"sys_ptrace", false, "Without CAP_SYS_PTRACE user frames cannot be attributed"},
		{"dac_read_search", false, "Without CAP_DAC_READ_SEARCH or CAP_DAC_OVERRIDE files other users"},
		{"checkpoint_restore", false, "Without CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN deleted"},
		{"syslog", false, "Without CAP_SYSLOG kernel frames cannot be symbolized"},
	}
	for _, tt := range tests {
		t.Run(tt.drop, func(t *testing.T) {
			if !slices.Contains(caps, tt.drop) {
				t.Fatalf("the unit does not grant %s", tt.drop)
			}
			kept := slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return c == tt.drop })
			argv := append(setprivArgs(kept), bin, "-output-dir="+outDir)
			// The daemon runs until a startup error or the timeout's
			// SIGINT, after which it exits 0.
			cmd := exec.Command("timeout", append([]string{"--preserve-status", "-s", "INT", "3"}, argv...)...)
			out, err := cmd.CombinedOutput()
			code := testenv.ExitCode(err)
			if tt.fatal && code != 1 || !tt.fatal && code != 0 {
				t.Errorf("exit code %d (fatal %v)", code, tt.fatal)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, out)
			}
			// Only what was dropped is reported.
			if n := strings.Count(string(out), "Without CAP_") + strings.Count(string(out), "lacks CAP_"); n != 1 {
				t.Errorf("%d capability messages, want 1:\n%s", n, out)
			}
		})
	}
}

// TestSystemdUnitVerifies checks the unit with systemd-analyze verify,
// failing on any warning (an unknown or misspelled setting is only a
// warning to systemd), and logs systemd's exposure rating of it.
func TestSystemdUnitVerifies(t *testing.T) {
	requireE2E(t)
	unit, err := os.ReadFile(filepath.Join(repoRoot(t), unitPath))
	if err != nil {
		t.Fatal(err)
	}
	// verify checks that ExecStart's binary exists: point it at ours.
	bin := profilerBinary(t)
	text := strings.Replace(string(unit), "ExecStart=/usr/local/bin/ebpf-profiler", "ExecStart="+bin, 1)
	if text == string(unit) {
		t.Fatal("the unit's ExecStart is not /usr/local/bin/ebpf-profiler")
	}
	path := filepath.Join(t.TempDir(), "ebpf-profiler.service")
	writeFile(t, path, text)
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	sec, err := exec.Command("systemd-analyze", "security", "--offline=true", path).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, sec)
	}
	t.Logf("%s", linesWith(string(sec), "Overall exposure level"))
}

// TestMutualTLSToCollector exports to the real Collector over mutual TLS
// with a self-signed CA: -tls-ca-file verifies the collector, and
// -tls-cert-file/-tls-key-file are the client certificate it requires.
// The CA and certificates come from the environment, as a service's
// EnvironmentFile would give them.
func TestMutualTLSToCollector(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "e2e test CA")
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		writeFile(t, path, string(data))
		return path
	}
	serverCert, serverKey := ca.Server(t)
	clientCert, clientKey := ca.Client(t, "ebpf-profiler")
	caFile := write("ca.pem", ca.PEM)
	c := startCollectorTLS(t, &collector.TLS{
		CertFile: write("server.pem", serverCert), KeyFile: write("server-key.pem", serverKey), ClientCAFile: caFile,
	})
	t.Setenv("EBPF_PROFILER_TLS_CA_FILE", caFile)
	t.Setenv("EBPF_PROFILER_TLS_CERT_FILE", write("client.pem", clientCert))
	t.Setenv("EBPF_PROFILER_TLS_KEY_FILE", write("client-key.pem", clientKey))
	d := startDaemon(t, "-collection-agent="+c.Addr, "-reporter-interval=1s", "-samples-per-second=100")
	exportWorkload(t, c, d, 3*time.Second)
}

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
	"github.com/hostprof/ebpf-profiler/utils/testagent/applog"
)

// The APM correlation test runs the test agent's application
// (utils/testagent) under the daemon, in a root of its own as in a
// container, next to applications whose process storage is hostile.

// appRun is a running test application; its stdout is kept.
type appRun struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out bytes.Buffer
}

func (a *appRun) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.Write(p)
}

func (a *appRun) output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.String()
}

// appRoot is a directory set up as a process's root: the host's /usr
// (bind-mounted in a private mount namespace when the app starts), the
// merged-/usr symlinks, /tmp, /var/run as an absolute symlink to /tmp (as
// in Debian images), and the test agent and application in /opt.
type appRoot struct {
	dir string
	// binds are the host directories bind-mounted at the same place.
	binds []string
}

func newAppRoot(t *testing.T, agentDir string) *appRoot {
	t.Helper()
	r := &appRoot{dir: filepath.Join(t.TempDir(), "root")}
	for _, d := range []string{"opt", "var", "tmp", "usr"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(r.dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	r.binds = append(r.binds, "usr")
	for _, d := range []string{"bin", "lib", "lib64", "sbin"} {
		target, err := os.Readlink("/" + d)
		switch {
		case err == nil:
			if err := os.Symlink(target, filepath.Join(r.dir, d)); err != nil {
				t.Fatal(err)
			}
		case !os.IsNotExist(err):
			if err := os.MkdirAll(filepath.Join(r.dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
			r.binds = append(r.binds, d)
		}
	}
	if err := os.Symlink("/tmp", filepath.Join(r.dir, "var", "run")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"app", agentName()} {
		b, err := os.ReadFile(filepath.Join(agentDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, "opt", name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func agentName() string {
	out, err := exec.Command("uname", "-m").Output()
	if err != nil {
		panic(err)
	}
	return "elastic-jvmti-linux-" + strings.TrimSpace(string(out)) + ".so"
}

// start runs the application in the root, as user (e.g. "65534:65534") if
// not empty: sh mounts /usr in a new mount namespace and execs chroot,
// which execs the application, so the pid is the application's.
func (r *appRoot) start(t *testing.T, user string, args ...string) *appRun {
	t.Helper()
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range r.binds {
		fmt.Fprintf(&script, "mount --bind /%s %q\n", d, filepath.Join(r.dir, d))
	}
	script.WriteString(`exec chroot "$@"` + "\n")
	chrootArgs := []string{r.dir}
	if user != "" {
		chrootArgs = []string{"--userspec=" + user, r.dir}
	}
	chrootArgs = append(chrootArgs, "/opt/app")
	cmdArgs := append([]string{"-m", "--propagation", "private", "sh", "-c", script.String(), "sh"},
		append(chrootArgs, args...)...)
	a := &appRun{}
	a.cmd = exec.Command("unshare", cmdArgs...)
	a.cmd.Stdout, a.cmd.Stderr = a, os.Stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			_ = a.cmd.Process.Kill()
			_ = a.cmd.Wait()
		}
	})
	return a
}

// buildTestAgent builds utils/testagent into a temp dir.
func buildTestAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("make", "-C", filepath.Join(repoRoot(t), "utils", "testagent"), "OUT="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the test agent: %v\n%s", err, out)
	}
	return dir
}

// parseAppLog parses a test application's output.
func parseAppLog(t *testing.T, out string) *applog.Log {
	t.Helper()
	l, err := applog.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// linkedSample is one exported sample of the application.
type linkedSample struct {
	tid          int
	at           uint64
	traceID      [16]byte
	spanID       [8]byte
	linked       bool
	stackTraceID string
}

// appSamples returns the exported samples of process pid, one per
// timestamp, and the host.id of its resource.
func appSamples(t *testing.T, pds []*profilespb.ProfilesData, pid int) (samples []linkedSample, hostID string) {
	t.Helper()
	for _, pd := range pds {
		if err := collector.ResolveAttributeRefs(pd); err != nil {
			t.Fatal(err)
		}
		d := pd.GetDictionary()
		for _, rp := range pd.GetResourceProfiles() {
			if p, _ := resourceIntAttr(rp, "process.pid"); int(p) != pid {
				continue
			}
			hostID = collector.ResourceAttr(rp, "host.id")
			if svc := collector.ResourceAttr(rp, "service.name"); svc != "testagent-svc" && svc != "" {
				t.Errorf("service.name %q", svc)
			}
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					for _, s := range p.GetSamples() {
						attrs := dictAttrs(d, s.GetAttributeIndices())
						ls := linkedSample{tid: int(attrs["thread.id"].GetIntValue()),
							stackTraceID: attrs["elastic.profiler_stack_trace_id"].GetStringValue()}
						if i := s.GetLinkIndex(); i != 0 {
							link := d.GetLinkTable()[i]
							ls.linked = true
							copy(ls.traceID[:], link.GetTraceId())
							copy(ls.spanID[:], link.GetSpanId())
						}
						for _, ts := range s.GetTimestampsUnixNano() {
							ls.at = ts
							samples = append(samples, ls)
						}
					}
				}
			}
		}
	}
	return samples, hostID
}

// correlation is a decoded correlation message.
type correlation struct {
	at            uint64
	traceID       [16]byte
	transactionID [8]byte
	stackTraceID  string
	count         int
}

// decodeMessages splits an agent's messages into registrations (samples
// delay, host id) and correlations.
func decodeMessages(t *testing.T, msgs []applog.Message) (delays []time.Duration, hostIDs []string, corr []correlation) {
	t.Helper()
	for _, m := range msgs {
		b := m.Data
		if len(b) < 4 {
			t.Fatalf("message of %d bytes", len(b))
		}
		typ, minor := binary.NativeEndian.Uint16(b), binary.NativeEndian.Uint16(b[2:])
		switch {
		case typ == 2 && minor == 1 && len(b) >= 12:
			n := binary.NativeEndian.Uint32(b[8:])
			if int(n) != len(b)-12 {
				t.Fatalf("registration with a host id of %d bytes in %d", n, len(b))
			}
			delays = append(delays, time.Duration(binary.NativeEndian.Uint32(b[4:]))*time.Millisecond)
			hostIDs = append(hostIDs, string(b[12:]))
		case typ == 1 && minor == 1 && len(b) == 46:
			c := correlation{at: m.At, count: int(binary.NativeEndian.Uint16(b[44:]))}
			copy(c.traceID[:], b[4:20])
			copy(c.transactionID[:], b[20:28])
			c.stackTraceID = base64.RawURLEncoding.EncodeToString(b[28:44])
			corr = append(corr, c)
		default:
			t.Fatalf("unexpected message type %d.%d of %d bytes", typ, minor, len(b))
		}
	}
	return delays, hostIDs, corr
}

// hostileCase is an application whose agent publishes a socket path the
// daemon must not use.
type hostileCase struct {
	name string
	// published is the socket path in the storage; empty with absurd.
	published string
	absurd    bool
	user      string
	// refusal is the reason the daemon logs; empty when the path is not
	// refused but never resolves (an absolute symlink, followed inside
	// the root) or the storage is rejected.
	refusal string
}

var hostileCases = []hostileCase{
	{name: "dotdot", published: "/tmp/../../outside.sock", refusal: "path with .."},
	{name: "escape", published: "/tmp/escape.sock", refusal: "symlink leaving the process's root"},
	{name: "hostpath", published: "/tmp/hostpath.sock"},
	{name: "notsocket", published: "/tmp/file", refusal: "not a socket"},
	{name: "owner", published: "/tmp/rootowned.sock", user: "65534:65534",
		refusal: "socket not owned by the process's user"},
	{name: "absurd", absurd: true},
}

// listenGram binds a datagram socket and collects what it receives.
func listenGram(t *testing.T, path string) func() int {
	t.Helper()
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	n := 0
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := l.Read(buf); err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// Timeline of the correlated application: it burns CPU before loading
// the agent, so the daemon knows it before the library appears, and
// publishes its storage well after the daemon first looks.
const (
	apmLoadAfter    = 1.5
	apmPublishAfter = 3.5
	apmSeconds      = 7
	hostileSeconds  = 3
	// stampSlack allows for the time a sample's timestamp and the
	// application's clock readings around set_trace differ by.
	stampSlack = 2 * time.Millisecond
)

func TestAPMCorrelation(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	for _, tool := range []string{"unshare", "chroot", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: %v", tool, err)
		}
	}
	agentDir := buildTestAgent(t)
	c := startCollector(t)
	d := startDaemon(t, "-collection-agent="+c.Addr, "-disable-tls", "-reporter-interval=1s",
		"-samples-per-second=100", "-verbose")

	// Hostile applications first, all at once in one root.
	root := newAppRoot(t, agentDir)
	outside := listenGram(t, filepath.Join(filepath.Dir(root.dir), "outside.sock"))
	rootOwned := listenGram(t, filepath.Join(root.dir, "tmp", "rootowned.sock"))
	if err := os.Symlink("../../outside.sock", filepath.Join(root.dir, "tmp", "escape.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(filepath.Dir(root.dir), "outside.sock"),
		filepath.Join(root.dir, "tmp", "hostpath.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root.dir, "tmp", "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	hostile := make([]*appRun, len(hostileCases))
	for i, hc := range hostileCases {
		args := []string{"/opt/" + agentName(), "/tmp/" + hc.name + "-own.sock", strconv.Itoa(hostileSeconds)}
		if hc.absurd {
			args = append([]string{"-a"}, args...)
		} else {
			args = append([]string{"-P", hc.published}, args...)
		}
		hostile[i] = root.start(t, hc.user, args...)
	}
	for i, a := range hostile {
		if err := a.cmd.Wait(); err != nil {
			t.Fatalf("hostile app %s: %v", hostileCases[i].name, err)
		}
	}

	// The correlated application, in a root of its own, publishing its
	// socket through /var/run, an absolute symlink inside that root.
	appDir := newAppRoot(t, agentDir)
	app := appDir.start(t, "", "-l", fmt.Sprint(apmLoadAfter), "-p", fmt.Sprint(apmPublishAfter),
		"-P", "/var/run/apm.sock", "/opt/"+agentName(), "/tmp/apm.sock", strconv.Itoa(apmSeconds))
	if err := app.cmd.Wait(); err != nil {
		t.Fatalf("app: %v", err)
	}
	hwm := daemonPeakRSS(t, d.Cmd.Process.Pid)
	time.Sleep(profilerDrainWait)
	d.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("hostile", func(t *testing.T) {
		checkHostile(t, hostile, string(log), outside(), rootOwned(), hwm)
	})
	pds, err := collector.ReadOutput(c.OutPath, false)
	if err != nil {
		t.Fatal(err)
	}
	checkCorrelation(t, parseAppLog(t, app.output()), pds, app.cmd.Process.Pid)
}

// daemonPeakRSS is the daemon's peak resident memory (VmHWM).
func daemonPeakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	kb, err := strconv.ParseInt(strings.TrimSuffix(statusField(string(b), "VmHWM"), " kB"), 10, 64)
	if err != nil {
		t.Fatalf("the daemon's VmHWM: %v", err)
	}
	return kb << 10
}

// maxDaemonRSS bounds the daemon's peak memory in this test: an allocation
// of the 4 GiB the absurd storage claims would exceed it.
const maxDaemonRSS = 512 << 20

func checkHostile(t *testing.T, apps []*appRun, log string, outside, rootOwned int, hwm int64) {
	for i, hc := range hostileCases {
		pid := apps[i].cmd.Process.Pid
		if l := parseAppLog(t, apps[i].output()); len(l.Msgs) != 0 {
			t.Errorf("%s: its own socket received %d messages", hc.name, len(l.Msgs))
		}
		prefix := fmt.Sprintf("process %d: refusing APM socket", pid)
		refusals := 0
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, prefix) {
				refusals++
				if hc.refusal == "" || !strings.Contains(line, hc.refusal) {
					t.Errorf("%s: %s", hc.name, line)
				}
			}
		}
		if hc.refusal != "" && refusals != 1 {
			t.Errorf("%s: %d refusals logged for pid %d, want 1; its log lines:\n%s", hc.name, refusals, pid,
				linesWith(log, fmt.Sprintf("process %d:", pid)))
		}
		if hc.absurd && !strings.Contains(log, fmt.Sprintf("process %d: APM agent not readable yet", pid)) {
			t.Errorf("absurd: no rejected storage logged for pid %d", pid)
		}
	}
	if outside != 0 || rootOwned != 0 {
		t.Errorf("sockets the hostile paths aimed at received %d (outside the root) and %d (root's) datagrams",
			outside, rootOwned)
	}
	t.Logf("daemon peak RSS %.1f MiB", float64(hwm)/(1<<20))
	if hwm > maxDaemonRSS {
		t.Errorf("daemon peak RSS %d MiB, want at most %d", hwm>>20, maxDaemonRSS>>20)
	}
}

func checkCorrelation(t *testing.T, l *applog.Log, pds []*profilespb.ProfilesData, pid int) {
	samples, hostID := appSamples(t, pds, pid)
	delays, hostIDs, corr := decodeMessages(t, l.Msgs)
	t.Logf("app: %d transactions, %d messages; %d samples exported", len(l.Txs), len(l.Msgs), len(samples))

	// Registration: once, with our host id, after the storage was published.
	if len(hostIDs) != 1 || hostID == "" || hostIDs[0] != hostID {
		t.Fatalf("registrations with host ids %q, want one with the exported host.id %q", hostIDs, hostID)
	}
	if l.Msgs[0].Data[0] != 2 || l.Msgs[0].At < l.Published {
		t.Errorf("the first message is not the registration, or it came before the storage was published")
	}
	t.Logf("registration %v after the storage was published (%v after the agent was loaded); samples-delay %v",
		time.Duration(l.Msgs[0].At-l.Published), time.Duration(l.Msgs[0].At-l.Loaded), delays[0])

	// Every linked sample lies in a transaction of its thread and links to
	// it; no sample outside one is linked.
	byTx := map[[8]byte]*applog.Tx{}
	bySpan := map[[8]byte]*applog.Tx{}
	for i := range l.Txs {
		byTx[l.Txs[i].TransactionID] = &l.Txs[i]
		bySpan[l.Txs[i].SpanID] = &l.Txs[i]
	}
	slack := uint64(stampSlack)
	var firstLinked uint64
	exported := map[[8]byte]map[string][]uint64{} // transaction -> stack id -> sample times
	for _, s := range samples {
		for _, w := range l.Idles {
			if w.Inside(s.tid, s.at, slack) && s.linked {
				t.Errorf("sample at %d of thread %d, outside any trace, links to %x", s.at, s.tid, s.spanID)
			}
		}
		if !s.linked {
			continue
		}
		w := bySpan[s.spanID]
		switch {
		case w == nil || w.TraceID != s.traceID:
			t.Errorf("sample links to an unknown trace %x/%x", s.traceID, s.spanID)
			continue
		case w.TID != s.tid || s.at+slack < w.Start || s.at > w.End+slack:
			t.Errorf("sample of thread %d at %d links to the transaction of thread %d in [%d, %d]",
				s.tid, s.at, w.TID, w.Start, w.End)
		case s.stackTraceID == "":
			t.Errorf("linked sample without a stack-trace id")
		}
		if firstLinked == 0 || s.at < firstLinked {
			firstLinked = s.at
		}
		if exported[w.TransactionID] == nil {
			exported[w.TransactionID] = map[string][]uint64{}
		}
		exported[w.TransactionID][s.stackTraceID] = append(exported[w.TransactionID][s.stackTraceID], s.at)
	}
	if firstLinked == 0 {
		t.Fatal("no exported sample links to a trace")
	}
	t.Logf("first linked sample %v after the agent was loaded (the daemon knew the process before)",
		time.Duration(firstLinked-l.Loaded))
	if time.Duration(firstLinked-l.Loaded) > 5*time.Second {
		t.Errorf("the agent loaded into a known process was found after %v, want within 5s",
			time.Duration(firstLinked-l.Loaded))
	}

	// Correlation messages carry the stack-trace ids of the linked samples,
	// with the same counts.
	sent := map[[8]byte]map[string]int{}
	for _, c := range corr {
		w := byTx[c.transactionID]
		if w == nil || w.TraceID != c.traceID {
			t.Errorf("correlation for an unknown transaction %x/%x", c.traceID, c.transactionID)
			continue
		}
		if sent[c.transactionID] == nil {
			sent[c.transactionID] = map[string]int{}
		}
		sent[c.transactionID][c.stackTraceID] += c.count
	}
	threads := map[int]bool{}
	for tx, stacks := range exported {
		threads[byTx[tx].TID] = true
		for id, times := range stacks {
			if sent[tx][id] != len(times) {
				t.Errorf("transaction %x, stack %s: %d samples exported, %d in correlation messages",
					tx, id, len(times), sent[tx][id])
			}
		}
	}
	for tx, stacks := range sent {
		for id, n := range stacks {
			if len(exported[tx][id]) == 0 {
				t.Errorf("transaction %x, stack %s: %d samples in correlation messages, none exported", tx, id, n)
			}
		}
	}
	if len(threads) != 2 {
		t.Errorf("correlated transactions of %d threads, want both workers", len(threads))
	}

	// Per transaction, the counts sent match the profiler's samples of the
	// thread in the transaction's window, for transactions that began
	// after the agent was found.
	var checked, within int
	for _, w := range l.Txs {
		if w.Start < firstLinked {
			continue
		}
		inWindow := 0
		for _, s := range samples {
			if s.tid == w.TID && s.at+slack >= w.Start && s.at <= w.End+slack {
				inWindow++
			}
		}
		n := 0
		for _, c := range sent[w.TransactionID] {
			n += c
		}
		checked++
		if diff := n - inWindow; diff*10 <= inWindow && -diff*10 <= inWindow {
			within++
		} else {
			t.Errorf("transaction %x of thread %d: %d samples correlated, %d samples of the thread in its window",
				w.TransactionID, w.TID, n, inWindow)
		}
	}
	t.Logf("%d of %d transactions within ±10%% of the thread's samples", within, checked)
	if checked < 10 {
		t.Errorf("only %d transactions began after the agent was found", checked)
	}

	// Latency from sample to the message that counted it: messages of one
	// (transaction, stack) count that stack's samples in time order. The
	// samples taken before the agent's registration waited for its storage
	// and are left out.
	registered := l.Msgs[0].At
	var lat []time.Duration
	for tx, stacks := range exported {
		for id, times := range stacks {
			slices.Sort(times)
			i := 0
			for _, c := range corr {
				if c.transactionID != tx || c.stackTraceID != id {
					continue
				}
				for k := 0; k < c.count && i < len(times); k++ {
					if times[i] > registered {
						lat = append(lat, time.Duration(int64(c.at)-int64(times[i])))
					}
					i++
				}
			}
		}
	}
	if len(lat) == 0 {
		t.Fatal("no latencies")
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("sample to correlation message: p50 %v, p99 %v, max %v over %d samples; samples-delay announced %v",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), len(lat), delays[0])
	if p99 > delays[0]*3/2 {
		t.Errorf("p99 latency %v, far beyond the announced %v", p99, delays[0])
	}
}

// linesWith returns the lines of log that contain s.
func linesWith(log, s string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

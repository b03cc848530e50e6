package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// logFields returns the integer fields key=N of the daemon's last log line
// with msg.
func logFields(t *testing.T, path, msg string) map[string]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `msg="`+msg+`"`) || strings.Contains(sc.Text(), "msg="+msg+" ") {
			last = sc.Text()
		}
	}
	if last == "" {
		t.Fatalf("the daemon logged no %q", msg)
	}
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`(\w+)=(\d+)(\s|$)`).FindAllStringSubmatch(last, -1) {
		out[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
	}
	return out
}

// spoolPeak is the most the status lines said the spool held (requests,
// MiB).
func spoolPeak(t *testing.T, path string) (int64, float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var reqs int64
	var mib float64
	for _, m := range regexp.MustCompile(`held=(\d+) \(([\d.]+) MiB\)`).FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		f, _ := strconv.ParseFloat(m[2], 64)
		reqs, mib = max(reqs, n), max(mib, f)
	}
	return reqs, mib
}

// samplesPerSecond counts pid's samples by the second of their timestamps,
// and says whether any timestamp of a thread came twice (a request
// delivered twice).
func samplesPerSecond(t *testing.T, pds []*profilespb.ProfilesData, pid int) (map[int64]int, bool) {
	t.Helper()
	perSec := map[int64]int{}
	type stamp struct {
		thread string
		ts     uint64
	}
	seen := map[stamp]string{}
	dup := false
	for _, pd := range pds {
		if err := collector.ResolveAttributeRefs(pd); err != nil {
			t.Fatal(err)
		}
		d := pd.GetDictionary()
		for _, rp := range pd.GetResourceProfiles() {
			if p, _ := resourceIntAttr(rp, "process.pid"); p != int64(pid) {
				continue
			}
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					for _, s := range p.GetSamples() {
						tid := dictAttrs(d, s.GetAttributeIndices())["thread.id"].String()
						for _, ts := range s.GetTimestampsUnixNano() {
							perSec[int64(ts/1e9)]++
							k := stamp{tid, ts}
							where := fmt.Sprintf("profile %d+%d sample %v", p.GetTimeUnixNano(), p.GetDurationNano(), s)
							if first, ok := seen[k]; ok {
								t.Logf("thread %s: timestamp %d twice: %s; %s", tid, ts, first, where)
								dup = true
							}
							seen[k] = where
						}
					}
				}
			}
		}
	}
	return perSec, dup
}

// TestCollectorOutage stops the collector for a while, as a redeploy
// would, while the daemon profiles a busy workload, then starts it again
// on the same address: every sample the daemon reported reaches it, once,
// the outage's seconds included, and delivery resumes within a reporter
// interval or two of its return. The spool's bound is tested apart
// (reporter/spool), as is the ten-minute outage (make soak).
func TestCollectorOutage(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	const (
		before, outage, after = 5 * time.Second, 40 * time.Second, 6 * time.Second
		interval              = time.Second
	)
	c := startCollector(t)
	d := startDaemon(t,
		"-collection-agent="+c.Addr,
		"-disable-tls",
		"-reporter-interval="+interval.String(),
		"-samples-per-second=100",
		"-monitor-interval=1s",
		"-spool-dir="+filepath.Join(t.TempDir(), "spool"),
	)
	workload := startWorkload(t, before+outage+after)
	start := time.Now()
	time.Sleep(before)
	outputs := []string{c.OutPath}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	time.Sleep(outage)
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	outputs = append(outputs, c.OutPath)
	if err := workload.Wait(); err != nil {
		t.Fatalf("workload: %v", err)
	}
	end := time.Now()
	// The spool drains at 1 MiB/s: a few seconds.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if b, _ := os.ReadFile(d.LogPath); strings.Contains(string(b), "held=0 (0.0 MiB)") &&
			strings.LastIndex(string(b), "held=0 (0.0 MiB)") > strings.LastIndex(string(b), "OTLP export recovered") {
			break
		}
	}
	d.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}

	var pds []*profilespb.ProfilesData
	for _, out := range outputs {
		got, err := collector.ReadOutput(out, false)
		if err != nil {
			t.Fatal(err)
		}
		pds = append(pds, got...)
	}
	sum := logFields(t, d.LogPath, "Stopped")
	got := statsOf(pds)
	reqs, mib := spoolPeak(t, d.LogPath)
	t.Logf("daemon: samples_reported=%d samples_exported=%d requests_spooled=%d requests_replayed=%d requests_dropped=%d; spool peak %d requests, %.1f MiB",
		sum["samples_reported"], sum["samples_exported"], sum["requests_spooled"], sum["requests_replayed"], sum["requests_dropped"], reqs, mib)
	t.Logf("collector received: %s", got)
	if sum["requests_spooled"] == 0 {
		t.Error("nothing went through the spool")
	}
	if sum["samples_reported"] == 0 || got.Samples != sum["samples_reported"] || sum["samples_exported"] != sum["samples_reported"] {
		t.Errorf("the daemon reported %d samples and exported %d; the collector received %d (all three must match)",
			sum["samples_reported"], sum["samples_exported"], got.Samples)
	}
	perSec, dup := samplesPerSecond(t, pds, workload.Process.Pid)
	if dup {
		t.Error("a sample came twice")
	}
	var thin []string
	// The workload is busy all the time: about 100 samples a second.
	for s := start.Unix() + 1; s < end.Unix()-1; s++ {
		if perSec[s] < 50 {
			thin = append(thin, time.Unix(s, 0).Sub(start).Round(time.Second).String()+":"+strconv.Itoa(perSec[s]))
		}
	}
	if len(thin) > 0 {
		t.Errorf("seconds of the run (from its start: samples) with under half the workload's samples: %v (collector down %v-%v)",
			thin, down.Sub(start).Round(time.Second), back.Sub(start).Round(time.Second))
	}
	// Delivery resumed: the daemon's "OTLP export recovered" line.
	if rec := recoveredAt(t, d.LogPath); rec.IsZero() {
		t.Error("the daemon never logged its recovery")
	} else {
		t.Logf("delivery resumed %v after the collector's return", rec.Sub(back).Round(100*time.Millisecond))
		if rec.Sub(back) > 2*interval+time.Second {
			t.Errorf("delivery resumed %v after the collector's return (interval %v)", rec.Sub(back), interval)
		}
	}
}

// recoveredAt is the time of the daemon's "OTLP export recovered" line.
func recoveredAt(t *testing.T, path string) time.Time {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, "OTLP export recovered") {
			continue
		}
		if m := regexp.MustCompile(`time="([^"]+)"`).FindStringSubmatch(line); m != nil {
			ts, _ := time.Parse(time.RFC3339Nano, m[1])
			return ts
		}
	}
	return time.Time{}
}

// TestRestartDuringOutage stops the daemon (SIGTERM) while the collector
// is down, then starts a new one with the same spool once the collector is
// back: the new daemon delivers what the old one reported, with its own.
func TestRestartDuringOutage(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	c := startCollector(t)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	spool := filepath.Join(t.TempDir(), "spool")
	args := []string{"-collection-agent=" + c.Addr, "-disable-tls", "-reporter-interval=1s",
		"-samples-per-second=100", "-spool-dir=" + spool}
	workload := startWorkload(t, 20*time.Second)
	defer workload.Process.Kill()
	old := startDaemon(t, args...)
	time.Sleep(5 * time.Second)
	old.Stop(t, profilerStopTimeout)
	oldSum := logFields(t, old.LogPath, "Stopped")
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, args...)
	d.WaitForLog(t, "exported profiles", 30*time.Second)
	time.Sleep(3 * time.Second)
	d.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	sum := logFields(t, d.LogPath, "Stopped")
	pds, err := collector.ReadOutput(c.OutPath, false)
	if err != nil {
		t.Fatal(err)
	}
	got := statsOf(pds)
	t.Logf("old daemon: samples_reported=%d samples_exported=%d requests_spooled=%d; new daemon: samples_reported=%d samples_exported=%d requests_replayed=%d; collector: %s",
		oldSum["samples_reported"], oldSum["samples_exported"], oldSum["requests_spooled"],
		sum["samples_reported"], sum["samples_exported"], sum["requests_replayed"], got)
	if oldSum["samples_reported"] == 0 || oldSum["samples_exported"] != 0 || oldSum["requests_spooled"] == 0 {
		t.Errorf("the old daemon reported %d samples, exported %d, spooled %d requests: want some reported, all spooled",
			oldSum["samples_reported"], oldSum["samples_exported"], oldSum["requests_spooled"])
	}
	if want := oldSum["samples_reported"] + sum["samples_reported"]; got.Samples != want || sum["requests_replayed"] != oldSum["requests_spooled"] {
		t.Errorf("the collector received %d samples, the two daemons reported %d; %d of %d spooled requests replayed",
			got.Samples, want, sum["requests_replayed"], oldSum["requests_spooled"])
	}
}

// TestSpoolTooSmall: with a spool far too small for the outage (10 KiB),
// its oldest requests are dropped, and the daemon's count of the samples
// lost in it is exact: reported = received + lost.
func TestSpoolTooSmall(t *testing.T) {
	requireE2E(t)
	requireRoot(t)
	c := startCollector(t)
	d := startDaemon(t, "-collection-agent="+c.Addr, "-disable-tls", "-reporter-interval=1s",
		"-samples-per-second=100", "-spool-dir="+filepath.Join(t.TempDir(), "spool"), "-spool-mb=0.01")
	workload := startWorkload(t, 30*time.Second)
	defer workload.Process.Kill()
	time.Sleep(2 * time.Second)
	outputs := []string{c.OutPath}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Second)
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, c.OutPath)
	time.Sleep(5 * time.Second)
	d.Stop(t, profilerStopTimeout)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	var received int64
	for _, out := range outputs {
		pds, err := collector.ReadOutput(out, false)
		if err != nil {
			t.Fatal(err)
		}
		received += statsOf(pds).Samples
	}
	sum := logFields(t, d.LogPath, "Stopped")
	t.Logf("daemon: samples_reported=%d samples_exported=%d samples_lost_in_spool=%d requests_spooled=%d requests_replayed=%d requests_dropped=%d; collector received %d",
		sum["samples_reported"], sum["samples_exported"], sum["samples_lost_in_spool"], sum["requests_spooled"],
		sum["requests_replayed"], sum["requests_dropped"], received)
	if sum["samples_lost_in_spool"] == 0 || sum["requests_dropped"] == 0 {
		t.Error("a 10 KiB spool dropped nothing in a 20 s outage")
	}
	if received+sum["samples_lost_in_spool"] != sum["samples_reported"] || received != sum["samples_exported"] {
		t.Errorf("received %d + lost %d != reported %d (exported %d)", received, sum["samples_lost_in_spool"],
			sum["samples_reported"], sum["samples_exported"])
	}
}

package integration

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProcessContext runs two writers of the OpenTelemetry process context
// (OTEP 4719), one in C and one in Go, written from the OTEP: each
// publishes service.version 1.0, spins, publishes 2.0 (the update
// protocol) and spins again. The process manager finds the context's
// mapping with the process's maps and reads it again when its
// published-at changes (each check of a sampled process, every 3 s): the
// samples carry the service's resource from the first with it, 1.0 before
// the update and 2.0 from at most a check interval after it.
func TestProcessContext(t *testing.T) {
	requireRoot(t)
	cbin := buildWorkload(t, "otelctx", "-O2")
	gobin, _ := buildGo(t, "otelctxgo")
	skipIfPreparing(t)
	s := startSession(t, testHz)
	const checkInterval = 3 * time.Second
	for _, w := range []struct{ name, bin, service, before, after, language string }{
		{"C", cbin, "checkout", "before_update", "after_update", "cpp"},
		{"Go", gobin, "billing", "main.beforeUpdate", "main.afterUpdate", "go"},
	} {
		t.Run(w.name, func(t *testing.T) {
			cmd := exec.Command(w.bin, "8", "3", w.service)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", w.bin, err)
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(string(out), "updated ")), 10, 64)
			if err != nil {
				t.Fatalf("output %q: %v", out, err)
			}
			updated := time.Unix(0, ns)
			s.waitExited(t, cmd.Process.Pid)
			samples := s.rec.ofPID(cmd.Process.Pid)
			first := slices.IndexFunc(samples, func(smp sample) bool { return smp.meta.Process.ServiceName == w.service })
			if first < 0 || first > maxWarmupSamples {
				t.Fatalf("%d samples before the first of service %s (-1: none of %d), want <= %d",
					first, w.service, len(samples), maxWarmupSamples)
			}
			var before, beforeRight, after, afterRight, allAfter, allAfterRight int
			var seen2 time.Time
			for _, smp := range samples[first:] {
				p := smp.meta.Process
				lang, _ := p.Resource.Get("telemetry.sdk.language")
				ok := p.ServiceName == w.service && p.DeploymentEnvironment == "test" && lang == w.language
				names := functionNames(smp.trace)
				switch {
				case slices.Contains(names, w.before):
					before++
					if ok && p.ServiceVersion == "1.0" {
						beforeRight++
					}
				case slices.Contains(names, w.after):
					if p.ServiceVersion == "2.0" && seen2.IsZero() {
						seen2 = smp.meta.Time
					}
					allAfter++
					if ok && p.ServiceVersion == "2.0" {
						allAfterRight++
					}
					if smp.meta.Time.Before(updated.Add(checkInterval + time.Second)) {
						continue
					}
					after++
					if ok && p.ServiceVersion == "2.0" {
						afterRight++
					}
				}
			}
			t.Logf("%d of %d samples before the first with the context; before the update %d of %d with 1.0; "+
				"after it %d of %d with 2.0, the first %v after it, and %d of %d from %v after it on", first, len(samples),
				beforeRight, before, allAfterRight, allAfter, seen2.Sub(updated).Round(time.Millisecond), afterRight, after,
				checkInterval+time.Second)
			for _, c := range []struct {
				what       string
				right, all int
			}{{"before the update", beforeRight, before}, {"after it", afterRight, after}} {
				if c.all == 0 || float64(c.right) < 0.95*float64(c.all) {
					t.Errorf("%s: %d of %d samples carry the context's resource, want >= 95%%", c.what, c.right, c.all)
				}
			}
			if seen2.IsZero() || seen2.Sub(updated) > checkInterval+time.Second {
				t.Errorf("the update was seen %v after it (never: negative), want within %v", seen2.Sub(updated),
					checkInterval+time.Second)
			}
		})
	}
}

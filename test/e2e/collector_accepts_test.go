package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// TestCollectorAcceptsProfiles checks the collector side of the e2e setup
// without the profiler: build/start the collector, send hand-made profiles
// built with the v0.4.0 proto, stop it, and read the file exporter output
// back. The round trip must be lossless, which shows that collector v0.159.0
// and proto v0.4.0 agree on the wire format.
func TestCollectorAcceptsProfiles(t *testing.T) {
	requireE2E(t)
	c := startCollector(t)

	const requests = 2
	var (
		sent                 []*collectorpb.ExportProfilesServiceRequest
		wantSamples          int64
		wantRes, wantProfile int
	)
	for i := range requests {
		req, samples, res, profiles := handMadeRequest(i)
		resp, err := sendProfiles(context.Background(), c.Addr, req)
		if err != nil {
			t.Fatalf("export %d: %v", i, err)
		}
		if ps := resp.GetPartialSuccess(); ps.GetRejectedProfiles() != 0 || ps.GetErrorMessage() != "" {
			t.Fatalf("export %d: partial success: rejected=%d message=%q", i, ps.GetRejectedProfiles(), ps.GetErrorMessage())
		}
		sent = append(sent, req)
		wantSamples += samples
		wantRes += res
		wantProfile += profiles
	}
	if err := c.Stop(); err != nil { // flushes the file exporter
		t.Fatal(err)
	}

	got, err := collector.ReadOutput(c.OutPath, true)
	if err != nil {
		t.Fatalf("reading file exporter output (strict v0.4.0 parse): %v", err)
	}
	st := statsOf(got)
	t.Logf("collector received: %s", st)
	if st.Requests != requests || st.Resources != wantRes || st.Profiles != wantProfile || st.Samples != wantSamples {
		t.Errorf("got %s, want requests=%d resources=%d profiles=%d samples=%d",
			st, requests, wantRes, wantProfile, wantSamples)
	}

	for i := range min(len(got), len(sent)) {
		want := &profilespb.ProfilesData{
			ResourceProfiles: sent[i].GetResourceProfiles(),
			Dictionary:       sent[i].GetDictionary(),
		}
		gotPD := got[i]
		if err := collector.ResolveAttributeRefs(gotPD); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		for _, rp := range gotPD.GetResourceProfiles() {
			if collector.ResourceAttr(rp, "host.name") == "" {
				t.Errorf("request %d: resource lost its host.name attribute", i)
			}
		}
		// The exporter may only append strings (for attribute refs).
		dict := gotPD.GetDictionary()
		if n := len(want.GetDictionary().GetStringTable()); len(dict.GetStringTable()) >= n {
			dict.StringTable = dict.StringTable[:n]
		}
		// pdata writes the nil value of attribute_table[0] as "value":{}.
		for _, a := range dict.GetAttributeTable() {
			if a.Value != nil && a.Value.Value == nil {
				a.Value = nil
			}
		}
		if !proto.Equal(want, gotPD) {
			m := protojson.MarshalOptions{Multiline: true}
			t.Errorf("request %d did not survive the round trip through the collector\nsent:\n%s\nwritten by the collector:\n%s",
				i, m.Format(want), m.Format(gotPD))
		}
	}
}

// TestCollectorProfilesFeatureGate documents the gate status at the pinned
// collector: if the gate is still needed, a profiles pipeline must be refused
// without it.
func TestCollectorProfilesFeatureGate(t *testing.T) {
	requireE2E(t)
	bin := collectorBinary(t)
	gate := profilesGateArgs(t, bin)
	if len(gate) == 0 {
		t.Skipf("%s is not needed by this collector", collector.ProfilesGate)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, collector.Config("127.0.0.1:0", filepath.Join(dir, "out.jsonl"), "basic", nil))
	out, err := exec.Command(bin, "--config="+cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), collector.ProfilesGate) {
		t.Fatalf("collector without --feature-gates=+%s: err=%v, want a refusal naming the gate; output:\n%s", collector.ProfilesGate, err, out)
	}
}

package e2e

import (
	"path/filepath"
	"testing"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// Quick, always-on checks of the parsers the e2e tests depend on.

func TestParseExportLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	writeFile(t, p, `time="2026-01-02T03:04:05Z" level=info msg="starting"
time="2026-01-02T03:04:06Z" level=info msg="exported profiles" profiles=3 samples=120
time="2026-01-02T03:04:07Z" level=info msg="export failed" profiles=9 samples=999
time="2026-01-02T03:04:07Z" level=info msg="exported profiles" dropped_samples=7 profiles=1 samples=5
`)
	got, err := parseExportLog(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := (exportedTotals{Lines: 2, Samples: 125, Profiles: 4}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestParseProfilesJSON(t *testing.T) {
	line := `{"resourceProfiles":[{"resource":{"attributes":[{"keyStrindex":1,"value":{"stringValueStrindex":2}}]},` +
		`"scopeProfiles":[{"profiles":[{"samples":[{"stackIndex":1,"values":["3","4"]},{"timestampsUnixNano":["1","2"]}],` +
		`"profileId":"0102030405060708090a0b0c0d0e0f10"}]}]}],` +
		`"dictionary":{"stringTable":["","host.name","a"],"linkTable":[{},{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708"}]}}`
	path := filepath.Join(t.TempDir(), "profiles.jsonl")
	writeFile(t, path, line+"\n")
	pds, err := collector.ReadOutput(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pds) != 1 {
		t.Fatalf("got %d lines, want 1", len(pds))
	}
	pd := pds[0]
	st := statsOf(pds)
	if st.Samples != 9 || st.Profiles != 1 || st.Resources != 1 || st.SampleRecords != 2 {
		t.Errorf("stats %s", st)
	}
	if id := pd.ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId; len(id) != 16 || id[15] != 0x10 {
		t.Errorf("profile id %x", id)
	}
	if err := collector.ResolveAttributeRefs(pd); err != nil {
		t.Fatal(err)
	}
	if v := collector.ResourceAttr(pd.ResourceProfiles[0], "host.name"); v != "a" {
		t.Errorf("host.name=%q", v)
	}
}

package collector

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// Two export calls as the file exporter writes them: resource attributes as
// string table references and as plain strings, samples with values and
// with timestamps only, hex ids.
const twoExports = `{"resourceProfiles":[` +
	`{"resource":{"attributes":[{"keyStrindex":1,"value":{"stringValueStrindex":2}}]},` +
	`"scopeProfiles":[{"profiles":[{"samples":[{"stackIndex":1,"values":["3","4"]},{"timestampsUnixNano":["1","2"]}],` +
	`"profileId":"0102030405060708090a0b0c0d0e0f10"}]}]},` +
	`{"resource":{"attributes":[{"key":"process.executable.name","value":{"stringValue":"other"}}]},` +
	`"scopeProfiles":[{"profiles":[{"samples":[{"values":["5"]}]}]}]},` +
	`{"resource":{},"scopeProfiles":[{"profiles":[{"samples":[{"values":["1"]}]}]}]}],` +
	`"dictionary":{"stringTable":["","process.executable.name","app"],` +
	`"linkTable":[{},{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708"}]}}
{"resourceProfiles":[{"resource":{"attributes":[{"keyStrindex":2,"value":{"stringValueStrindex":1}}]},` +
	`"scopeProfiles":[{"profiles":[{"samples":[{"values":["10"]}]}]}]}],` +
	`"dictionary":{"stringTable":["","app","process.executable.name"]}}
`

func TestSamplesByProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "profiles.jsonl")
	if err := os.WriteFile(path, []byte(twoExports), 0o644); err != nil {
		t.Fatal(err)
	}
	pds, err := ReadOutput(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pds) != 2 {
		t.Fatalf("got %d exports, want 2", len(pds))
	}
	got, err := SamplesByProcess(pds)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"app": 3 + 4 + 2 + 10, "other": 5, "": 1}; !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if id := pds[0].ResourceProfiles[0].ScopeProfiles[0].Profiles[0].ProfileId; len(id) != 16 || id[15] != 0x10 {
		t.Errorf("profile id %x", id)
	}
}

func TestSamplesByProcessBadIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "profiles.jsonl")
	line := `{"resourceProfiles":[{"resource":{"attributes":[{"keyStrindex":7,"value":{"stringValue":"x"}}]}}],"dictionary":{"stringTable":[""]}}`
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	pds, err := ReadOutput(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := SamplesByProcess(pds); err == nil {
		t.Errorf("string index out of range: got %v, want an error", got)
	}
}

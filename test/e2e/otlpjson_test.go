package e2e

import (
	"fmt"

	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// The format of the collector's file exporter output is described in
// utils/collector/otlpjson.go.

// receivedStats summarizes what the collector wrote.
type receivedStats struct {
	Requests      int   // lines = export calls seen by the exporter
	Resources     int   // ResourceProfiles
	Profiles      int   // Profile messages
	SampleRecords int   // Sample messages
	Samples       int64 // sum of Sample.values; len(timestamps) when values is empty
}

func (s receivedStats) String() string {
	return fmt.Sprintf("requests=%d resources=%d profiles=%d sample_records=%d samples=%d",
		s.Requests, s.Resources, s.Profiles, s.SampleRecords, s.Samples)
}

// statsOf counts what the collector wrote (as read by collector.ReadOutput).
func statsOf(pds []*profilespb.ProfilesData) receivedStats {
	var st receivedStats
	for _, pd := range pds {
		st.Requests++
		for _, rp := range pd.GetResourceProfiles() {
			st.Resources++
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					st.Profiles++
					for _, s := range p.GetSamples() {
						st.SampleRecords++
						st.Samples += collector.SampleCount(s)
					}
				}
			}
		}
	}
	return st
}

package e2e

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"

	"github.com/hostprof/ebpf-profiler/interpreter"
	_ "github.com/hostprof/ebpf-profiler/interpreter/all"
	"github.com/hostprof/ebpf-profiler/utils/collector"
)

// dictAttrs returns the key/value pairs an attribute_indices list points at.
func dictAttrs(d *profilespb.ProfilesDictionary, indices []int32) map[string]*commonpb.AnyValue {
	out := map[string]*commonpb.AnyValue{}
	for _, i := range indices {
		a := d.GetAttributeTable()[i]
		out[d.GetStringTable()[a.GetKeyStrindex()]] = a.GetValue()
	}
	return out
}

// resourceIntAttr returns a resource's integer attribute.
func resourceIntAttr(rp *profilespb.ResourceProfiles, key string) (int64, bool) {
	for _, kv := range rp.GetResource().GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetIntValue(), true
		}
	}
	return 0, false
}

// checkExportedContent checks, on what the collector received, what a user
// of the data relies on: resource, sample, mapping and location attributes,
// kernel and native frames, and the workload's hot function.
func checkExportedContent(t *testing.T, pds []*profilespb.ProfilesData, workloadPID int) {
	t.Helper()
	var kernelLocations, workloadSamples, workloadHot int64
	sawWorkload := false
	for _, pd := range pds {
		if err := collector.ResolveAttributeRefs(pd); err != nil {
			t.Fatal(err)
		}
		d := pd.GetDictionary()
		for i, m := range d.GetMappingTable()[1:] {
			htl := dictAttrs(d, m.GetAttributeIndices())["process.executable.build_id.htlhash"].GetStringValue()
			// The kernel's pseudo modules (JIT-compiled BPF programs,
			// ftrace trampolines) are no files and have no id.
			if name := d.GetStringTable()[m.GetFilenameStrindex()]; htl == "" && (name == "[bpf]" || strings.HasPrefix(name, "[__builtin__")) {
				continue
			}
			if b, err := hex.DecodeString(htl); err != nil || len(b) != 16 {
				t.Fatalf("mapping %d (%s) has htlhash %q, want 32 hex digits",
					i+1, d.GetStringTable()[m.GetFilenameStrindex()], htl)
			}
		}
		for i, l := range d.GetLocationTable()[1:] {
			switch kind := dictAttrs(d, l.GetAttributeIndices())["profile.frame.type"].GetStringValue(); kind {
			case "kernel":
				kernelLocations++
			case "native", "abort-marker":
			default:
				// Other processes on the host may run a runtime.
				if slices.ContainsFunc(interpreter.All(), func(rt *interpreter.Runtime) bool { return rt.ID != 0 && rt.Name == kind }) {
					continue
				}
				t.Fatalf("location %d has frame type %q", i+1, kind)
			}
		}
		for _, rp := range pd.GetResourceProfiles() {
			if collector.ResourceAttr(rp, "host.name") == "" || collector.ResourceAttr(rp, "process.executable.name") == "" {
				t.Fatalf("resource lacks host.name or process.executable.name: %v", rp.GetResource())
			}
			pid, ok := resourceIntAttr(rp, "process.pid")
			if !ok {
				t.Fatalf("resource lacks process.pid: %v", rp.GetResource())
			}
			for _, sp := range rp.GetScopeProfiles() {
				for _, p := range sp.GetProfiles() {
					for _, s := range p.GetSamples() {
						attrs := dictAttrs(d, s.GetAttributeIndices())
						for _, k := range []string{"thread.id", "thread.name", "cpu.logical_number"} {
							if _, ok := attrs[k]; !ok {
								t.Fatalf("sample lacks %s: %v", k, attrs)
							}
						}
						if int(pid) != workloadPID {
							continue
						}
						sawWorkload = true
						n := collector.SampleCount(s)
						workloadSamples += n
						if names := stackFunctions(d, s.GetStackIndex()); hasChain(names, workloadChain) {
							workloadHot += n
						} else if workloadSamples-n < 3 {
							t.Logf("workload stack without %v: %v", workloadChain, names)
						}
					}
				}
			}
		}
	}
	t.Logf("kernel locations: %d; workload samples: %d, %d with %v", kernelLocations, workloadSamples, workloadHot, workloadChain)
	if !sawWorkload {
		t.Fatalf("no resource for the workload (pid %d)", workloadPID)
	}
	if kernelLocations == 0 {
		t.Error("no kernel frames exported")
	}
	if workloadHot < workloadSamples*9/10 {
		t.Errorf("only %d of %d workload samples show %v", workloadHot, workloadSamples, workloadChain)
	}
}

// workloadChain is fpchain's hot chain, leaf first.
var workloadChain = []string{"cf_leaf", "cf_mid", "cf_top", "main"}

// hasChain reports whether chain appears as consecutive names.
func hasChain(names, chain []string) bool {
	for i := 0; i+len(chain) <= len(names); i++ {
		if slices.Equal(names[i:i+len(chain)], chain) {
			return true
		}
	}
	return false
}

// stackFunctions lists a stack's function names (or mapping+address).
func stackFunctions(d *profilespb.ProfilesDictionary, stack int32) []string {
	var names []string
	for _, li := range d.GetStackTable()[stack].GetLocationIndices() {
		loc := d.GetLocationTable()[li]
		if len(loc.GetLines()) == 0 {
			m := d.GetMappingTable()[loc.GetMappingIndex()]
			names = append(names, fmt.Sprintf("%s+%#x", d.GetStringTable()[m.GetFilenameStrindex()], loc.GetAddress()))
		}
		for _, line := range loc.GetLines() {
			names = append(names, d.GetStringTable()[d.GetFunctionTable()[line.GetFunctionIndex()].GetNameStrindex()])
		}
	}
	return names
}

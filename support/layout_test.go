package support

import (
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// ReadShared refuses an object whose BTF lacks a struct member or an enum
// value it reads, naming it, rather than reading it as 0.
func TestReadSharedNamesMissing(t *testing.T) {
	for _, tt := range []struct {
		typ, member, want string
	}{
		// At offset 0: read as 0 before, it looked present.
		{"trace", "type", "BPF struct trace lacks member type"},
		{"trace", "frames", "BPF struct trace lacks member frames"},
		{"frame", "kind", "BPF struct frame lacks member kind"},
		{"process_event", "pid", "BPF struct process_event lacks member pid"},
		{"exec_event", "ino", "BPF struct exec_event lacks member ino"},
		{"mmap_event", "pgoff", "BPF struct mmap_event lacks member pgoff"},
		{"event_type", "EVENT_TRACE", "BPF enum event_type lacks EVENT_TRACE"},
		{"trace_flag", "TRACE_FLAG_APM_CONTEXT", "BPF enum trace_flag lacks TRACE_FLAG_APM_CONTEXT"},
		{"metric_id", "METRIC_COUNT", "BPF enum metric_id lacks METRIC_COUNT"},
		{"delta_layout", "DELTA_PAGE_BITS", "BPF enum delta_layout lacks DELTA_PAGE_BITS"},
		{"unwind_rule_flag", "UNWIND_RULE_STACK_SWITCH", "BPF enum unwind_rule_flag lacks UNWIND_RULE_STACK_SWITCH"},
		{"runtime_id", "RUNTIME_MAX", "BPF enum runtime_id lacks RUNTIME_MAX"},
		{"frame_kind", "FRAME_KIND_NATIVE", "BPF enum frame_kind lacks FRAME_KIND_NATIVE"},
	} {
		spec, err := LoadSpec()
		if err != nil {
			t.Fatal(err)
		}
		typ, err := spec.Types.AnyTypeByName(tt.typ)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		switch typ := typ.(type) {
		case *btf.Struct:
			n = len(typ.Members)
			typ.Members = slices.DeleteFunc(typ.Members, func(m btf.Member) bool { return m.Name == tt.member })
			n -= len(typ.Members)
		case *btf.Enum:
			n = len(typ.Values)
			typ.Values = slices.DeleteFunc(typ.Values, func(v btf.EnumValue) bool { return v.Name == tt.member })
			n -= len(typ.Values)
		}
		if n != 1 {
			t.Fatalf("%s has no %s to take out", tt.typ, tt.member)
		}
		_, err = ReadShared(spec)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Count(err.Error(), tt.want) != 1 {
			t.Errorf("without %s's %s: %v, want one %q", tt.typ, tt.member, err, tt.want)
		}
	}
}

// RuntimeMetricsPerRuntime must be the C side's RUNTIME_METRICS_MAX, which
// only the runtime_metrics map's size tells.
func TestReadSharedChecksRuntimeMetricSlots(t *testing.T) {
	spec, err := LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps["runtime_metrics"].MaxEntries *= 2
	if _, err := ReadShared(spec); err == nil || !strings.Contains(err.Error(), "RUNTIME_METRICS_MAX") {
		t.Errorf("a runtime_metrics map of twice the counters: %v, want an error naming RUNTIME_METRICS_MAX", err)
	}
}

// TestExplicitPadding: a mirror whose padding Go adds implicitly is
// refused, one that declares it is accepted.
func TestExplicitPadding(t *testing.T) {
	type implicit struct {
		A uint32
		B uint64
	}
	type explicit struct {
		A uint32
		_ uint32
		B uint64
	}
	if err := explicitPadding("implicit", implicit{}); err == nil {
		t.Error("a mirror with implicit padding was accepted")
	}
	if err := explicitPadding("explicit", explicit{}); err != nil {
		t.Error(err)
	}
}

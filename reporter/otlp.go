package reporter

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"slices"

	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	commonpb "go.opentelemetry.io/proto/slim/otlp/common/v1"
	profilespb "go.opentelemetry.io/proto/slim/otlp/profiles/v1development"
	resourcepb "go.opentelemetry.io/proto/slim/otlp/resource/v1"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Semantic-convention attribute keys and the instrumentation scope name.
const (
	attrProcessPID  = "process.pid"
	attrExeName     = "process.executable.name"
	attrExePath     = "process.executable.path"
	attrContainerID = "container.id"
	attrPodUID      = "k8s.pod.uid"
	attrPodName     = "k8s.pod.name"
	attrNamespace   = "k8s.namespace.name"
	attrContainer   = "container.name"
	attrRuntimeName = "process.runtime.name"
	attrRuntimeVer  = "process.runtime.version"
	attrServiceName = "service.name"
	attrServiceVer  = "service.version"
	attrDeployEnv   = "deployment.environment.name"
	attrHostID      = "host.id"
	attrHostName    = "host.name"
	attrThreadID    = "thread.id"
	attrThreadName  = "thread.name"
	attrCPU         = "cpu.logical_number"
	attrFrameType   = "profile.frame.type"
	// attrFrameTier is how a runtime ran a frame's code (libpf.Frame.Tier),
	// followed by " inlined" for a frame inlined into its caller: "C2",
	// "C2 inlined", "interpreted", or "inlined" alone.
	attrFrameTier = "profile.frame.tier"
	// attrStackTraceID is, on samples linked to a trace, the stack-trace id
	// sent to the APM agent (base64url without padding, as the agent stores
	// it in its span attribute elastic.profiler_stack_trace_ids), so that a
	// backend can join the two.
	attrStackTraceID = "elastic.profiler_stack_trace_id"
	attrBuildIDHTL   = "process.executable.build_id.htlhash"
	attrBuildIDGNU   = "process.executable.build_id.gnu"
	attrBuildIDGo    = "process.executable.build_id.go"

	scopeName = "ebpf-profiler"
)

// buildOptions is what a request needs beyond the interval's samples.
type buildOptions struct {
	hostID, hostName, version string
	// period is the sampling period in nanoseconds.
	period int64
}

// otlpRequest is a built request plus what the exporter logs and counts
// about it, so it never has to walk the request again.
type otlpRequest struct {
	req      *collectorpb.ExportProfilesServiceRequest
	samples  int
	profiles int
}

// Dictionary keys: each is the full content of the entry it indexes (with
// nested references already resolved to indices), so equal keys mean equal
// entries and no table can hold duplicates.
type (
	attrKey struct {
		key   int32
		isInt bool
		str   string
		num   int64
	}
	functionKey struct{ name, systemName, file int32 }
	mappingKey  struct {
		start, limit, offset uint64
		filename             int32
		// htl, gnu and goID are attribute indices; 0 when absent.
		htl, gnu, goID int32
	}
	locationKey struct {
		mapping  int32
		address  uint64
		function int32
		line     int64
		column   int64
		kind     int32
		tier     int32
	}
)

// dictBuilder fills one ProfilesDictionary shared by every profile of a
// request.
type dictBuilder struct {
	strings   *orderedSet[string, string]
	attrs     *orderedSet[attrKey, *profilespb.KeyValueAndUnit]
	functions *orderedSet[functionKey, *profilespb.Function]
	mappings  *orderedSet[mappingKey, *profilespb.Mapping]
	locations *orderedSet[locationKey, *profilespb.Location]
	// stacks is keyed by the little-endian bytes of the location indices.
	stacks *orderedSet[string, *profilespb.Stack]
	links  *orderedSet[traceLink, *profilespb.Link]

	// Traces and mappings are shared immutable values, so memoizing by
	// pointer skips re-walking frames and re-hashing file ids.
	traceStacks map[*libpf.Trace]int32
	mappingRefs map[*libpf.Mapping]int32
	scratch     []byte
}

func newDictBuilder() *dictBuilder {
	return &dictBuilder{
		strings:   newOrderedSet("", ""),
		attrs:     newOrderedSet(attrKey{}, &profilespb.KeyValueAndUnit{}),
		functions: newOrderedSet(functionKey{}, &profilespb.Function{}),
		mappings:  newOrderedSet(mappingKey{}, &profilespb.Mapping{}),
		locations: newOrderedSet(locationKey{}, &profilespb.Location{}),
		stacks:    newOrderedSet("", &profilespb.Stack{}),
		// The zero link has full-length zero ids, which strict codecs
		// expect.
		links:       newOrderedSet(traceLink{}, &profilespb.Link{TraceId: make([]byte, 16), SpanId: make([]byte, 8)}),
		traceStacks: make(map[*libpf.Trace]int32),
		mappingRefs: make(map[*libpf.Mapping]int32),
	}
}

func (b *dictBuilder) str(s string) int32 {
	return b.strings.add(s, func() string { return s })
}

func (b *dictBuilder) attrStr(key, val string) int32 {
	k := attrKey{key: b.str(key), str: val}
	return b.attrs.add(k, func() *profilespb.KeyValueAndUnit {
		return &profilespb.KeyValueAndUnit{KeyStrindex: k.key, Value: stringValue(val)}
	})
}

func (b *dictBuilder) attrInt(key string, val int64) int32 {
	k := attrKey{key: b.str(key), isInt: true, num: val}
	return b.attrs.add(k, func() *profilespb.KeyValueAndUnit {
		return &profilespb.KeyValueAndUnit{KeyStrindex: k.key, Value: intValue(val)}
	})
}

func (b *dictBuilder) function(name, systemName, file string) int32 {
	k := functionKey{name: b.str(name), systemName: b.str(systemName), file: b.str(file)}
	return b.functions.add(k, func() *profilespb.Function {
		return &profilespb.Function{NameStrindex: k.name, SystemNameStrindex: k.systemName, FilenameStrindex: k.file}
	})
}

func (b *dictBuilder) mapping(m *libpf.Mapping) int32 {
	if m == nil {
		return 0
	}
	if i, ok := b.mappingRefs[m]; ok {
		return i
	}
	k := mappingKey{
		start:    m.Start,
		limit:    m.End,
		offset:   m.FileOffset,
		filename: b.str(m.Path),
	}
	// A zero file id means the file could not be read: sending it would
	// give unrelated files one shared id for symbolization.
	if !m.FileID.IsZero() {
		k.htl = b.attrStr(attrBuildIDHTL, m.FileID.String())
	}
	if m.GNUBuildID != "" {
		k.gnu = b.attrStr(attrBuildIDGNU, m.GNUBuildID)
	}
	if m.GoBuildID != "" {
		k.goID = b.attrStr(attrBuildIDGo, m.GoBuildID)
	}
	i := b.mappings.add(k, func() *profilespb.Mapping {
		var attrs []int32
		for _, a := range []int32{k.htl, k.gnu, k.goID} {
			if a != 0 {
				attrs = append(attrs, a)
			}
		}
		return &profilespb.Mapping{
			MemoryStart:      k.start,
			MemoryLimit:      k.limit,
			FileOffset:       k.offset,
			FilenameStrindex: k.filename,
			AttributeIndices: attrs,
		}
	})
	b.mappingRefs[m] = i
	return i
}

func (b *dictBuilder) location(f *libpf.Frame) int32 {
	k := locationKey{
		mapping: b.mapping(f.Mapping),
		address: f.Address,
		kind:    b.attrStr(attrFrameType, f.Kind.String()),
	}
	if tier := frameTier(f); tier != "" {
		k.tier = b.attrStr(attrFrameTier, tier)
	}
	if f.FunctionName != "" {
		k.function = b.function(f.FunctionName, f.SystemName, f.SourceFile)
		k.line, k.column = int64(f.SourceLine), int64(f.SourceColumn)
	}
	return b.locations.add(k, func() *profilespb.Location {
		loc := &profilespb.Location{
			MappingIndex:     k.mapping,
			Address:          k.address,
			AttributeIndices: []int32{k.kind},
		}
		if k.tier != 0 {
			loc.AttributeIndices = append(loc.AttributeIndices, k.tier)
		}
		if k.function != 0 {
			loc.Lines = []*profilespb.Line{{FunctionIndex: k.function, Line: k.line, Column: k.column}}
		}
		return loc
	})
}

// stack returns the stack of t, leaf first as in Trace.Frames.
func (b *dictBuilder) stack(t *libpf.Trace) int32 {
	if i, ok := b.traceStacks[t]; ok {
		return i
	}
	locs := make([]int32, len(t.Frames))
	b.scratch = b.scratch[:0]
	for i := range t.Frames {
		locs[i] = b.location(&t.Frames[i])
		b.scratch = binary.LittleEndian.AppendUint32(b.scratch, uint32(locs[i]))
	}
	i := b.stacks.add(string(b.scratch), func() *profilespb.Stack {
		return &profilespb.Stack{LocationIndices: locs}
	})
	b.traceStacks[t] = i
	return i
}

func (b *dictBuilder) dictionary() *profilespb.ProfilesDictionary {
	return &profilespb.ProfilesDictionary{
		MappingTable:   b.mappings.values,
		LocationTable:  b.locations.values,
		FunctionTable:  b.functions.values,
		LinkTable:      b.links.values,
		StringTable:    b.strings.values,
		AttributeTable: b.attrs.values,
		StackTable:     b.stacks.values,
	}
}

// buildRequest turns one interval into a request with one resource per
// process (a CPU profile, an off-CPU profile, up to four per heap
// profile), all sharing a single dictionary.
func buildRequest(iv *interval, opts buildOptions) otlpRequest {
	b := newDictBuilder()
	start, end := profileWindow(iv)
	byProcess := groupsByProcess(iv)
	req := &collectorpb.ExportProfilesServiceRequest{}
	resources := map[processIdent]*profilespb.ResourceProfiles{}
	for _, groups := range byProcess {
		var profs []*profilespb.Profile
		cpu, offCPU := splitOffCPU(groups)
		if len(cpu) > 0 {
			profs = append(profs, &profilespb.Profile{
				SampleType:   &profilespb.ValueType{TypeStrindex: b.str("samples"), UnitStrindex: b.str("count")},
				PeriodType:   &profilespb.ValueType{TypeStrindex: b.str("cpu"), UnitStrindex: b.str("nanoseconds")},
				Period:       opts.period,
				TimeUnixNano: start,
				DurationNano: end - start,
				ProfileId:    newProfileID(),
				Samples:      b.samples(cpu, start, end),
			})
		}
		if len(offCPU) > 0 {
			// Each sample's value is how long its thread waited off the
			// CPU; its timestamp when the wait began.
			profs = append(profs, &profilespb.Profile{
				SampleType:   &profilespb.ValueType{TypeStrindex: b.str("off_cpu"), UnitStrindex: b.str("nanoseconds")},
				TimeUnixNano: start,
				DurationNano: end - start,
				ProfileId:    newProfileID(),
				Samples:      b.samples(offCPU, start, end),
			})
		}
		rp := newResourceProfiles(groups[0].key.pid, groups[0].key.process, opts)
		rp.ScopeProfiles[0].Profiles = profs
		resources[processIdent{groups[0].key.pid, groups[0].key.process}] = rp
		req.ResourceProfiles = append(req.ResourceProfiles, rp)
	}
	for _, hp := range iv.heaps {
		var pid libpf.PID
		if hp.Process != nil {
			pid = hp.Process.PID
		}
		id := processIdent{pid, hp.Process}
		rp := resources[id]
		if rp == nil {
			rp = newResourceProfiles(pid, hp.Process, opts)
			resources[id] = rp
			req.ResourceProfiles = append(req.ResourceProfiles, rp)
		}
		rp.ScopeProfiles[0].Profiles = append(rp.ScopeProfiles[0].Profiles, b.heapProfiles(hp)...)
	}
	req.Dictionary = b.dictionary()
	return otlpRequest{req: req, samples: iv.samples + iv.waits, profiles: len(req.ResourceProfiles)}
}

// processIdent is a process image: its pid and ProcessInfo.
type processIdent struct {
	pid     libpf.PID
	process *libpf.ProcessInfo
}

// newResourceProfiles is the resource of a process with an empty scope.
func newResourceProfiles(pid libpf.PID, proc *libpf.ProcessInfo, opts buildOptions) *profilespb.ResourceProfiles {
	return &profilespb.ResourceProfiles{
		Resource: resource(pid, proc, opts),
		ScopeProfiles: []*profilespb.ScopeProfiles{{
			Scope: &commonpb.InstrumentationScope{Name: scopeName, Version: opts.version},
		}},
	}
}

// heapSampleTypes are a heap profile's four values, in the names and units
// of Go's own heap profile (runtime/pprof), each a profile of its own:
// an OTLP profile has one sample type.
var heapSampleTypes = [4][2]string{
	{"alloc_objects", "count"}, {"alloc_space", "bytes"}, {"inuse_objects", "count"}, {"inuse_space", "bytes"},
}

// heapValues are a heap sample's values in the order of heapSampleTypes.
func heapValues(s *libpf.HeapSample) [4]int64 {
	return [4]int64{s.AllocObjects, s.AllocBytes, s.InUseObjects, s.InUseBytes}
}

// heapProfiles are the four profiles of a heap profile: one sample per
// allocation site with a value, without timestamps (the values are totals
// at the profile's time), the period that of the program's sampling in
// bytes.
func (b *dictBuilder) heapProfiles(hp *libpf.HeapProfile) []*profilespb.Profile {
	profs := make([]*profilespb.Profile, len(heapSampleTypes))
	for i, st := range heapSampleTypes {
		profs[i] = &profilespb.Profile{
			SampleType:   &profilespb.ValueType{TypeStrindex: b.str(st[0]), UnitStrindex: b.str(st[1])},
			PeriodType:   &profilespb.ValueType{TypeStrindex: b.str("space"), UnitStrindex: b.str("bytes")},
			Period:       hp.Period,
			TimeUnixNano: uint64(hp.Time.UnixNano()),
			ProfileId:    newProfileID(),
		}
	}
	for i := range hp.Samples {
		s := &hp.Samples[i]
		stack := int32(-1) // the trace is made once, if a value needs it
		for j, v := range heapValues(s) {
			if v == 0 {
				continue
			}
			if stack < 0 {
				stack = b.stack(hp.Trace(i))
			}
			profs[j].Samples = append(profs[j].Samples, &profilespb.Sample{StackIndex: stack, Values: []int64{v}})
		}
	}
	// A sample type without values (nothing in use) is no profile.
	return slices.DeleteFunc(profs, func(p *profilespb.Profile) bool { return len(p.Samples) == 0 })
}

// sampleIdent is an OTLP sample's identity within a profile. Distinct trace
// hashes can resolve to the same stack, and the spec asks for samples with
// the same identity to be merged.
type sampleIdent struct {
	stack      int32
	tid        libpf.TID
	threadName string
	cpu        int
	link       int32
	// stackTraceID is set for linked samples only.
	stackTraceID string
	labels       libpf.Labels
}

func (b *dictBuilder) samples(groups []*sampleGroup, start, end uint64) []*profilespb.Sample {
	var out []*profilespb.Sample
	merged := make(map[sampleIdent]*profilespb.Sample, len(groups))
	values := make(map[*profilespb.Sample][]timedValue, len(groups))
	for _, g := range groups {
		id := sampleIdent{stack: b.stack(g.trace), tid: g.key.tid, threadName: g.key.threadName, cpu: g.key.cpu,
			link: b.link(g.key.link), labels: g.key.labels}
		if id.link != 0 {
			h := g.key.hash.Bytes()
			id.stackTraceID = base64.RawURLEncoding.EncodeToString(h[:])
		}
		s := merged[id]
		if s == nil {
			s = &profilespb.Sample{StackIndex: id.stack, AttributeIndices: b.sampleAttrs(id), LinkIndex: id.link}
			merged[id] = s
			out = append(out, s)
		}
		for i, ts := range g.timestamps {
			v := int64(1)
			if g.key.offCPU {
				v = g.waits[i]
			}
			values[s] = append(values[s], timedValue{clampTime(ts, start, end), v})
		}
	}
	for _, s := range out {
		// The spec requires values and timestamps to pair up one to one when
		// both are set: a CPU sample counts one per timestamp, which keeps
		// consumers that only sum values and those that read timestamps in
		// agreement; an off-CPU sample its wait.
		tv := values[s]
		slices.SortStableFunc(tv, func(a, b timedValue) int { return cmp.Compare(a.ts, b.ts) })
		s.TimestampsUnixNano = make([]uint64, len(tv))
		s.Values = make([]int64, len(tv))
		for i, v := range tv {
			s.TimestampsUnixNano[i], s.Values[i] = v.ts, v.value
		}
	}
	return out
}

type timedValue struct {
	ts    uint64
	value int64
}

// splitOffCPU splits a process's groups into CPU and off-CPU samples.
func splitOffCPU(groups []*sampleGroup) (cpu, offCPU []*sampleGroup) {
	for _, g := range groups {
		if g.key.offCPU {
			offCPU = append(offCPU, g)
		} else {
			cpu = append(cpu, g)
		}
	}
	return cpu, offCPU
}

// link is the link table index of a sample's trace link; 0 for none.
func (b *dictBuilder) link(l traceLink) int32 {
	return b.links.add(l, func() *profilespb.Link {
		return &profilespb.Link{TraceId: slices.Clone(l.traceID[:]), SpanId: slices.Clone(l.spanID[:])}
	})
}

func (b *dictBuilder) sampleAttrs(id sampleIdent) []int32 {
	attrs := []int32{b.attrInt(attrThreadID, int64(id.tid))}
	if id.threadName != "" {
		attrs = append(attrs, b.attrStr(attrThreadName, id.threadName))
	}
	attrs = append(attrs, b.attrInt(attrCPU, int64(id.cpu)))
	if id.stackTraceID != "" {
		attrs = append(attrs, b.attrStr(attrStackTraceID, id.stackTraceID))
	}
	for k, v := range id.labels.All() {
		attrs = append(attrs, b.attrStr(sampleLabelKey(k, otlpSampleKeys), v))
	}
	return attrs
}

// otlpSampleKeys are the sample attributes the profiler sets itself.
var otlpSampleKeys = []string{attrThreadID, attrThreadName, attrCPU, attrStackTraceID}

// sampleLabelKey is the key a program's sample label is exported under:
// its own, or, where that is one the profiler sets itself (reserved),
// "label." + its own.
func sampleLabelKey(key string, reserved []string) string {
	if slices.Contains(reserved, key) {
		return "label." + key
	}
	return key
}

// profileWindow is the time window of an interval's profiles: the interval,
// widened to take in timestamps up to a minute (or one interval length, if
// longer) outside it, since samples can be delayed in the pipeline and
// stamped before the interval began (a new process's first samples wait
// for its set-up, seconds on a busy host). Timestamps further off come
// from a bad clock; clampTime moves them into the window rather than let
// them stretch it arbitrarily.
func profileWindow(iv *interval) (start, end uint64) {
	start, end = uint64(iv.start.UnixNano()), uint64(iv.end.UnixNano())
	if end <= start {
		end = start + 1
	}
	slack := max(end-start, uint64(60e9))
	lo, hi := start-min(start, slack), end+slack
	for _, g := range iv.groups {
		for _, ts := range g.timestamps {
			if ts >= lo && ts < hi {
				start = min(start, ts)
				end = max(end, ts+1)
			}
		}
	}
	return start, end
}

// clampTime moves ts into [start, end).
func clampTime(ts, start, end uint64) uint64 {
	return min(max(ts, start), end-1)
}

// groupsByProcess splits an interval's groups per process image (pid and
// ProcessInfo), each list and the lists themselves in a deterministic order
// so requests are reproducible.
func groupsByProcess(iv *interval) [][]*sampleGroup {
	byProcess := make(map[processIdent][]*sampleGroup)
	for _, g := range iv.groups {
		id := processIdent{g.key.pid, g.key.process}
		byProcess[id] = append(byProcess[id], g)
	}
	out := make([][]*sampleGroup, 0, len(byProcess))
	for _, gs := range byProcess {
		slices.SortFunc(gs, func(a, b *sampleGroup) int {
			return cmp.Or(
				cmp.Compare(a.key.tid, b.key.tid),
				cmp.Compare(a.key.cpu, b.key.cpu),
				cmp.Compare(a.key.threadName, b.key.threadName),
				cmp.Compare(a.key.hash.Hi, b.key.hash.Hi),
				cmp.Compare(a.key.hash.Lo, b.key.hash.Lo),
				a.key.labels.Compare(b.key.labels),
				cmp.Compare(boolToInt(a.key.offCPU), boolToInt(b.key.offCPU)),
			)
		})
		out = append(out, gs)
	}
	// Images of one pid follow each other in the order they were first seen.
	slices.SortFunc(out, func(a, b []*sampleGroup) int {
		return cmp.Or(cmp.Compare(a[0].key.pid, b[0].key.pid), cmp.Compare(firstSeen(a), firstSeen(b)))
	})
	return out
}

// firstSeen is the earliest sample time of a process's groups (the
// largest time when they have none: summed groups).
func firstSeen(gs []*sampleGroup) uint64 {
	first := ^uint64(0)
	for _, g := range gs {
		if len(g.timestamps) > 0 {
			first = min(first, slices.Min(g.timestamps))
		}
	}
	return first
}

func resource(pid libpf.PID, proc *libpf.ProcessInfo, opts buildOptions) *resourcepb.Resource {
	attrs := []*commonpb.KeyValue{{Key: attrProcessPID, Value: intValue(int64(pid))}}
	add := func(key, val string) {
		if val != "" {
			attrs = append(attrs, &commonpb.KeyValue{Key: key, Value: stringValue(val)})
		}
	}
	if proc != nil {
		add(attrExeName, proc.ExecutableName)
		add(attrExePath, proc.ExecutablePath)
		add(attrContainerID, proc.ContainerID)
		add(attrContainer, proc.ContainerName)
		add(attrPodName, proc.PodName)
		add(attrNamespace, proc.Namespace)
		add(attrPodUID, proc.PodUID)
		add(attrRuntimeName, proc.RuntimeName)
		add(attrRuntimeVer, proc.RuntimeVersion)
		add(attrServiceName, proc.ServiceName)
		add(attrServiceVer, proc.ServiceVersion)
		add(attrDeployEnv, proc.DeploymentEnvironment)
	}
	add(attrHostID, opts.hostID)
	add(attrHostName, opts.hostName)
	if proc != nil {
		// The rest of what the process's SDK published: what the
		// profiler knows itself (the pid, the host) stays.
		for k, v := range proc.Resource.All() {
			if !slices.ContainsFunc(attrs, func(a *commonpb.KeyValue) bool { return a.Key == k }) {
				attrs = append(attrs, &commonpb.KeyValue{Key: k, Value: stringValue(v)})
			}
		}
	}
	return &resourcepb.Resource{Attributes: attrs}
}

// frameTier is the value of a frame's attrFrameTier, "" for none.
func frameTier(f *libpf.Frame) string {
	switch {
	case !f.Inlined:
		return f.Tier
	case f.Tier == "":
		return "inlined"
	}
	return f.Tier + " inlined"
}

func stringValue(s string) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}
}

func intValue(n int64) *commonpb.AnyValue {
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: n}}
}

func newProfileID() []byte {
	id := make([]byte, 16)
	// crypto/rand.Read never fails since Go 1.24 (it aborts the program instead).
	_, _ = rand.Read(id)
	return id
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

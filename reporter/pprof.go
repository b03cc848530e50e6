package reporter

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/pprof/profile"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// pprofPattern matches the files this package writes (and prunes).
const pprofPattern = "profile-*.pb.gz"

// buildPprof converts an interval into a pprof profile. Unlike OTLP, pprof
// addresses are process addresses, so locations use Frame.AbsAddress and are
// not shared between processes that map a file at different places.
func buildPprof(iv *interval, period int64) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "samples", Unit: "count"},
			{Type: "cpu", Unit: "nanoseconds"},
		},
		DefaultSampleType: "cpu",
		PeriodType:        &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:            period,
		TimeNanos:         iv.start.UnixNano(),
		DurationNanos:     iv.end.Sub(iv.start).Nanoseconds(),
	}
	b := newPprofBuilder(p)
	offCPU := hasOffCPU(iv)
	if offCPU {
		// A third sample type: an off-CPU sample's wait, where the CPU
		// sample types count 0 (and a CPU sample's wait is 0).
		p.SampleType = append(p.SampleType, &profile.ValueType{Type: "off_cpu", Unit: "nanoseconds"})
	}
	for _, groups := range groupsByProcess(iv) {
		for _, g := range groups {
			n := int64(g.count())
			value := []int64{n, n * period}
			switch {
			case g.key.offCPU:
				value = []int64{0, 0, g.waited()}
			case offCPU:
				value = append(value, 0)
			}
			s := &profile.Sample{
				Value:    value,
				Location: b.stack(g.trace),
				Label:    pprofLabels(g),
				NumLabel: map[string][]int64{
					"pid": {int64(g.key.pid)},
					"tid": {int64(g.key.tid)},
					"cpu": {int64(g.key.cpu)},
				},
				// pprof's encoding cannot tell a unit-less numeric label of 0
				// from an absent one and drops it, which would lose CPU 0 and
				// the idle task; any unit keeps it, and pprof shows unknown
				// units as plain numbers.
				NumUnit: map[string][]string{"pid": {"id"}, "tid": {"id"}, "cpu": {"id"}},
			}
			if len(g.timestamps) == 0 {
				// Summed samples (the history's) have no thread or CPU.
				delete(s.NumLabel, "tid")
				delete(s.NumLabel, "cpu")
				s.NumUnit = map[string][]string{"pid": {"id"}}
			}
			p.Sample = append(p.Sample, s)
		}
	}
	return p
}

// buildHeapPprof converts an interval's heap profiles into one pprof
// profile with the sample types of Go's own heap profile, in-use bytes
// shown first (as go tool pprof shows a program's /debug/pprof/heap); each
// sample is labelled with its process. nil when the interval has none.
func buildHeapPprof(iv *interval) *profile.Profile {
	if len(iv.heaps) == 0 {
		return nil
	}
	p := &profile.Profile{
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		TimeNanos:         iv.heaps[0].Time.UnixNano(),
	}
	for _, st := range heapSampleTypes {
		p.SampleType = append(p.SampleType, &profile.ValueType{Type: st[0], Unit: st[1]})
	}
	b := newPprofBuilder(p)
	// A host's Go programs hold hundreds of thousands of sites: each
	// sample's trace is made, turned into locations and dropped, and
	// equal location lists (a program's stacks in each of its
	// processes) are shared.
	stacks := map[string][]*profile.Location{}
	var key []byte
	numUnit := map[string][]string{"pid": {"id"}}
	for _, hp := range iv.heaps {
		// One period per file: the programs' own (512 KiB unless they
		// changed it).
		p.Period = max(p.Period, hp.Period)
		labels := map[string][]string{}
		num := map[string][]int64{}
		if hp.Process != nil {
			labels["process"] = []string{hp.Process.ExecutableName}
			num["pid"] = []int64{int64(hp.Process.PID)}
		}
		for i := range hp.Samples {
			tr := hp.Trace(i)
			key = key[:0]
			locs := make([]*profile.Location, len(tr.Frames))
			for j := range tr.Frames {
				locs[j] = b.location(&tr.Frames[j])
				key = binary.LittleEndian.AppendUint64(key, locs[j].ID)
			}
			if shared, ok := stacks[string(key)]; ok {
				locs = shared
			} else {
				stacks[string(key)] = locs
			}
			v := heapValues(&hp.Samples[i])
			p.Sample = append(p.Sample, &profile.Sample{Value: v[:], Location: locs, Label: labels,
				NumLabel: num, NumUnit: numUnit})
		}
	}
	return p
}

// hasOffCPU says whether an interval has off-CPU samples.
func hasOffCPU(iv *interval) bool {
	for _, g := range iv.groups {
		if g.key.offCPU {
			return true
		}
	}
	return false
}

func pprofLabels(g *sampleGroup) map[string][]string {
	labels := make(map[string][]string, 2)
	if g.key.threadName != "" {
		labels["thread_name"] = []string{g.key.threadName}
	}
	if p := g.key.process; p != nil {
		for key, v := range map[string]string{"process": p.ExecutableName, "service": p.ServiceName,
			"service_version": p.ServiceVersion, "environment": p.DeploymentEnvironment, "pod": p.PodName,
			"namespace": p.Namespace, "container": p.ContainerName} {
			if v != "" {
				labels[key] = []string{v}
			}
		}
	}
	for k, v := range g.key.labels.All() {
		labels[sampleLabelKey(k, pprofSampleKeys)] = []string{v}
	}
	return labels
}

// pprofSampleKeys are the pprof sample labels the profiler sets itself,
// string and numeric.
var pprofSampleKeys = []string{"thread_name", "process", "service", "service_version", "environment", "pod", "namespace", "container", "pid", "tid", "cpu"}

type pprofLocKey struct {
	mapping *profile.Mapping
	address uint64
	fn      *profile.Function
	line    int64
	column  int64
}

// pprofBuilder dedups mappings, functions and locations and numbers them
// from 1, as pprof reserves id 0.
type pprofBuilder struct {
	p         *profile.Profile
	mappings  map[libpf.Mapping]*profile.Mapping
	functions map[[3]string]*profile.Function
	locations map[pprofLocKey]*profile.Location
	stacks    map[*libpf.Trace][]*profile.Location
}

func newPprofBuilder(p *profile.Profile) *pprofBuilder {
	return &pprofBuilder{
		p:         p,
		mappings:  make(map[libpf.Mapping]*profile.Mapping),
		functions: make(map[[3]string]*profile.Function),
		locations: make(map[pprofLocKey]*profile.Location),
		stacks:    make(map[*libpf.Trace][]*profile.Location),
	}
}

func (b *pprofBuilder) stack(t *libpf.Trace) []*profile.Location {
	if locs, ok := b.stacks[t]; ok {
		return locs
	}
	locs := make([]*profile.Location, len(t.Frames))
	for i := range t.Frames {
		locs[i] = b.location(&t.Frames[i])
	}
	b.stacks[t] = locs
	return locs
}

func (b *pprofBuilder) location(f *libpf.Frame) *profile.Location {
	m := b.mapping(f.Mapping)
	k := pprofLocKey{mapping: m, address: f.AbsAddress()}
	if name := symbolName(f); name != "" {
		k.fn = b.function(name, cmp.Or(f.SystemName, name), f.SourceFile)
		k.line, k.column = int64(f.SourceLine), int64(f.SourceColumn)
		if m != nil {
			m.HasFunctions = true
			m.HasFilenames = m.HasFilenames || f.SourceFile != ""
			m.HasLineNumbers = m.HasLineNumbers || f.SourceLine != 0
		}
	}
	if loc, ok := b.locations[k]; ok {
		return loc
	}
	loc := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: m, Address: k.address}
	if k.fn != nil {
		loc.Line = []profile.Line{{Function: k.fn, Line: k.line, Column: k.column}}
	}
	b.locations[k] = loc
	b.p.Location = append(b.p.Location, loc)
	return loc
}

func (b *pprofBuilder) mapping(lm *libpf.Mapping) *profile.Mapping {
	if lm == nil {
		return nil
	}
	if m, ok := b.mappings[*lm]; ok {
		return m
	}
	m := &profile.Mapping{
		ID:      uint64(len(b.p.Mapping) + 1),
		Start:   lm.Start,
		Limit:   lm.End,
		Offset:  lm.FileOffset,
		File:    lm.Path,
		BuildID: cmp.Or(lm.GNUBuildID, lm.GoBuildID),
	}
	b.mappings[*lm] = m
	b.p.Mapping = append(b.p.Mapping, m)
	return m
}

func (b *pprofBuilder) function(name, systemName, file string) *profile.Function {
	k := [3]string{name, systemName, file}
	if fn, ok := b.functions[k]; ok {
		return fn
	}
	fn := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: systemName, Filename: file}
	b.functions[k] = fn
	b.p.Function = append(b.p.Function, fn)
	return fn
}

// symbolName is the function name pprof shows for a frame: the symbol, or a
// readable marker for an aborted unwind so it is not mistaken for code.
func symbolName(f *libpf.Frame) string {
	if f.FunctionName == "" && f.Kind == libpf.FrameAbort {
		return fmt.Sprintf("[unwinding aborted: error %d]", f.Address)
	}
	return f.FunctionName
}

// writePprof writes p into dir as profile-<UTC start><suffix>.pb.gz. It
// writes a temporary file and renames it, so readers never see a partial
// profile.
func writePprof(dir string, p *profile.Profile, start time.Time, suffix string) (string, error) {
	path, err := uniqueProfilePath(dir, start, suffix)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".profile-*.tmp")
	if err != nil {
		return "", fmt.Errorf("creating temporary profile in %s: %w", dir, err)
	}
	tmp := f.Name()
	err = p.Write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file 0600; profiles are as readable as the
		// directory we create 0755.
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("writing profile %s: %w", path, err)
	}
	return path, nil
}

// uniqueProfilePath names the file after the interval start, adding a
// counter when two intervals start within the same second (e.g. the partial
// interval flushed by Close right after a tick).
func uniqueProfilePath(dir string, start time.Time, suffix string) (string, error) {
	base := filepath.Join(dir, "profile-"+start.UTC().Format("20060102T150405Z")+suffix)
	for i := 0; i < 1000; i++ {
		path := base + ".pb.gz"
		if i > 0 {
			path = fmt.Sprintf("%s-%d.pb.gz", base, i)
		}
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return path, nil
		}
	}
	return "", fmt.Errorf("no free profile file name for %s in %s", start.UTC(), dir)
}

// pruneProfiles deletes the oldest profile files in dir beyond keep. Age is
// the modification time, which we set by writing, with the name breaking ties.
func pruneProfiles(dir string, keep int) (int, error) {
	if keep < 0 {
		return 0, nil
	}
	paths, err := filepath.Glob(filepath.Join(dir, pprofPattern))
	if err != nil || len(paths) <= keep {
		return 0, err
	}
	type file struct {
		path  string
		mtime time.Time
	}
	files := make([]file, 0, len(paths))
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			files = append(files, file{p, fi.ModTime()})
		}
	}
	slices.SortFunc(files, func(a, b file) int {
		return cmp.Or(a.mtime.Compare(b.mtime), cmp.Compare(a.path, b.path))
	})
	var errs []error
	removed := 0
	for _, f := range files[:max(0, len(files)-keep)] {
		if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("pruning old profile: %w", err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// ensureWritableDir creates dir if needed and proves a file can be created
// in it, so a bad OutputDir fails at startup rather than at the first
// interval.
func ensureWritableDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	f, err := os.CreateTemp(dir, ".write-test-*")
	if err != nil {
		return fmt.Errorf("output directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("removing write test file: %w", err)
	}
	return nil
}

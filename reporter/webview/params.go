package webview

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/reporter"
)

// Bounds on what a request may ask, so that no request costs more than
// the history it reads.
const (
	maxQueryBytes   = 8 << 10
	maxValues       = 64  // values of one repeatable parameter
	maxValueBytes   = 256 // bytes of one value
	maxSearchBytes  = 200
	maxFlameNodes   = 50_000
	defaultMinShare = 0.0005
	defaultTopRows  = 100
	maxTopRows      = 1000
	maxFilterValues = 500
	defaultBuckets  = 300
	maxBuckets      = 2000
)

// badParam is a request error answered with 400 and its message.
type badParam struct{ name, msg string }

func (e *badParam) Error() string { return fmt.Sprintf("bad parameter %q: %s", e.name, e.msg) }

// selectionParams are the parameters of a selection, without prefix.
var selectionParams = []string{"from", "to", "pid", "process", "container", "pod", "namespace", "service", "thread", "kind",
	"label", "trace", "measure"}

// params reads a request's query string, checking every value's size.
type params struct {
	q url.Values
}

func parseParams(rawQuery string, known ...string) (*params, error) {
	if len(rawQuery) > maxQueryBytes {
		return nil, &badParam{"query", fmt.Sprintf("longer than %d bytes", maxQueryBytes)}
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, &badParam{"query", err.Error()}
	}
	for name, vs := range q {
		if !isKnown(name, known) {
			return nil, &badParam{name, "unknown parameter"}
		}
		if len(vs) > maxValues {
			return nil, &badParam{name, fmt.Sprintf("more than %d values", maxValues)}
		}
		for _, v := range vs {
			// A focus path is a list of ids as deep as a stack.
			if len(v) > maxValueBytes && name != "focus" {
				return nil, &badParam{name, fmt.Sprintf("value longer than %d bytes", maxValueBytes)}
			}
		}
	}
	return &params{q: q}, nil
}

func isKnown(name string, known []string) bool {
	for _, k := range known {
		if name == k {
			return true
		}
	}
	return false
}

// list returns a parameter's values, comma-separated ones split, empty
// ones dropped.
func (p *params) list(name string) []string {
	var out []string
	for _, v := range p.q[name] {
		for part := range strings.SplitSeq(v, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	return out
}

func (p *params) has(name string) bool { return p.q.Has(name) }

func (p *params) one(name string) (string, bool, error) {
	vs := p.q[name]
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
		return vs[0], true, nil
	}
	return "", false, &badParam{name, "given more than once"}
}

func (p *params) int(name string, def, lo, hi int) (int, error) {
	v, ok, err := p.one(name)
	if err != nil || !ok {
		return def, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, &badParam{name, "not a whole number"}
	}
	if n < lo || n > hi {
		return 0, &badParam{name, fmt.Sprintf("%d is not in [%d, %d]", n, lo, hi)}
	}
	return n, nil
}

func (p *params) float(name string, def, lo, hi float64) (float64, error) {
	v, ok, err := p.one(name)
	if err != nil || !ok {
		return def, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f != f {
		return 0, &badParam{name, "not a number"}
	}
	if f < lo || f > hi {
		return 0, &badParam{name, fmt.Sprintf("%g is not in [%g, %g]", f, lo, hi)}
	}
	return f, nil
}

// time reads unix milliseconds.
func (p *params) time(name string) (time.Time, error) {
	v, ok, err := p.one(name)
	if err != nil || !ok {
		return time.Time{}, err
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > 1<<50 {
		return time.Time{}, &badParam{name, "want unix milliseconds"}
	}
	return time.UnixMilli(ms), nil
}

// selection reads the selection parameters with prefix ("" or "base_");
// fallback, when set, gives the values of those that are absent.
func (p *params) selection(prefix string, fallback *reporter.Selection) (reporter.Selection, error) {
	var s reporter.Selection
	if fallback != nil {
		s = *fallback
	}
	var err error
	if p.has(prefix + "from") {
		if s.From, err = p.time(prefix + "from"); err != nil {
			return s, err
		}
	}
	if p.has(prefix + "to") {
		if s.To, err = p.time(prefix + "to"); err != nil {
			return s, err
		}
	}
	if !s.From.IsZero() && !s.To.IsZero() && !s.From.Before(s.To) {
		return s, &badParam{prefix + "to", "not after from"}
	}
	if p.has(prefix + "pid") {
		s.PIDs = nil
		for _, v := range p.list(prefix + "pid") {
			pid, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return s, &badParam{prefix + "pid", fmt.Sprintf("%q is not a process id", v)}
			}
			s.PIDs = append(s.PIDs, libpf.PID(pid))
		}
	}
	if p.has(prefix + "trace") {
		s.Traces = nil
		for _, v := range p.list(prefix + "trace") {
			id, err := hex.DecodeString(v)
			if err != nil || len(id) != 16 {
				return s, &badParam{prefix + "trace", fmt.Sprintf("%q is not a trace id (32 hex digits)", v)}
			}
			s.Traces = append(s.Traces, [16]byte(id))
		}
	}
	if p.has(prefix + "measure") {
		v, _, err := p.one(prefix + "measure")
		if err != nil {
			return s, err
		}
		if s.Measure = reporter.Measure(v); !s.Measure.Valid() {
			return s, &badParam{prefix + "measure", fmt.Sprintf("%q is not cpu, offcpu, wall, inuse or alloc", v)}
		}
	}
	if p.has(prefix + "label") {
		s.Labels = nil
		for _, v := range p.q[prefix+"label"] {
			key, value, ok := strings.Cut(v, "=")
			if !ok || key == "" {
				return s, &badParam{prefix + "label", fmt.Sprintf("%q is not key=value", v)}
			}
			s.Labels = append(s.Labels, libpf.Label{Key: key, Value: value})
		}
	}
	for name, dst := range map[string]*[]string{
		"process": &s.Processes, "container": &s.Containers, "pod": &s.Pods, "namespace": &s.Namespaces,
		"service": &s.Services,
		"thread":  &s.Threads, "kind": &s.Kinds,
	} {
		if p.has(prefix + name) {
			// Thread and process names may hold commas: only kinds and
			// pids are split.
			if name == "kind" {
				*dst = p.list(prefix + name)
			} else {
				*dst = p.q[prefix+name]
			}
		}
	}
	return s, nil
}

// baseline reads a differential request's baseline: nil when the request
// has no base_ parameter.
func (p *params) baseline(main *reporter.Selection) (*reporter.Selection, error) {
	for _, name := range selectionParams {
		if p.has("base_" + name) {
			b, err := p.selection("base_", main)
			return &b, err
		}
	}
	return nil, nil
}

// withSelection lists the parameters an endpoint takes: its own, the
// selection's, and with diff the baseline's.
func withSelection(diff bool, own ...string) []string {
	out := append([]string(nil), own...)
	out = append(out, selectionParams...)
	if diff {
		for _, s := range selectionParams {
			out = append(out, "base_"+s)
		}
	}
	return out
}

// focus reads a comma-separated path of node ids (hex).
func (p *params) focus() ([]uint64, error) {
	ids := p.list("focus")
	if len(ids) > libpf.MaxFrames+2 {
		return nil, &badParam{"focus", "deeper than any stack"}
	}
	out := make([]uint64, len(ids))
	for i, s := range ids {
		id, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			return nil, &badParam{"focus", fmt.Sprintf("%q is not a node id", s)}
		}
		out[i] = id
	}
	return out, nil
}

// readRequest reads a request's parameters: the selection, with diff its
// baseline (nil without base_ parameters), and the endpoint's own, whose
// names are own. On a bad parameter it has answered 400 and ok is false.
func readRequest(w http.ResponseWriter, r *http.Request, diff bool, own ...string) (
	p *params, sel reporter.Selection, base *reporter.Selection, ok bool) {
	p, err := parseParams(r.URL.RawQuery, withSelection(diff, own...)...)
	if err == nil {
		sel, err = p.selection("", nil)
	}
	if err == nil && diff {
		base, err = p.baseline(&sel)
	}
	if err != nil {
		fail(w, err)
		return nil, sel, nil, false
	}
	return p, sel, base, true
}

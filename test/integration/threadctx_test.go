package integration

import (
	"bufio"
	"encoding/hex"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// spanWindow is one span of the otelspans workload: its thread had its
// record attached from start to end.
type spanWindow struct {
	// thread is the workload's number of the thread (0 or 1).
	thread, tid int
	start, end  time.Time
	traceID     [16]byte
	spanID      [8]byte
}

// parseSpans reads otelspans' "span THREAD TID START END TRACE SPAN"
// lines.
func parseSpans(t *testing.T, out []byte) []spanWindow {
	t.Helper()
	var ws []spanWindow
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) != 7 || f[0] != "span" {
			t.Fatalf("otelspans printed %q", s.Text())
		}
		var w spanWindow
		thread, err0 := strconv.Atoi(f[1])
		tid, err1 := strconv.Atoi(f[2])
		start, err2 := strconv.ParseInt(f[3], 10, 64)
		end, err3 := strconv.ParseInt(f[4], 10, 64)
		trace, err4 := hex.DecodeString(f[5])
		span, err5 := hex.DecodeString(f[6])
		if err := errors.Join(err0, err1, err2, err3, err4, err5); err != nil || len(trace) != 16 || len(span) != 8 {
			t.Fatalf("otelspans printed %q (%v)", s.Text(), err)
		}
		w.thread, w.tid, w.start, w.end = thread, tid, time.Unix(0, start), time.Unix(0, end)
		copy(w.traceID[:], trace)
		copy(w.spanID[:], span)
		ws = append(ws, w)
	}
	return ws
}

// otelSpansBuild is one way of building otelspans: the pointer in the
// executable (static TLS), or in a shared library reached through a TLS
// descriptor, __tls_get_addr or an initial-exec GOT slot; or its Go twin
// (cgo).
type otelSpansBuild struct {
	name string
	// libFlag, when set, puts the pointer in a library built with it
	// (-mtls-dialect=..., -ftls-model=initial-exec).
	libFlag string
	// goWriter builds utils/workloads/otelspansgo instead.
	goWriter bool
}

// spanFunction is the function its threads spin in while in a span.
func (b otelSpansBuild) spanFunction() string {
	if b.goWriter {
		return "main.inSpan"
	}
	return "in_span"
}

func otelSpansBuilds() []otelSpansBuild {
	builds := []otelSpansBuild{{name: "executable"}}
	if targetArch() == "arm64" {
		builds = append(builds, otelSpansBuild{name: "library_desc", libFlag: "-mtls-dialect=desc"},
			otelSpansBuild{name: "library_trad", libFlag: "-mtls-dialect=trad"})
	} else {
		builds = append(builds, otelSpansBuild{name: "library_gnu2", libFlag: "-mtls-dialect=gnu2"},
			otelSpansBuild{name: "library_gnu", libFlag: "-mtls-dialect=gnu"})
	}
	return append(builds, otelSpansBuild{name: "library_initial_exec", libFlag: "-ftls-model=initial-exec"},
		otelSpansBuild{name: "go_cgo", goWriter: true})
}

func buildOtelSpans(t *testing.T, b otelSpansBuild) string {
	t.Helper()
	if b.goWriter {
		bin, _ := buildGo(t, "otelspansgo")
		return bin
	}
	cc := targetToolchain(t).cc
	bin, build := workloadPath(t, "otelspans", "c", "otelspans", b.libFlag)
	if !build {
		return bin
	}
	src := workloadDir("")
	if b.libFlag == "" {
		run(t, src, nil, cc, "-O2", "-pthread", "-Wl,--export-dynamic-symbol=otel_thread_ctx_v1", "-o", bin, "otelspans.c")
		return bin
	}
	lib := filepath.Join(filepath.Dir(bin), "libotelspans.so")
	run(t, src, nil, cc, "-O2", "-shared", "-fPIC", b.libFlag, "-o", lib, "otelspans_lib.c")
	run(t, src, nil, cc, "-O2", "-pthread", "-DTHREAD_CTX_IN_LIB", "-o", bin, "otelspans.c", "-L"+filepath.Dir(bin),
		"-lotelspans", "-Wl,-rpath,$ORIGIN")
	return bin
}

// maxThreadCtxWarmup bounds the time from a process's first sample to its
// first in a span: its set-up, 1 s in the kernel matrix's emulated arm64
// VMs.
const maxThreadCtxWarmup = 3 * time.Second

// threadCtxSlack allows for the time between a sample's timestamp and the
// thread's clock readings around attaching and detaching a record.
const threadCtxSlack = 5 * time.Millisecond

// TestThreadContext runs otelspans, a writer of OpenTelemetry thread
// contexts written from OTEP 4947: two threads go in and out of spans (60
// ms in, 30 ms out), swapping their thread's record pointer. BPF reads the
// record through the pointer at each sample, so a sample taken in a span
// carries its ids (the OTLP link) and attributes, named from the process
// context's key table; none carries a span it was not taken in.
func TestThreadContext(t *testing.T) {
	requireRoot(t)
	builds := otelSpansBuilds()
	bins := map[string]string{}
	for _, b := range builds {
		bins[b.name] = buildOtelSpans(t, b)
	}
	skipIfPreparing(t)
	s := startSession(t, testHz)
	for _, b := range builds {
		t.Run(b.name, func(t *testing.T) {
			cmd := exec.Command(bins[b.name], "4")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", bins[b.name], err)
			}
			windows := parseSpans(t, out)
			s.waitExited(t, cmd.Process.Pid)
			samples := s.rec.ofPID(cmd.Process.Pid)
			first := slices.IndexFunc(samples, func(smp sample) bool { return smp.meta.Span.Valid })
			// Bounded in time: two threads fill samples twice as fast as
			// the single-threaded workloads maxWarmupSamples is for.
			if first < 0 || samples[first].meta.Time.Sub(samples[0].meta.Time) > maxThreadCtxWarmup {
				t.Fatalf("%d samples before the first in a span (-1: none of %d), want them within %v", first,
					len(samples), maxThreadCtxWarmup)
			}
			var inSpan, right, stale int
			for _, smp := range samples[first:] {
				tid, at, sp := int(smp.meta.TID), smp.meta.Time, smp.meta.Span
				inside := func(w spanWindow, slack time.Duration) bool {
					return w.tid == tid && !at.Before(w.start.Add(-slack)) && !at.After(w.end.Add(slack))
				}
				if sp.Valid {
					i := slices.IndexFunc(windows, func(w spanWindow) bool { return w.spanID == sp.SpanID })
					if i < 0 || windows[i].traceID != sp.TraceID || !inside(windows[i], threadCtxSlack) {
						if stale++; stale <= 3 {
							t.Errorf("sample of thread %d at %v carries span %x, not its own", tid, at, sp.SpanID)
						}
					}
				}
				if !slices.Contains(functionNames(smp.trace), b.spanFunction()) {
					continue
				}
				i := slices.IndexFunc(windows, func(w spanWindow) bool { return inside(w, -threadCtxSlack) })
				if i < 0 {
					continue // at a window's edge
				}
				inSpan++
				k := strconv.Itoa(windows[i].thread)
				route, _ := smp.meta.Labels.Get("http.route")
				tenant, _ := smp.meta.Labels.Get("tenant")
				if sp.Valid && sp.SpanID == windows[i].spanID && route == "/api/"+k && tenant == "tenant-"+k {
					right++
				}
			}
			t.Logf("%d of %d samples before the first in a span; in spans: %d of %d (%.1f%%) with the span's ids "+
				"and attributes; %d with a span they were not taken in", first, len(samples), right, inSpan,
				100*float64(right)/float64(max(inSpan, 1)), stale)
			if inSpan == 0 || float64(right) < 0.95*float64(inSpan) {
				t.Errorf("%d of %d samples in spans carry them, want >= 95%%", right, inSpan)
			}
		})
	}
}

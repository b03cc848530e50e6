// Package e2e holds end-to-end tests that run the profiler against a real
// OpenTelemetry Collector (built from utils/collector/builder-config.yaml).
//
// The tests skip unless EBPF_PROFILER_TEST_E2E=1. Run them with
//
//	EBPF_PROFILER_TEST_E2E=1 go test -v -count=1 -timeout=20m ./test/e2e/
//
// Environment:
//
//	EBPF_PROFILER_TEST_E2E=1   enable the tests (the CI script sets it)
//	OTELCOL_BIN           use this collector binary instead of running
//	                      utils/collector/build.sh (a one-time build, cached
//	                      under ${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler)
//	EBPF_PROFILER_TEST_BIN     use this profiler binary instead of building
//	                      ./cmd/ebpf-profiler
//	OTELCOL_E2E_DEBUG     debug exporter verbosity (basic|normal|detailed);
//	                      output ends up in the collector log attached to
//	                      failing tests
//
// TestCollectorAcceptsProfiles exercises only the collector (build, start,
// send a hand-made OTLP profiles request, read back the file exporter's
// output). TestProfilerExportsToCollector runs the profiler daemon and needs
// root.
package e2e

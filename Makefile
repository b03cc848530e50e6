# The two commands the README promises:
#   make run   build the profiler and run it with the local default (pprof files
#              and the web view on http://127.0.0.1:8230/)
#   make test  install what the tests need, then run the whole suite
# An absolute path: sudo's secure_path would not find /usr/local/go/bin.
GO       ?= $(shell command -v go || echo go)
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BINARY   := ebpf-profiler
ARGS     ?=
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: soak build run ebpf check-ebpf test test-deps unit-test integration-test kernel-matrix fuzz bench lint format clean

# A static binary (no cgo): it runs in a minimal container image and on any
# libc.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BINARY) ./cmd/ebpf-profiler

# The web view on loopback, as the README says; ARGS may override it.
WEB_ADDR ?= 127.0.0.1:8230
run: build
	@echo "Web view: http://$(WEB_ADDR)/ (once the profiler has started)"
	$(SUDO) ./$(BINARY) -http=$(WEB_ADDR) $(ARGS)

# Rebuild the committed BPF objects with the pinned compiler.
ebpf:
	$(MAKE) -C support/ebpf

# Fails when the committed BPF objects differ from what the pinned compiler
# builds from the sources.
check-ebpf:
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
	$(MAKE) -s -C support/ebpf -B OUT=$$out && \
	for o in tracer.ebpf.amd64.o tracer.ebpf.arm64.o; do \
		cmp -s support/ebpf/$$o $$out/$$o || { echo "support/ebpf/$$o is stale: run make ebpf and commit it"; exit 1; }; \
	done

# Packages and the OpenTelemetry Collector the tests use (Debian; needs root).
test-deps:
	@echo "make test-deps: at $$(date -u +%T)"
	$(SUDO) ./.ci/install-test-deps.sh

# Formats the Go and C sources (test fixtures under testdata/ stay as
# they were compiled).
format:
	gofmt -w $$(git ls-files '*.go')
	clang-format-16 -i $$(git ls-files '*.c' '*.h' '*.cpp' | grep -v /testdata/)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	clang-format-16 --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cpp' | grep -v /testdata/)

# Everything but the root-only suites under test/.
UNIT_PACKAGES = $$($(GO) list ./... | grep -v /test/)

unit-test:
	$(GO) test -count=1 $(UNIT_PACKAGES)

# BPF integration and end-to-end tests, the tracer's map-loading tests and
# the web view's busy-hour browser test (reporter/webview):
# root only, run one package at a time so that their perf events do not
# share the CPUs.
# The log is kept in out/integration.log; on failure the failed tests are
# listed last, where a CI log's tail shows them.
integration-test: build
	@mkdir -p out
	@{ $(SUDO) env EBPF_PROFILER_TEST_INTEGRATION=1 EBPF_PROFILER_TEST_E2E=1 EBPF_PROFILER_TEST_BIN=$(CURDIR)/$(BINARY) \
		$(GO) test -p 1 -count=1 -v -timeout 35m ./tracer ./test/... ./reporter/webview; \
		echo $$? > out/integration.status; } 2>&1 | tee out/integration.log; \
		status=$$(cat out/integration.status); \
		if [ "$$status" -ne 0 ]; then echo "Failed:"; grep -E '^ *--- FAIL|^FAIL|^panic:' out/integration.log; fi; \
		exit $$status

# The BPF integration tests on every supported kernel (5.10, 6.1, 6.12, 7.2)
# for amd64 and arm64, each booted under qemu (utils/kernelmatrix; kernels
# are downloaded once and cached), the arm64 VMs (runtime tests) one at a
# time, the amd64 VMs two at a time; their serial logs are kept in
# out/kernelmatrix. KERNEL_MATRIX_ARGS narrows it, e.g.
# "-kernels 5.10 -arch arm64 -v".
KERNEL_MATRIX_ARGS ?=
kernel-matrix:
	$(SUDO) $(GO) run ./utils/kernelmatrix $(KERNEL_MATRIX_ARGS)

# Coverage-guided fuzzing of each parser of outside input (go test alone
# only replays the seed corpus).
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target
# with "context deadline exceeded" when a duration runs out while a worker
# is busy (go.dev/issue/75804, fixed in 1.27); a count has no deadline.
# 50,000 inputs take 1-3 s per target here.
FUZZ_TIME    ?= 50000x
# Every Fuzz function in the tree, as package:name (found, not listed: a
# hand-kept list went stale when FuzzParseELF and FuzzNotes moved, and go
# test only warns "no fuzz tests to fuzz").
FUZZ_TARGETS := $(shell git grep -o '^func Fuzz[A-Za-z0-9_]*' -- '*_test.go' | sed -E 's,^(.*)/[^/:]*:func ,\1:,')

fuzz:
	@test -n "$(FUZZ_TARGETS)" || { echo "fuzz: no Fuzz functions found (git grep needs a git checkout)"; exit 1; }
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; f=$${t#*:}; \
		echo "fuzzing $$pkg $$f ($(FUZZ_TIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZ_TIME) -fuzzminimizetime 0 ./$$pkg || exit 1; \
	done

# Each step's start time is printed: make test's time on a fresh machine
# is a target (docs/testing.md).
test: test-deps lint
	@echo "make test: unit tests at $$(date -u +%T)"
	$(SUDO) $(GO) test -count=1 $(UNIT_PACKAGES)
	@echo "make test: fuzz at $$(date -u +%T)"
	$(MAKE) fuzz
	@echo "make test: integration tests at $$(date -u +%T)"
	$(MAKE) integration-test
	@echo "make test: kernel matrix at $$(date -u +%T)"
	$(MAKE) kernel-matrix
	@echo "make test: done at $$(date -u +%T)"

bench: build
	$(SUDO) $(GO) run ./utils/bench -bin ./$(BINARY) $(BENCH_ARGS)

# An hour of the daemon under a rotating mix of runtimes, process churn, a
# ten-minute collector outage and the web view polled every second: its
# memory and goroutines must stay flat after ten minutes, and every sample
# reach the collector or be counted lost. Readings and plot go to
# docs/soak/. SOAK_TIME shortens it.
SOAK_TIME ?= 1h
soak: build
	$(SUDO) $(GO) run ./utils/bench -bin ./$(BINARY) -soak $(SOAK_TIME) -soak-out docs/soak

# Every build output in the tree (.gitignore lists them): the daemon, a
# command under utils/ built in the top directory, the browser tests'
# artifacts, the Rust workload's target.
clean:
	rm -rf $(BINARY) bench cgochain gochain goinline kernelmatrix pyoffsets stackdeltas vminit out \
		utils/workloads/rustchain/target

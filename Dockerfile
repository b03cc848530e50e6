# The ebpf-profiler container image: a builder stage with Go and the pinned
# BPF compiler, and a minimal runtime stage holding only the static binary
# `make build` produces. The builder's steps run outside Docker in the test
# suite too (test/e2e TestDockerfileBuildSteps), so keep them plain shell.
#
# Build (from a git checkout; the version and commit come from .git):
#   docker build -t ebpf-profiler .
#   docker buildx build --platform linux/arm64 -t ebpf-profiler:arm64 .
#
# Run (README: "Run in a container"):
#   docker run -d --name ebpf-profiler --restart=unless-stopped \
#     --privileged --pid=host --uts=host \
#     -v /sys/kernel/tracing:/sys/kernel/tracing \
#     -v /sys/fs/bpf:/sys/fs/bpf \
#     -v /etc/machine-id:/etc/machine-id:ro \
#     -v /var/lib/ebpf-profiler:/var/lib/ebpf-profiler \
#     -e EBPF_PROFILER_COLLECTION_AGENT=collector.example:4317 \
#     ebpf-profiler
# --pid=host shows the host's processes in /proc; --privileged grants BPF,
# perf events and /proc/PID access; --uts=host and /etc/machine-id give
# the host's host.name and host.id.

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS builder
# The BPF compiler is pinned: the committed objects must be byte-identical
# to what it produces (make check-ebpf).
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    clang-16=1:16.0.6-15~deb12u1 llvm-16=1:16.0.6-15~deb12u1 make git
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETARCH
RUN make check-ebpf && GOARCH=$TARGETARCH make build

FROM gcr.io/distroless/static-debian12
COPY --from=builder /src/ebpf-profiler /usr/local/bin/ebpf-profiler
ENTRYPOINT ["/usr/local/bin/ebpf-profiler"]

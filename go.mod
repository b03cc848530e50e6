module github.com/hostprof/ebpf-profiler

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/google/pprof v0.0.0-20260906184651-6331bc6350fe
	github.com/ianlancetaylor/demangle v0.0.0-20250417193237-f615e6bd150b
	github.com/sirupsen/logrus v1.10.2
	github.com/zeebo/xxh3 v1.1.0
	go.opentelemetry.io/proto/slim/otlp v1.11.0
	go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development v0.4.0
	go.opentelemetry.io/proto/slim/otlp/profiles/v1development v0.4.0
	golang.org/x/arch v0.33.0
	golang.org/x/sys v0.49.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
	k8s.io/cri-api v0.37.2
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

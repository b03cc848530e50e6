// Command otelctxgo is the Go twin of utils/workloads/otelctx.c: it
// publishes an OpenTelemetry process context (package procctx, written
// from OTEP 4719), then updates it while it runs.
//
// Usage: otelctxgo SECONDS UPDATE_AT SERVICE (as otelctx: service.version
// 1.0 in main.beforeUpdate, 2.0 in main.afterUpdate, "updated <ns>" printed
// between them; telemetry.sdk.language=go).
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/hostprof/ebpf-profiler/utils/workloads/internal/procctx"
)

var sink uint64

//go:noinline
func spin(until time.Time) {
	for time.Now().Before(until) {
		for i := uint64(0); i < 100_000; i++ {
			sink += i * i
		}
	}
}

//go:noinline
func beforeUpdate(until time.Time) { spin(until) }

//go:noinline
func afterUpdate(until time.Time) { spin(until) }

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: otelctxgo SECONDS UPDATE_AT SERVICE")
		os.Exit(2)
	}
	seconds, err1 := strconv.ParseFloat(os.Args[1], 64)
	at, err2 := strconv.ParseFloat(os.Args[2], 64)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "SECONDS and UPDATE_AT are numbers")
		os.Exit(2)
	}
	start := time.Now()
	ctx, err := procctx.Publish(os.Args[3], "1.0", nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "publishing the process context:", err)
		os.Exit(1)
	}
	beforeUpdate(start.Add(time.Duration(at * float64(time.Second))))
	ctx.Update(os.Args[3], "2.0", nil)
	fmt.Printf("updated %d\n", time.Now().UnixNano())
	afterUpdate(start.Add(time.Duration(seconds * float64(time.Second))))
}

// Package reporter owns everything that happens to samples after they are
// converted into traces: counting them per reporting interval, and at the end
// of each interval exporting them as OTLP profiles over gRPC to a collector
// and/or writing them locally as a gzipped pprof file with a logged summary of
// the hottest functions.
//
// The hot path (ReportSample) only appends a timestamp to the current
// interval under a mutex. Building requests and files happens once per
// interval on the reporter's own goroutine, and network I/O on a separate
// export goroutine fed by a bounded queue, so a slow or absent collector never
// stalls sampling.
package reporter

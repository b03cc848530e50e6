package reporter

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Defaults for the optional Config fields that are zero.
const (
	defaultMaxQueuedRequests     = 8
	defaultMaxOutputFiles        = 720 // one hour of files at the default 5s interval
	defaultMaxSamplesPerInterval = 1 << 20
	defaultFirstInterval         = 250 * time.Millisecond
	defaultFlushTimeout          = 3 * time.Second
	defaultSpoolBytes            = 256 << 20
	defaultSpoolReplayRate       = 1 << 20
)

// Config says where and how often the reporter exports.
type Config struct {
	// CollectionAgent is the collector's host:port; empty disables OTLP export.
	CollectionAgent string
	// DisableTLS sends OTLP in plain text instead of TLS; it excludes CAFile,
	// ClientCertFile and ClientKeyFile.
	DisableTLS bool
	// CAFile is a PEM file of CA certificates that replaces the system roots
	// for verifying the collector; empty keeps the system roots. New reads it.
	CAFile string
	// ClientCertFile and ClientKeyFile are the PEM certificate and key the
	// reporter presents to the collector for mutual TLS; set both or neither.
	// New loads them, and a handshake reloads them when either file changed,
	// so a rotated certificate is used without restarting.
	ClientCertFile, ClientKeyFile string
	// Interval is how often collected samples are exported.
	Interval time.Duration
	// FirstInterval is how often the reporter looks for samples to export
	// until it has exported once, so that a daemon just started shows its
	// first profile soon: started when sampling starts, it exports the
	// first FirstInterval of samples. Zero means a quarter second (or
	// Interval, if shorter).
	FirstInterval time.Duration
	// SamplesPerSecond is the sampling frequency; the profile period is
	// 1e9/SamplesPerSecond nanoseconds.
	SamplesPerSecond int
	// OutputDir receives one gzipped pprof file per interval; empty disables
	// local files.
	OutputDir string
	// MaxOutputFiles bounds the number of profile-*.pb.gz files kept in
	// OutputDir, oldest deleted first. Zero means 720 (one hour at 5s);
	// negative means unbounded.
	MaxOutputFiles int
	// TopN is how many functions the per-interval summary logs; 0 disables it.
	TopN int
	// MaxQueuedRequests bounds the OTLP requests waiting to be sent (including
	// the one being retried). When full, the oldest is dropped and counted.
	// Zero means 8.
	MaxQueuedRequests int
	// SpoolDir, when set with a collection agent, keeps the requests that
	// could not be delivered on disk, to be replayed when the collector is
	// back, also by a later run (see package spool); SpoolBytes bounds it
	// (zero: 256 MiB). SpoolReplayBytesPerSecond bounds the replay, so
	// that a collector just back is not flooded (zero: 1 MiB a second).
	SpoolDir                  string
	SpoolBytes                int64
	SpoolReplayBytesPerSecond float64
	// MaxSamplesPerInterval bounds the memory one interval can use; samples
	// beyond it are dropped and counted. Zero means 1<<20.
	MaxSamplesPerInterval int
	// FlushTimeout bounds how long Close tries to send what is still queued.
	// Zero means 3s.
	FlushTimeout time.Duration
	// HostID and HostName become the host.id and host.name resource
	// attributes; see HostMetadata.
	HostID, HostName string
	// Version is the instrumentation scope version.
	Version string
	// History, when set, receives every interval too (the web view's
	// store).
	History *History
}

// withDefaults validates c and fills in the defaults of zero optional fields.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("interval must be positive, got %v", c.Interval))
	}
	if c.SamplesPerSecond <= 0 || c.SamplesPerSecond > 1e9 {
		errs = append(errs, fmt.Errorf("samples per second must be in [1, 1e9], got %d", c.SamplesPerSecond))
	}
	if c.TopN < 0 {
		errs = append(errs, fmt.Errorf("top-N must not be negative, got %d", c.TopN))
	}
	if c.MaxQueuedRequests < 0 {
		errs = append(errs, fmt.Errorf("max queued requests must not be negative, got %d", c.MaxQueuedRequests))
	}
	if c.MaxSamplesPerInterval < 0 {
		errs = append(errs, fmt.Errorf("max samples per interval must not be negative, got %d", c.MaxSamplesPerInterval))
	}
	if c.SpoolBytes < 0 || c.SpoolReplayBytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("spool bound and replay rate must not be negative, got %d and %g", c.SpoolBytes, c.SpoolReplayBytesPerSecond))
	}
	if c.SpoolDir != "" && c.CollectionAgent == "" {
		errs = append(errs, fmt.Errorf("spool directory %s is set without a collection agent", c.SpoolDir))
	}
	if c.FlushTimeout < 0 {
		errs = append(errs, fmt.Errorf("flush timeout must not be negative, got %v", c.FlushTimeout))
	}
	if c.CollectionAgent != "" {
		if err := CheckEndpoint(c.CollectionAgent); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.tlsFileErrors()...)
	if c.CollectionAgent == "" && c.OutputDir == "" && c.TopN == 0 && c.History == nil {
		errs = append(errs, errors.New("no output configured: set a collection agent, an output directory, a top-N summary or a history"))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("invalid reporter config: %w", errors.Join(errs...))
	}
	if c.MaxQueuedRequests == 0 {
		c.MaxQueuedRequests = defaultMaxQueuedRequests
	}
	if c.MaxOutputFiles == 0 {
		c.MaxOutputFiles = defaultMaxOutputFiles
	}
	if c.MaxSamplesPerInterval == 0 {
		c.MaxSamplesPerInterval = defaultMaxSamplesPerInterval
	}
	if c.FlushTimeout == 0 {
		c.FlushTimeout = defaultFlushTimeout
	}
	if c.SpoolBytes == 0 {
		c.SpoolBytes = defaultSpoolBytes
	}
	if c.SpoolReplayBytesPerSecond == 0 {
		c.SpoolReplayBytesPerSecond = defaultSpoolReplayRate
	}
	if c.FirstInterval <= 0 {
		c.FirstInterval = defaultFirstInterval
	}
	c.FirstInterval = min(c.FirstInterval, c.Interval)
	return c, nil
}

// tlsFileErrors reports TLS files that would be silently ignored, and a
// client certificate without its key or the reverse. The files themselves are
// read by New.
func (c Config) tlsFileErrors() []error {
	var errs []error
	for _, f := range []struct{ option, path string }{
		{"CA file", c.CAFile},
		{"client certificate file", c.ClientCertFile},
		{"client key file", c.ClientKeyFile},
	} {
		switch {
		case f.path == "":
		case c.CollectionAgent == "":
			errs = append(errs, fmt.Errorf("%s %s is set without a collection agent", f.option, f.path))
		case c.DisableTLS:
			errs = append(errs, fmt.Errorf("%s %s is set but TLS is disabled", f.option, f.path))
		}
	}
	switch {
	case c.ClientCertFile != "" && c.ClientKeyFile == "":
		errs = append(errs, fmt.Errorf("client certificate file %s is set without a client key file", c.ClientCertFile))
	case c.ClientKeyFile != "" && c.ClientCertFile == "":
		errs = append(errs, fmt.Errorf("client key file %s is set without a client certificate file", c.ClientKeyFile))
	}
	return errs
}

// period is the sampling period in nanoseconds.
func (c Config) period() int64 { return int64(time.Second) / int64(c.SamplesPerSecond) }

// CheckEndpoint checks a collection agent address: host:port with a host
// and a port in 1-65535.

func CheckEndpoint(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("collection agent %q is not host:port: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("collection agent %q has no host", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("collection agent %q has invalid port %q", addr, port)
	}
	return nil
}

// HostMetadata returns the host.id (the machine id) and host.name of this
// host. A missing machine id is reported as an error alongside whatever was
// found, so callers can log it and go on with an empty host id.
func HostMetadata() (hostID, hostName string, err error) {
	// systemd keeps the id in /etc; older dbus-only setups in /var/lib/dbus.
	return hostMetadata([]string{"/etc/machine-id", "/var/lib/dbus/machine-id"})
}

func hostMetadata(idPaths []string) (hostID, hostName string, err error) {
	var errs []error
	hostName, herr := os.Hostname()
	if herr != nil {
		errs = append(errs, fmt.Errorf("reading host name: %w", herr))
	}
	for _, p := range idPaths {
		b, rerr := os.ReadFile(p)
		if rerr != nil {
			errs = append(errs, fmt.Errorf("reading machine id: %w", rerr))
			continue
		}
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, hostName, nil
		}
		errs = append(errs, fmt.Errorf("machine id file %s is empty", p))
	}
	return "", hostName, errors.Join(errs...)
}

package reporter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	collectorpb "go.opentelemetry.io/proto/slim/otlp/collector/profiles/v1development"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/hostprof/ebpf-profiler/utils/testcerts"
)

// serverConfig is a collector's TLS config for 127.0.0.1, optionally
// requiring a client certificate signed by ca.
func serverConfig(t *testing.T, ca *testcerts.CA, requireClientCert bool) *tls.Config {
	t.Helper()
	certPEM, keyPEM := ca.Server(t)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.ClientCAs = x509.NewCertPool()
		tc.ClientCAs.AddCert(ca.Cert)
	}
	return tc
}

// writeFile writes data to dir/name with modification time mtime, set
// explicitly so that change detection does not depend on clock resolution.
func writeFile(t *testing.T, dir, name string, data []byte, mtime time.Time) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsCollector is a fakeCollector that also records, per request, the
// common name of the client certificate ("" for none).
type tlsCollector struct {
	fakeCollector
	clientNames []string // guarded by fakeCollector.mu
}

func (c *tlsCollector) export(ctx context.Context, req *collectorpb.ExportProfilesServiceRequest) (*collectorpb.ExportProfilesServiceResponse, error) {
	cn := ""
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			cn = ti.State.PeerCertificates[0].Subject.CommonName
		}
	}
	c.mu.Lock()
	c.clientNames = append(c.clientNames, cn)
	c.mu.Unlock()
	return c.fakeCollector.export(ctx, req)
}

func (c *tlsCollector) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.clientNames)
}

// serveTLS runs c with TLS on addr until stop is called or the test ends.
func serveTLS(t *testing.T, addr string, c *tlsCollector, tc *tls.Config) (string, func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)), grpc.StatsHandler(&c.fakeCollector))
	s.RegisterService(profilesServiceDesc(), c)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String(), s.Stop
}

// exportFailure is the error of the warning that starts an outage.
func exportFailure(hook *logtest.Hook) string {
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.HasPrefix(e.Message, "OTLP export failing") {
			if err, ok := e.Data[logrus.ErrorKey].(error); ok {
				return err.Error()
			}
		}
	}
	return ""
}

func TestTLSExport(t *testing.T) {
	ca := testcerts.NewCA(t, "reporter test CA")
	tests := []struct {
		name              string
		requireClientCert bool
		caFile            bool
		clientCert        bool
		// wantNames are the client names the collector sees; nil means the
		// export must fail, with an error containing wantErr if set.
		wantNames []string
		wantErr   string
	}{
		{name: "CA file", caFile: true, wantNames: []string{""}},
		{name: "system roots", wantErr: "certificate signed by unknown authority"},
		{name: "client certificate", requireClientCert: true, caFile: true, clientCert: true, wantNames: []string{"a"}},
		// In TLS 1.3 the server checks the client's certificate after the
		// client has finished its handshake, so the client may see the
		// server's alert or only the connection closing.
		{name: "client certificate missing", requireClientCert: true, caFile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			c := &tlsCollector{}
			addr, _ := serveTLS(t, "127.0.0.1:0", c, serverConfig(t, ca, tt.requireClientCert))
			cfg := Config{CollectionAgent: addr, FlushTimeout: time.Second}
			if tt.caFile {
				cfg.CAFile = writeFile(t, dir, "ca.pem", ca.PEM, time.Now())
			}
			if tt.clientCert {
				certPEM, keyPEM := ca.Client(t, "a")
				cfg.ClientCertFile = writeFile(t, dir, "client.pem", certPEM, time.Now())
				cfg.ClientKeyFile = writeFile(t, dir, "client.key", keyPEM, time.Now())
			}
			r, hook := newTestReporterTLS(t, cfg)
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			reportN(t, r, 1)
			if tt.wantNames != nil {
				waitFor(t, "the export", func() bool { return r.Stats().RequestsExported == 1 })
			} else {
				waitFor(t, "a failed export", func() bool { return r.Stats().ExportErrors > 0 })
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkRequests(t, c.requests(), slices.Repeat([]int64{1}, len(tt.wantNames))...)
			if got := c.names(); !slices.Equal(got, tt.wantNames) {
				t.Errorf("collector saw client names %q, want %q", got, tt.wantNames)
			}
			switch got := exportFailure(hook); {
			case tt.wantNames != nil && got != "":
				t.Errorf("export failed: %s", got)
			case tt.wantNames == nil && (got == "" || !strings.Contains(got, tt.wantErr)):
				t.Errorf("export failure = %q, want one containing %q", got, tt.wantErr)
			}
		})
	}
}

func TestTLSClientCertRotation(t *testing.T) {
	ca := testcerts.NewCA(t, "reporter test CA")
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	certA, keyA := ca.Client(t, "a")
	cfg := Config{
		CAFile:         writeFile(t, dir, "ca.pem", ca.PEM, base),
		ClientCertFile: writeFile(t, dir, "client.pem", certA, base),
		ClientKeyFile:  writeFile(t, dir, "client.key", keyA, base),
	}
	serverTLS := serverConfig(t, ca, true)
	first := &tlsCollector{}
	addr, stop := serveTLS(t, "127.0.0.1:0", first, serverTLS)
	cfg.CollectionAgent = addr
	r, hook := newTestReporterTLS(t, cfg)
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	reportN(t, r, 1)
	waitFor(t, "the export as a", func() bool { return r.Stats().RequestsExported == 1 })

	certB, keyB := ca.Client(t, "b")
	writeFile(t, dir, "client.pem", certB, base.Add(time.Minute))
	writeFile(t, dir, "client.key", keyB, base.Add(time.Minute))
	// A new server on the same address makes the client handshake again.
	stop()
	second := &tlsCollector{}
	serveTLS(t, addr, second, serverTLS)
	reportN(t, r, 2)
	waitFor(t, "the export as b", func() bool { return r.Stats().RequestsExported == 2 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	checkRequests(t, first.requests(), 1)
	checkRequests(t, second.requests(), 2)
	if got := first.names(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("first collector saw client names %q, want [a]", got)
	}
	if got := second.names(); !slices.Equal(got, []string{"b"}) {
		t.Errorf("second collector saw client names %q, want [b]", got)
	}
	if n := countLogs(hook, logrus.InfoLevel, "reloaded the client certificate"); n != 1 {
		t.Errorf("reload logged %d times, want once", n)
	}
}

// TestTLSClientCertKeepsLastGood drives the loader directly through a
// rotation that goes wrong before it goes right.
func TestTLSClientCertKeepsLastGood(t *testing.T) {
	ca := testcerts.NewCA(t, "reporter test CA")
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	certA, keyA := ca.Client(t, "a")
	certB, keyB := ca.Client(t, "b")
	logger, hook := logtest.NewNullLogger()
	l := &clientCertLoader{
		certFile: writeFile(t, dir, "client.pem", certA, base),
		keyFile:  writeFile(t, dir, "client.key", keyA, base),
		log:      logrus.NewEntry(logger),
	}
	if _, err := l.refresh(); err != nil {
		t.Fatal(err)
	}
	const warning = "reloading the client certificate failed; using the previous one"
	steps := []struct {
		name     string
		change   func()
		wantCN   string
		warnings int // in total so far
	}{
		{"unchanged", func() {}, "a", 0},
		{"certificate rewritten, key not yet", func() {
			writeFile(t, dir, "client.pem", certB, base.Add(1*time.Minute))
		}, "a", 1},
		{"same broken pair again", func() {}, "a", 1},
		{"touched while still broken", func() {
			writeFile(t, dir, "client.pem", certB, base.Add(2*time.Minute))
		}, "a", 2},
		{"key rewritten", func() {
			writeFile(t, dir, "client.key", keyB, base.Add(2*time.Minute))
		}, "b", 2},
		{"key removed", func() {
			if err := os.Remove(l.keyFile); err != nil {
				t.Fatal(err)
			}
		}, "b", 3},
		{"still removed", func() {}, "b", 3},
	}
	for _, s := range steps {
		s.change()
		cert, err := l.get(&tls.CertificateRequestInfo{})
		if err != nil {
			t.Fatalf("%s: get = %v", s.name, err)
		}
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if leaf.Subject.CommonName != s.wantCN {
			t.Errorf("%s: client certificate CN = %q, want %q", s.name, leaf.Subject.CommonName, s.wantCN)
		}
		if n := countLogs(hook, logrus.WarnLevel, warning); n != s.warnings {
			t.Errorf("%s: %d warnings so far, want %d", s.name, n, s.warnings)
		}
	}
}

func TestTLSConfigErrors(t *testing.T) {
	ca := testcerts.NewCA(t, "reporter test CA")
	dir := t.TempDir()
	now := time.Now()
	certA, keyA := ca.Client(t, "a")
	_, keyB := ca.Client(t, "b")
	caFile := writeFile(t, dir, "ca.pem", ca.PEM, now)
	notPEM := writeFile(t, dir, "not.pem", []byte("not a certificate\n"), now)
	keyOnly := writeFile(t, dir, "key-only.pem", keyA, now)
	corrupt := writeFile(t, dir, "corrupt.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}), now)
	cert := writeFile(t, dir, "client.pem", certA, now)
	key := writeFile(t, dir, "client.key", keyA, now)
	otherKey := writeFile(t, dir, "other.key", keyB, now)
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"valid", Config{CAFile: caFile, ClientCertFile: cert, ClientKeyFile: key}, ""},
		{"missing CA file", Config{CAFile: missing}, "reading CA file " + missing + ": "},
		{"CA file not PEM", Config{CAFile: notPEM}, "CA file " + notPEM + " holds no PEM certificate"},
		{"CA file with a key only", Config{CAFile: keyOnly}, "CA file " + keyOnly + " holds no PEM certificate"},
		{"corrupt CA certificate", Config{CAFile: corrupt}, "parsing certificate 1 of CA file " + corrupt + ": "},
		{"certificate without key", Config{ClientCertFile: cert},
			"client certificate file " + cert + " is set without a client key file"},
		{"key without certificate", Config{ClientKeyFile: key},
			"client key file " + key + " is set without a client certificate file"},
		{"TLS disabled", Config{DisableTLS: true, CAFile: caFile}, "CA file " + caFile + " is set but TLS is disabled"},
		{"mismatched key", Config{ClientCertFile: cert, ClientKeyFile: otherKey},
			"loading client certificate " + cert + " and key " + otherKey + ": tls: private key does not match"},
		{"missing key", Config{ClientCertFile: cert, ClientKeyFile: missing},
			"loading client certificate " + cert + " and key " + missing + ": "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.CollectionAgent, cfg.Interval, cfg.SamplesPerSecond = "127.0.0.1:4317", time.Second, 20
			checkNew(t, cfg, tt.wantErr)
		})
	}
	t.Run("no collection agent", func(t *testing.T) {
		cfg := Config{ClientCertFile: cert, ClientKeyFile: key, TopN: 1, Interval: time.Second, SamplesPerSecond: 20}
		checkNew(t, cfg, "client key file "+key+" is set without a collection agent")
	})
}

// checkNew checks that New(cfg) fails with an error containing wantErr, or
// succeeds if wantErr is empty.
func checkNew(t *testing.T, cfg Config, wantErr string) {
	t.Helper()
	r, err := New(cfg)
	if err == nil {
		_ = r.Close()
	}
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("New = %v, want nil", err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Errorf("New = %v, want error containing %q", err, wantErr)
	}
}

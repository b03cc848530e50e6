package reporter

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"sync"

	"github.com/sirupsen/logrus"
)

// clientTLS is the TLS config for the connection to the collector. It reads
// the files now so that a bad path fails New instead of every export.
func clientTLS(cfg Config, log *logrus.Entry) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12} // nil RootCAs means the system roots
	if cfg.CAFile != "" {
		pool, err := loadCAFile(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if cfg.ClientCertFile != "" {
		l := &clientCertLoader{certFile: cfg.ClientCertFile, keyFile: cfg.ClientKeyFile, log: log}
		if _, err := l.refresh(); err != nil {
			return nil, err
		}
		tc.GetClientCertificate = l.get
	}
	return tc, nil
}

// loadCAFile parses every certificate in a PEM file. Unlike
// CertPool.AppendCertsFromPEM it does not skip a corrupt certificate, which
// would otherwise surface only as an unknown authority at handshake time.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading CA file %s: %w", path, err)
	}
	pool := x509.NewCertPool()
	n := 0
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate %d of CA file %s: %w", n+1, path, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// fileStamp identifies a version of a file well enough to notice that it was
// replaced: rotation rewrites the file or swaps a symlink, both of which
// change the modification time or the size.
type fileStamp struct{ modNanos, size int64 }

// pairStamp is the stamps of the certificate and the key file.
type pairStamp [2]fileStamp

// clientCertLoader hands the client certificate to each TLS handshake and
// reloads it when its files change, as hosts rotate certificates in place.
type clientCertLoader struct {
	certFile, keyFile string
	log               *logrus.Entry

	mu     sync.Mutex
	cert   *tls.Certificate // the last pair that loaded
	loaded pairStamp        // the files cert was loaded from
	// warnedFor is the failed version already warned about, so a broken
	// pair is logged once per change rather than once per handshake.
	warned    bool
	warnedFor pairStamp
}

// get is tls.Config.GetClientCertificate. A pair that fails to reload does
// not fail the handshake: the previous certificate may well still be valid.
func (l *clientCertLoader) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stamp, err := l.refresh()
	switch {
	case err == nil:
		l.warned = false
	case !l.warned || stamp != l.warnedFor:
		l.warned, l.warnedFor = true, stamp
		l.log.WithError(err).Warn("reloading the client certificate failed; using the previous one")
	}
	return l.cert, nil
}

// refresh loads the pair if it has changed since the last load and returns
// the stamp it saw. The files are stat'ed before being read, so a change
// racing with the load leaves a stale stamp and is picked up next time.
func (l *clientCertLoader) refresh() (pairStamp, error) {
	var stamp pairStamp
	for i, path := range [2]string{l.certFile, l.keyFile} {
		fi, err := os.Stat(path)
		if err != nil {
			return pairStamp{}, fmt.Errorf("loading client certificate %s and key %s: %w", l.certFile, l.keyFile, err)
		}
		stamp[i] = fileStamp{fi.ModTime().UnixNano(), fi.Size()}
	}
	if l.cert != nil && stamp == l.loaded {
		return stamp, nil
	}
	cert, err := tls.LoadX509KeyPair(l.certFile, l.keyFile)
	if err != nil {
		return stamp, fmt.Errorf("loading client certificate %s and key %s: %w", l.certFile, l.keyFile, err)
	}
	if l.cert != nil {
		l.log.WithField("cert_file", l.certFile).Info("reloaded the client certificate")
	}
	l.cert, l.loaded = &cert, stamp
	return stamp, nil
}

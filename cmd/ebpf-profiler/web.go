package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	log "github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/reporter"
	"github.com/hostprof/ebpf-profiler/reporter/webview"
)

// webFlags configure the built-in web view (-http).
type webFlags struct {
	addr       string
	history    time.Duration
	historyMiB int
	authFile   string
	certFile   string
	keyFile    string
	clientCA   string
}

func (w *webFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&w.addr, "http", "",
		"Serve the web view (flame graph, top functions, filters, differential view) on this address, e.g. "+
			"127.0.0.1:8230; a port alone listens on loopback only. Off when empty.")
	fs.DurationVar(&w.history, "http-history", reporter.DefaultHistoryAge,
		"How much time the web view keeps in memory (1m-24h).")
	fs.IntVar(&w.historyMiB, "http-history-mb", reporter.DefaultHistoryBytes>>20,
		"MiB of memory the web view's history may take; the oldest intervals are dropped first.")
	fs.StringVar(&w.authFile, "http-basic-auth-file", "",
		"File holding \"user:password\": the web view then asks for them (HTTP basic authentication; use it with -http-tls-cert-file off loopback).")
	fs.StringVar(&w.certFile, "http-tls-cert-file", "", "PEM certificate: the web view is then served over HTTPS (with -http-tls-key-file).")
	fs.StringVar(&w.keyFile, "http-tls-key-file", "", "PEM private key of -http-tls-cert-file.")
	fs.StringVar(&w.clientCA, "http-client-ca-file", "",
		"PEM CA certificates: the web view then requires HTTPS clients to present a certificate one of them signed.")
}

func (w *webFlags) validate() []error {
	var errs []error
	set := w.addr != ""
	if !set {
		for name, v := range map[string]string{"http-basic-auth-file": w.authFile, "http-tls-cert-file": w.certFile,
			"http-tls-key-file": w.keyFile, "http-client-ca-file": w.clientCA} {
			if v != "" {
				errs = append(errs, fmt.Errorf("-%s needs -http", name))
			}
		}
		return errs
	}
	if _, err := webview.ListenAddr(w.addr); err != nil {
		errs = append(errs, fmt.Errorf("-http: %w", err))
	}
	if w.history < time.Minute || w.history > 24*time.Hour {
		errs = append(errs, fmt.Errorf("-http-history=%v: want 1m to 24h", w.history))
	}
	if w.historyMiB < 1 || w.historyMiB > 1<<16 {
		errs = append(errs, fmt.Errorf("-http-history-mb=%d: want 1 to %d", w.historyMiB, 1<<16))
	}
	if (w.certFile == "") != (w.keyFile == "") {
		errs = append(errs, errors.New("-http-tls-cert-file and -http-tls-key-file go together"))
	}
	if w.clientCA != "" && w.certFile == "" {
		errs = append(errs, errors.New("-http-client-ca-file needs -http-tls-cert-file (client certificates need HTTPS)"))
	}
	return errs
}

// newHistory is the web view's store, or nil when -http is off.
func (w *webFlags) newHistory() (*reporter.History, error) {
	if w.addr == "" {
		return nil, nil
	}
	return reporter.NewHistory(reporter.HistoryConfig{MaxAge: w.history, MaxBytes: int64(w.historyMiB) << 20})
}

// start serves the web view of hist, or does nothing when -http is off.
func (w *webFlags) start(hist *reporter.History, cfg *config, hostName string) (*webview.Server, error) {
	if w.addr == "" {
		return nil, nil
	}
	wc := webview.Config{Addr: w.addr, History: hist, Host: hostName, Version: version,
		SamplesPerSecond: cfg.samplesPerSecond, Interval: cfg.reporterInterval}
	if w.authFile != "" {
		b, err := os.ReadFile(w.authFile)
		if err != nil {
			return nil, fmt.Errorf("-http-basic-auth-file: %w", err)
		}
		wc.BasicAuth = strings.TrimSpace(string(b))
		if wc.BasicAuth == "" {
			return nil, fmt.Errorf("-http-basic-auth-file %s is empty: want a line user:password", w.authFile)
		}
	}
	if w.certFile != "" {
		tc, err := webview.TLSConfig(w.certFile, w.keyFile, w.clientCA)
		if err != nil {
			return nil, err
		}
		wc.TLS = tc
	}
	srv, err := webview.New(wc, log.WithField("component", "webview"))
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	log.Infof("Web view at %s (the last %v, at most %d MiB)", srv.URL(), w.history, w.historyMiB)
	return srv, nil
}

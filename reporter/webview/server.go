// Package webview serves the daemon's built-in web page: a flame graph,
// top functions, filters, a timeline and a differential view of the
// reporter's in-memory history, with no backend. The page's files are
// embedded in the binary; its HTTP API is read-only and described in
// api.md beside this file.
package webview

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/hostprof/ebpf-profiler/reporter"
)

//go:embed assets
var assets embed.FS

// Config says what the server shows and how it is reached.
type Config struct {
	// Addr is host:port to listen on; a port alone (":8230" or "8230")
	// listens on loopback only.
	Addr    string
	History *reporter.History
	// Host, Version, SamplesPerSecond and Interval describe the daemon in
	// the page's header.
	Host             string
	Version          string
	SamplesPerSecond int
	Interval         time.Duration
	// BasicAuth, when set, is "user:password" every request must give.
	BasicAuth string
	// TLS, when set, serves HTTPS with it (a client-certificate
	// requirement is its ClientAuth).
	TLS *tls.Config
}

// Server is the web view's HTTP server.
type Server struct {
	cfg    Config
	log    *logrus.Entry
	static map[string]staticFile
	srv    *http.Server
	ln     net.Listener
	done   chan struct{}
	once   sync.Once
}

type staticFile struct {
	body  []byte
	ctype string
}

// New prepares a server; Start listens.
func New(cfg Config, log *logrus.Entry) (*Server, error) {
	if cfg.History == nil {
		return nil, errors.New("web view: no history to show")
	}
	addr, err := ListenAddr(cfg.Addr)
	if err != nil {
		return nil, err
	}
	cfg.Addr = addr
	if user, pass, ok := strings.Cut(cfg.BasicAuth, ":"); cfg.BasicAuth != "" && (!ok || user == "" || pass == "") {
		return nil, errors.New("web view: basic auth credentials must be user:password, neither empty")
	}
	s := &Server{cfg: cfg, log: log, static: make(map[string]staticFile)}
	entries, err := assets.ReadDir("assets")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		body, err := assets.ReadFile("assets/" + e.Name())
		if err != nil {
			return nil, err
		}
		s.static["/"+e.Name()] = staticFile{body: body, ctype: mime.TypeByExtension(path.Ext(e.Name()))}
	}
	s.static["/"] = s.static["/index.html"]
	return s, nil
}

// ListenAddr is the address -http listens on: a port alone means loopback.
func ListenAddr(addr string) (string, error) {
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		addr = ":" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("web view address %q: want host:port or a port: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// IsLoopback says whether a listen address only accepts local clients.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Start listens and serves until Close.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("web view: %w", err)
	}
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      5 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		// Failed handshakes and the like are the clients' problem.
		ErrorLog: log.New(s.log.WriterLevel(logrus.DebugLevel), "web view: ", 0),
	}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.WithError(err).Error("web view stopped")
		}
	}()
	if !IsLoopback(s.cfg.Addr) && s.cfg.BasicAuth == "" && (s.cfg.TLS == nil || s.cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		s.log.WithField("address", s.cfg.Addr).Warn("the web view is reachable from other hosts without " +
			"authentication: anyone who can connect sees every process's stacks (set -http-basic-auth-file or " +
			"-http-client-ca-file, or listen on 127.0.0.1)")
	} else if !IsLoopback(s.cfg.Addr) {
		s.log.WithField("address", s.cfg.Addr).Warn("the web view listens on a non-loopback address")
	}
	return nil
}

// URL is where the page is, once started.
func (s *Server) URL() string {
	scheme := "http"
	if s.cfg.TLS != nil {
		scheme = "https"
	}
	addr := s.cfg.Addr
	if s.ln != nil {
		addr = s.ln.Addr().String()
	}
	return scheme + "://" + addr + "/"
}

// Close stops serving, giving requests in flight a few seconds.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		if s.srv == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err = s.srv.Shutdown(ctx)
		<-s.done
	})
	return err
}

// Handler serves the page and the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/summary", s.summary)
	mux.HandleFunc("/api/timeline", s.timeline)
	mux.HandleFunc("/api/filters", s.filters)
	mux.HandleFunc("/api/flame", s.flame)
	mux.HandleFunc("/api/top", s.top)
	mux.HandleFunc("/api/pprof", s.pprof)
	mux.HandleFunc("/api/collapsed", s.collapsed)
	mux.HandleFunc("/", s.asset)
	return s.guard(mux)
}

// guard applies what every response needs: read-only methods, basic auth
// and headers that keep the page from being framed or sniffed.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "+
			"frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the web view is read-only", http.StatusMethodNotAllowed)
			return
		}
		if !s.protected() && !localHost(r.Host) {
			// A page elsewhere could point its own name at 127.0.0.1 (DNS
			// rebinding) and read the unprotected view as its own origin;
			// the browser still sends that name.
			http.Error(w, fmt.Sprintf("the web view answers to an IP address, localhost or this host's name, "+
				"not %q (or set -http-basic-auth-file)", r.Host), http.StatusMisdirectedRequest)
			return
		}
		if s.cfg.BasicAuth != "" && !s.authorized(r) {
			h.Set("WWW-Authenticate", `Basic realm="ebpf-profiler", charset="UTF-8"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// protected says whether clients must authenticate: then a request that
// names another host carries no credentials of ours.
func (s *Server) protected() bool {
	return s.cfg.BasicAuth != "" || s.cfg.TLS != nil && s.cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
}

// localHost says whether a request's Host names this machine: an IP
// address, localhost, or the machine's host name.
func localHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if net.ParseIP(strings.Trim(host, "[]")) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	name, err := os.Hostname()
	if err != nil {
		return false
	}
	name = strings.ToLower(name)
	short, _, _ := strings.Cut(name, ".")
	// Exactly: a longer name under it could be anyone's.
	return host == name || host == short
}

func (s *Server) authorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	got := []byte(user + ":" + pass)
	return subtle.ConstantTimeCompare(got, []byte(s.cfg.BasicAuth)) == 1
}

// asset serves the embedded files by exact name; nothing else is read.
func (s *Server) asset(w http.ResponseWriter, r *http.Request) {
	f, ok := s.static[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", f.ctype)
	w.Header().Set("Cache-Control", "no-cache")
	s.write(w, r, f.body)
}

// write sends a body, gzipped when the client takes it and it is worth it.
func (s *Server) write(w http.ResponseWriter, r *http.Request, body []byte) {
	h := w.Header()
	h.Add("Vary", "Accept-Encoding")
	if len(body) > 1024 && acceptsGzip(r) {
		var buf bytes.Buffer
		zw := gzipWriters.Get().(*gzip.Writer)
		zw.Reset(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
		gzipWriters.Put(zw)
		body = buf.Bytes()
		h.Set("Content-Encoding", "gzip")
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// gzipWriters are reused: a new writer's compressor state is over 1 MiB,
// garbage at every answer of a web view polled each second
// (BenchmarkGzippedResponse, a 135 KiB answer: 1.2 MB allocated and 466 µs
// without the pool, 10 KB and 99 µs with it).
var gzipWriters = sync.Pool{New: func() any {
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return zw
}}

func acceptsGzip(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		if enc, _, _ := strings.Cut(strings.TrimSpace(part), ";"); enc == "gzip" {
			return true
		}
	}
	return false
}

func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	s.write(w, r, body)
}

// fail answers a request error: 400 with its message for a bad parameter.
func fail(w http.ResponseWriter, err error) {
	var bp *badParam
	if errors.As(err, &bp) {
		http.Error(w, bp.Error(), http.StatusBadRequest)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// download streams an export as an attachment named after the selection.
func (s *Server) download(w http.ResponseWriter, r *http.Request, name, ctype string,
	export func(io.Writer, reporter.Selection) error) {
	_, sel, _, ok := readRequest(w, r, false)
	if !ok {
		return
	}
	var buf bytes.Buffer
	if err := export(&buf, sel); err != nil {
		http.Error(w, "building the download: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
	if ctype == "application/octet-stream" {
		// Already gzipped.
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		if r.Method != http.MethodHead {
			_, _ = w.Write(buf.Bytes())
		}
		return
	}
	s.write(w, r, buf.Bytes())
}

func (s *Server) pprof(w http.ResponseWriter, r *http.Request) {
	s.download(w, r, "profile-"+time.Now().UTC().Format("20060102T150405Z")+".pb.gz",
		"application/octet-stream", s.cfg.History.WritePprof)
}

func (s *Server) collapsed(w http.ResponseWriter, r *http.Request) {
	s.download(w, r, "stacks-"+time.Now().UTC().Format("20060102T150405Z")+".txt",
		"text/plain; charset=utf-8", s.cfg.History.WriteCollapsed)
}

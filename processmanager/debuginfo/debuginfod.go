package debuginfo

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Debuginfod fetches debug files by build id from debuginfod servers
// (the protocol of elfutils' debuginfod: GET URL/buildid/ID/debuginfo)
// into a local directory laid out as a debug directory,
// DIR/.build-id/xx/yyyy.debug, so that Open finds them there like any
// other. Fetches run in the background, a few at a time; a build id the
// servers do not have is not asked for again for a while.
type Debuginfod struct {
	urls     []string
	dir      string
	client   *http.Client
	maxBytes int64
	retry    time.Duration

	mu      sync.Mutex
	pending map[string]bool
	// failed holds when a build id was last not found, to wait retry.
	failed map[string]time.Time
	slots  chan struct{}
	stats  DebuginfodStats
	wg     sync.WaitGroup
}

// DebuginfodStats count the fetches.
type DebuginfodStats struct {
	Fetched, NotFound, Errors uint64
}

// DebuginfodOptions configure a client.
type DebuginfodOptions struct {
	// URLs are the servers, tried in order.
	URLs []string
	// Dir is the local cache; it is created if missing.
	Dir string
	// MaxBytes bounds one debug file; larger ones are not kept.
	MaxBytes int64
	// Timeout bounds one request; RetryAfter is how long a build id no
	// server had is not asked for again.
	Timeout, RetryAfter time.Duration
	// Parallel is how many fetches run at once.
	Parallel int
}

// NewDebuginfod returns a client; it creates the cache directory.
func NewDebuginfod(opts DebuginfodOptions) (*Debuginfod, error) {
	if len(opts.URLs) == 0 {
		return nil, errors.New("debuginfod: no server URL")
	}
	for _, u := range opts.URLs {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("debuginfod: %q is not an http(s) URL", u)
		}
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, ".build-id"), 0o700); err != nil {
		return nil, fmt.Errorf("debuginfod cache: %w", err)
	}
	return &Debuginfod{
		urls:     opts.URLs,
		dir:      opts.Dir,
		client:   &http.Client{Timeout: opts.Timeout},
		maxBytes: opts.MaxBytes,
		retry:    opts.RetryAfter,
		pending:  map[string]bool{},
		failed:   map[string]time.Time{},
		slots:    make(chan struct{}, max(opts.Parallel, 1)),
	}, nil
}

// Dir is the debug directory the client fills.
func (d *Debuginfod) Dir() string { return d.dir }

// Stats returns the counters.
func (d *Debuginfod) Stats() DebuginfodStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Request starts fetching the debug file of a hex build id unless it is in
// the cache, being fetched, or was not found recently. It does not wait.
func (d *Debuginfod) Request(buildID string) {
	if len(buildID) < 4 || len(buildID) > 128 {
		return
	}
	if _, err := hex.DecodeString(buildID); err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[buildID] || time.Since(d.failed[buildID]) < d.retry {
		return
	}
	if _, err := os.Stat(d.path(buildID)); err == nil {
		return
	}
	d.pending[buildID] = true
	d.wg.Add(1)
	go d.fetch(buildID)
}

// Wait waits for the fetches started so far.
func (d *Debuginfod) Wait() { d.wg.Wait() }

func (d *Debuginfod) path(buildID string) string {
	return filepath.Join(d.dir, ".build-id", buildID[:2], buildID[2:]+".debug")
}

func (d *Debuginfod) fetch(buildID string) {
	defer d.wg.Done()
	d.slots <- struct{}{}
	defer func() { <-d.slots }()
	err := d.download(buildID)
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, buildID)
	switch {
	case err == nil:
		d.stats.Fetched++
	case errors.Is(err, errNotFound):
		d.stats.NotFound++
		d.failed[buildID] = time.Now()
	default:
		d.stats.Errors++
		d.failed[buildID] = time.Now()
	}
}

var errNotFound = errors.New("not found")

// download asks each server in turn and keeps the first answer that is an
// ELF file with the build id asked for.
func (d *Debuginfod) download(buildID string) error {
	want, _ := hex.DecodeString(buildID)
	var errs []error
	for _, u := range d.urls {
		err := d.downloadFrom(strings.TrimSuffix(u, "/")+"/buildid/"+buildID+"/debuginfo", want, d.path(buildID))
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	for _, err := range errs {
		if !errors.Is(err, errNotFound) {
			return errors.Join(errs...)
		}
	}
	return errNotFound
}

func (d *Debuginfod) downloadFrom(url string, buildID []byte, dst string) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(d.client.Timeout, time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return errNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	n, err := io.Copy(tmp, io.LimitReader(resp.Body, d.maxBytes+1))
	if err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	if n > d.maxBytes {
		return fmt.Errorf("%s: larger than %d bytes", url, d.maxBytes)
	}
	ef, err := elf.NewFile(tmp)
	if err != nil {
		return fmt.Errorf("%s: not an ELF file: %w", url, err)
	}
	if got := gnuBuildID(ef); !bytes.Equal(got, buildID) {
		return fmt.Errorf("%s: answered a file of build id %x", url, got)
	}
	return os.Rename(tmp.Name(), dst)
}

package unwindmaps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
)

// DeltaCache keeps extracted stack deltas on disk by file id, so that a
// restarted daemon finds the deltas of large libraries (libLLVM's million
// take 90 ms and 70 MB of allocations to extract) ready. Every file is
// checked before use: one that is not ours, was written by another version,
// or does not check out is removed, with a log line, and the file is
// extracted again. A failed write (a full disk) turns writing off for a
// while; the cache is an optimization, never a condition.
type DeltaCache struct {
	dir      string
	maxBytes int64
	log      logrus.FieldLogger
	uid      int
	now      func() time.Time

	mu sync.Mutex
	// writeOffUntil is when writing may be tried again after a failure.
	writeOffUntil time.Time

	hits, misses, rejected, written, writeErrors atomic.Uint64
}

// DeltaCacheStats counts what the cache did.
type DeltaCacheStats struct {
	// Hits and Misses count loads; Rejected the files found unusable
	// (and removed); Written and WriteErrors the stores.
	Hits, Misses, Rejected, Written, WriteErrors uint64
}

const (
	deltaCacheMagic = "HPDELTA\n"
	// deltaCacheFormat is the layout of the files below; a file of
	// another layout is removed.
	deltaCacheFormat = 1
	// deltaCacheHeader: magic, format, extractor version, file id, rule
	// and delta counts, checksum of the rest.
	deltaCacheHeader = 8 + 4 + 4 + 16 + 4 + 4 + 8
	deltaCacheRule   = 1 + 1 + 4 + 4 + 4
	// Bounds a file's counts and size are checked against before
	// anything is allocated for them.
	maxCachedRules     = 1 << 16
	maxCachedDeltas    = 1 << 24
	maxDeltaCacheFile  = 128 << 20
	deltaCacheWriteOff = 10 * time.Minute
)

// OpenDeltaCache uses dir (created 0700 if missing) for at most maxBytes
// of cached deltas. It refuses a directory another user owns or others may
// write to: its files could then be anyone's.
func OpenDeltaCache(dir string, maxBytes int64, log logrus.FieldLogger) (*DeltaCache, error) {
	if err := libpf.OwnDirectory(dir); err != nil {
		return nil, fmt.Errorf("stack delta cache: %w", err)
	}
	return &DeltaCache{dir: dir, maxBytes: maxBytes, log: log, uid: os.Geteuid(), now: time.Now}, nil
}

// Stats returns the cache's counters.
func (c *DeltaCache) Stats() DeltaCacheStats {
	if c == nil {
		return DeltaCacheStats{}
	}
	return DeltaCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Rejected: c.rejected.Load(),
		Written: c.written.Load(), WriteErrors: c.writeErrors.Load()}
}

func (c *DeltaCache) path(id libpf.FileID) string {
	return filepath.Join(c.dir, fmt.Sprintf("%x.deltas", id[:]))
}

// load is Load on a cache that may be nil (none).
func (c *DeltaCache) load(id libpf.FileID) (deltaSeq, bool) {
	if c == nil || id.IsZero() {
		return deltaSeq{}, false
	}
	return c.Load(id)
}

// store is Store on a cache that may be nil (none).
func (c *DeltaCache) store(id libpf.FileID, d nativeunwind.Deltas) {
	if c != nil && !id.IsZero() {
		c.Store(id, d)
	}
}

// Load returns the cached deltas of a file, if a usable file holds them.
// They are decoded as they are yielded.
func (c *DeltaCache) Load(id libpf.FileID) (deltaSeq, bool) {
	path := c.path(id)
	d, err := c.read(path, id)
	switch {
	case err == nil:
		c.hits.Add(1)
		// Recently used files are the last evicted.
		now := c.now()
		_ = os.Chtimes(path, now, now)
		return d.seq(), true
	case errors.Is(err, os.ErrNotExist):
		c.misses.Add(1)
	default:
		c.misses.Add(1)
		c.rejected.Add(1)
		c.log.Warnf("Stack delta cache: ignoring %s and removing it: %v", path, err)
		_ = os.Remove(path)
	}
	return deltaSeq{}, false
}

// read opens and checks one cache file.
func (c *DeltaCache) read(path string, id libpf.FileID) (*cachedDeltas, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, errors.New("a symbolic link")
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.Mode().IsRegular():
		return nil, errors.New("not a regular file")
	case !ok:
		return nil, errors.New("no owner to check")
	case int(sys.Uid) != c.uid:
		return nil, fmt.Errorf("owned by uid %d, not by the daemon's %d", sys.Uid, c.uid)
	case st.Mode().Perm()&0o022 != 0:
		return nil, fmt.Errorf("others may write to it (mode %v)", st.Mode().Perm())
	case st.Size() < deltaCacheHeader || st.Size() > maxDeltaCacheFile:
		return nil, fmt.Errorf("%d bytes", st.Size())
	}
	b := make([]byte, st.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return parseDeltaCache(b, id)
}

// cachedDeltas are a cache file's deltas, checked and still encoded: they
// are decoded as they are laid out for BPF. Decoded into a slice first, a
// restart's cached deltas were 56 of the 249 MB its set-up allocated in
// its first second (24 bytes a delta, against about 3 encoded).
type cachedDeltas struct {
	rules []nativeunwind.Rule
	// deltas are n pairs of uvarints: the address's step from the one
	// before (the first: the address) and the rule's index.
	deltas []byte
	n      int
}

// seq yields the deltas.
func (c *cachedDeltas) seq() deltaSeq {
	return deltaSeq{n: c.n, all: func(yield func(nativeunwind.Delta) bool) {
		rest := c.deltas
		var addr uint64
		for range c.n {
			// parseDeltaCache checked every pair.
			step, n := binary.Uvarint(rest)
			rest = rest[n:]
			rule, n := binary.Uvarint(rest)
			rest = rest[n:]
			addr += step
			if !yield(nativeunwind.Delta{Address: addr, Rule: c.rules[rule]}) {
				return
			}
		}
	}}
}

// parseDeltaCache checks a cache file's bytes.
func parseDeltaCache(b []byte, id libpf.FileID) (*cachedDeltas, error) {
	le := binary.LittleEndian
	if len(b) < deltaCacheHeader || string(b[:8]) != deltaCacheMagic {
		return nil, errors.New("not a stack delta cache file")
	}
	if format, extractor := le.Uint32(b[8:]), le.Uint32(b[12:]); format != deltaCacheFormat ||
		extractor != nativeunwind.ExtractVersion {
		return nil, fmt.Errorf("written by another version (format %d, extractor %d; this daemon writes %d, %d)",
			format, extractor, deltaCacheFormat, nativeunwind.ExtractVersion)
	}
	if !bytes.Equal(b[16:32], id[:]) {
		return nil, errors.New("holds another file's deltas")
	}
	nRules, nDeltas := le.Uint32(b[32:]), le.Uint32(b[36:])
	payload := b[deltaCacheHeader:]
	if xxh3.Hash(payload) != le.Uint64(b[40:]) {
		return nil, errors.New("checksum mismatch (corrupted)")
	}
	if nRules > maxCachedRules || nDeltas > maxCachedDeltas || uint64(len(payload)) < uint64(nRules)*deltaCacheRule {
		return nil, fmt.Errorf("%d rules, %d deltas in %d bytes", nRules, nDeltas, len(payload))
	}
	rules := make([]nativeunwind.Rule, nRules)
	for i := range rules {
		r := payload[i*deltaCacheRule:]
		rules[i] = nativeunwind.Rule{
			CFA: nativeunwind.CFABase(r[0]), RASigned: r[1]&1 != 0, StackSwitch: r[1]&2 != 0,
			CFAOffset: int32(le.Uint32(r[2:])), FPOffset: int32(le.Uint32(r[6:])), RAOffset: int32(le.Uint32(r[10:])),
		}
	}
	rest := payload[int(nRules)*deltaCacheRule:]
	// Each delta takes at least two bytes: no count beyond what they hold.
	if uint64(nDeltas) > uint64(len(rest))/2 {
		return nil, fmt.Errorf("%d deltas in %d bytes", nDeltas, len(rest))
	}
	body := rest
	for i := range nDeltas {
		step, n := binary.Uvarint(rest)
		if n <= 0 {
			return nil, fmt.Errorf("delta %d: bad address", i)
		}
		rest = rest[n:]
		rule, n := binary.Uvarint(rest)
		if n <= 0 || rule >= uint64(nRules) {
			return nil, fmt.Errorf("delta %d: bad rule", i)
		}
		rest = rest[n:]
		if i > 0 && step == 0 {
			return nil, fmt.Errorf("delta %d: addresses not increasing", i)
		}
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d bytes after the deltas", len(rest))
	}
	return &cachedDeltas{rules: rules, deltas: body, n: int(nDeltas)}, nil
}

// encodeDeltaCache encodes a file's deltas (their Rule.Runtime marks are
// not kept: they are applied after loading).
func encodeDeltaCache(id libpf.FileID, d nativeunwind.Deltas) []byte {
	le := binary.LittleEndian
	index := map[nativeunwind.Rule]uint64{}
	var rules []nativeunwind.Rule
	body := make([]byte, 0, 3*len(d))
	var prev uint64
	for i, delta := range d {
		r := delta.Rule
		r.Runtime = 0
		k, ok := index[r]
		if !ok {
			k = uint64(len(rules))
			index[r] = k
			rules = append(rules, r)
		}
		step := delta.Address - prev
		if i == 0 {
			step = delta.Address
		}
		prev = delta.Address
		body = binary.AppendUvarint(body, step)
		body = binary.AppendUvarint(body, k)
	}
	payload := make([]byte, 0, len(rules)*deltaCacheRule+len(body))
	for _, r := range rules {
		var flags byte
		if r.RASigned {
			flags |= 1
		}
		if r.StackSwitch {
			flags |= 2
		}
		payload = append(payload, byte(r.CFA), flags)
		payload = le.AppendUint32(payload, uint32(r.CFAOffset))
		payload = le.AppendUint32(payload, uint32(r.FPOffset))
		payload = le.AppendUint32(payload, uint32(r.RAOffset))
	}
	payload = append(payload, body...)
	out := make([]byte, 0, deltaCacheHeader+len(payload))
	out = append(out, deltaCacheMagic...)
	out = le.AppendUint32(out, deltaCacheFormat)
	out = le.AppendUint32(out, nativeunwind.ExtractVersion)
	out = append(out, id[:]...)
	out = le.AppendUint32(out, uint32(len(rules)))
	out = le.AppendUint32(out, uint32(len(d)))
	out = le.AppendUint64(out, xxh3.Hash(payload))
	return append(out, payload...)
}

// Store writes a file's deltas, replacing any cache file of it, and evicts
// the least recently used files beyond the size bound. Files too large to
// cache, or with more deltas or rules than a cache file may hold, are not
// written.
func (c *DeltaCache) Store(id libpf.FileID, d nativeunwind.Deltas) {
	if len(d) == 0 || len(d) > maxCachedDeltas {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now().Before(c.writeOffUntil) {
		return
	}
	b := encodeDeltaCache(id, d)
	if len(b) > maxDeltaCacheFile || int64(len(b)) > c.maxBytes {
		return
	}
	if err := c.write(c.path(id), b); err != nil {
		c.writeErrors.Add(1)
		c.writeOffUntil = c.now().Add(deltaCacheWriteOff)
		c.log.Warnf("Stack delta cache: %v; not writing to it for %v", err, deltaCacheWriteOff)
		return
	}
	c.written.Add(1)
	now := c.now()
	_ = os.Chtimes(c.path(id), now, now)
	c.evict()
}

// write puts b at path through a temporary file renamed over it, so that
// no reader sees half a file.
func (c *DeltaCache) write(path string, b []byte) error {
	tmp, err := os.CreateTemp(c.dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// evict removes the least recently used cache files until the rest fit in
// maxBytes, and temporary files a crash left behind.
func (c *DeltaCache) evict() {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	type cached struct {
		path string
		size int64
		used time.Time
	}
	var files []cached
	var total int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		path := filepath.Join(c.dir, e.Name())
		if filepath.Ext(e.Name()) != ".deltas" {
			if c.now().Sub(info.ModTime()) > time.Hour {
				_ = os.Remove(path)
			}
			continue
		}
		files = append(files, cached{path, info.Size(), info.ModTime()})
		total += info.Size()
	}
	slices.SortFunc(files, func(a, b cached) int { return a.used.Compare(b.used) })
	for _, f := range files {
		if total <= c.maxBytes {
			break
		}
		if os.Remove(f.path) == nil {
			total -= f.size
		}
	}
}

package unwindmaps

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/nativeunwind"
	"github.com/hostprof/ebpf-profiler/support"
)

// DeltaMaps writes the BPF maps the native unwinder reads; the tracer
// implements it.
type DeltaMaps interface {
	SetUnwindRule(id uint16, r support.UnwindRule) error
	SetStackDeltas(first uint32, deltas []support.StackDelta) error
	SetDeltaPage(k support.DeltaPageKey, v support.DeltaPage) error
	DeleteDeltaPage(k support.DeltaPageKey) error
	SetPidMapping(k support.PidMappingKey, v support.PidMapping) error
	DeletePidMapping(k support.PidMappingKey) error
	SetKnownFile(k support.FileKey, v support.KnownFile) error
	DeleteKnownFile(k support.FileKey) error
}

// ErrDeltaPoolFull says a file's deltas did not fit in the BPF pool.
var ErrDeltaPoolFull = errors.New("stack delta pool full")

// isMapFull reports whether err says a BPF map or the pool inside one has no
// room: the delta pool, the rule table, a hash map (E2BIG) or the mapping
// trie (ENOSPC).
func isMapFull(err error) bool {
	return errors.Is(err, ErrDeltaPoolFull) || errors.Is(err, errTooManyRules) ||
		errors.Is(err, syscall.E2BIG) || errors.Is(err, syscall.ENOSPC)
}

// Files whose deltas failed to load are not retried for a while, so a
// malformed library mapped by every new process, or a full pool, costs one
// extraction per retry period rather than one per process.
const (
	maxFailedFiles    = 4096
	failedFileBackoff = 5 * time.Minute
)

// transientError wraps a failure that says nothing about the file, such as
// its process exiting while it was opened; it is not remembered.
type transientError struct{ error }

func (e transientError) Unwrap() error { return e.error }

type failedFile struct {
	at  time.Time
	err error
}

// deltaLoader keeps each file's deltas in BPF while some process maps it:
// loaded once per file id, reference counted, freed with the last user.
type deltaLoader struct {
	maps     DeltaMaps
	pageBits uint
	maxRules int
	// flagRASigned and flagStackSwitch are the BPF rule flags for
	// Rule.RASigned and Rule.StackSwitch.
	flagRASigned, flagStackSwitch uint8
	rules                         map[nativeunwind.Rule]uint16
	pool                          spanAllocator
	// slot: spans are multiples of it, so each file starts a pool slot.
	slot  uint32
	files map[uint64]*loadedFile
	// idle lists files that went idle, oldest first; an entry is stale
	// when its file was used again since (see isIdle).
	idle      []idleEntry
	idleFiles int
	failed    *libpf.LRU[uint64, failedFile]
	// keyOwner is the file each key in BPF's known_files names: a key
	// can move to another file when an inode number is reused. The
	// loader's goroutine changes it under keysMu; isKnown reads it from
	// others.
	keyOwner map[support.FileKey]uint64
	keysMu   sync.RWMutex
	now      func() time.Time
}

type loadedFile struct {
	refs  int
	span  span
	pages []uint64
	// keys are the kernel's names for the file that BPF knows it by.
	keys []support.FileKey
	// idleSince is when refs last dropped to 0.
	idleSince time.Time
}

// A file no process maps any more stays loaded for a while, so that short
// processes running the same binaries one after another (shell scripts,
// builds) do not extract and write libc's deltas for each of them. Idle
// files make room when the pool is full.
const (
	idleFileKeep = time.Minute
	maxIdleFiles = 256
)

type idleEntry struct {
	fileID uint64
	since  time.Time
}

func newDeltaLoader(maps DeltaMaps, c support.DeltaCapacity) *deltaLoader {
	return &deltaLoader{
		maps:            maps,
		pageBits:        c.PageBits,
		maxRules:        int(c.Rules),
		flagRASigned:    c.FlagRASigned,
		flagStackSwitch: c.FlagStackSwitch,
		rules:           map[nativeunwind.Rule]uint16{},
		pool:            newSpanAllocator(c.Deltas),
		slot:            max(c.DeltasPerSlot, 1),
		files:           map[uint64]*loadedFile{},
		failed:          libpf.NewLRU[uint64, failedFile](maxFailedFiles, 0),
		keyOwner:        map[support.FileKey]uint64{},
		now:             time.Now,
	}
}

// loaded reports whether a file's deltas are in BPF.
func (l *deltaLoader) loaded(fileID uint64) bool { return l.files[fileID] != nil }

// acquire takes a reference on a file's deltas and reports true, if they
// are loaded.
func (l *deltaLoader) acquire(fileID uint64) bool {
	l.expireIdle(l.now())
	f := l.files[fileID]
	if f == nil {
		return false
	}
	if f.refs == 0 {
		l.idleFiles--
	}
	f.refs++
	return true
}

// failure is the error of a file whose deltas failed to load lately; it is
// not tried again before failedFileBackoff.
func (l *deltaLoader) failure(fileID uint64) error {
	if f, ok := l.failed.Get(fileID); ok && l.now().Sub(f.at) < failedFileBackoff {
		return f.err
	}
	return nil
}

// load writes a file's extracted deltas to BPF, or remembers why there are
// none (err, unless transient). A loaded file has no reference yet: it is
// idle until acquired.
func (l *deltaLoader) load(fileID uint64, deltas deltaSeq, err error) error {
	if err == nil {
		err = l.write(fileID, deltas)
	}
	var transient transientError
	if err != nil && !errors.As(err, &transient) {
		l.failed.Add(fileID, failedFile{at: l.now(), err: err}, 0)
	}
	return err
}

// write lays a file's deltas out in the pool and its pages.
func (l *deltaLoader) write(fileID uint64, deltas deltaSeq) error {
	l.expireIdle(l.now())
	if l.files[fileID] != nil {
		return nil
	}
	runs, all, err := layoutDeltas(deltas, l.pageBits, l.intern)
	if err != nil {
		return err
	}
	size := (uint32(len(all)) + l.slot - 1) / l.slot * l.slot
	sp, ok := l.pool.alloc(size)
	for !ok && l.evictIdle(func(idleEntry) bool { return true }) {
		sp, ok = l.pool.alloc(size)
	}
	if !ok {
		return fmt.Errorf("%w: %d deltas", ErrDeltaPoolFull, len(all))
	}
	f := &loadedFile{span: sp}
	if err := l.maps.SetStackDeltas(sp.start, all); err != nil {
		l.unload(fileID, f)
		return fmt.Errorf("writing stack deltas: %w", err)
	}
	next := sp.start
	for _, r := range runs {
		key := support.DeltaPageKey{FileID: fileID, Page: r.page}
		if err := l.maps.SetDeltaPage(key, support.DeltaPage{First: next, Count: uint32(len(r.deltas))}); err != nil {
			l.unload(fileID, f)
			return fmt.Errorf("writing delta page: %w", err)
		}
		f.pages = append(f.pages, r.page)
		next += uint32(len(r.deltas))
	}
	l.files[fileID] = f
	f.idleSince = l.now()
	l.idle = append(l.idle, idleEntry{fileID, f.idleSince})
	l.idleFiles++
	return nil
}

// release drops a reference. After the last one the file stays loaded
// while idle (see idleFileKeep).
func (l *deltaLoader) release(fileID uint64) {
	f := l.files[fileID]
	if f == nil || f.refs == 0 {
		return
	}
	now := l.now()
	if f.refs--; f.refs == 0 {
		f.idleSince = now
		l.idle = append(l.idle, idleEntry{fileID, now})
		l.idleFiles++
	}
	l.expireIdle(now)
}

// expireIdle unloads files idle for longer than idleFileKeep and the
// oldest beyond maxIdleFiles.
func (l *deltaLoader) expireIdle(now time.Time) {
	for l.evictIdle(func(e idleEntry) bool { return l.idleFiles > maxIdleFiles || now.Sub(e.since) >= idleFileKeep }) {
	}
	if len(l.idle) > 2*l.idleFiles+16 {
		l.idle = slices.DeleteFunc(l.idle, func(e idleEntry) bool { return !l.isIdle(e) })
	}
}

// isIdle reports whether e still describes an idle file.
func (l *deltaLoader) isIdle(e idleEntry) bool {
	f := l.files[e.fileID]
	return f != nil && f.refs == 0 && f.idleSince.Equal(e.since)
}

// evictIdle unloads the file that has been idle longest if evict agrees,
// dropping stale entries on the way. It reports whether it unloaded one.
func (l *deltaLoader) evictIdle(evict func(idleEntry) bool) bool {
	for len(l.idle) > 0 {
		e := l.idle[0]
		if !l.isIdle(e) {
			l.idle = l.idle[1:]
			continue
		}
		if !evict(e) {
			return false
		}
		l.idle = l.idle[1:]
		l.idleFiles--
		f := l.files[e.fileID]
		delete(l.files, e.fileID)
		l.unload(e.fileID, f)
		return true
	}
	return false
}

// knownAs tells BPF that key names a loaded file, whose executable segment
// has the given p_vaddr - p_offset, so that it can resolve the file's PCs
// from a task's VMAs before the process's mappings are in the trie.
func (l *deltaLoader) knownAs(key support.FileKey, kf support.KnownFile) error {
	fileID := kf.FileID
	f := l.files[fileID]
	if f == nil || l.keyOwner[key] == fileID {
		return nil
	}
	if err := l.maps.SetKnownFile(key, kf); err != nil {
		return fmt.Errorf("writing known file: %w", err)
	}
	l.keysMu.Lock()
	l.keyOwner[key] = fileID
	l.keysMu.Unlock()
	f.keys = append(f.keys, key)
	return nil
}

// isKnown says whether BPF's known_files names a loaded file by key; safe
// to call from any goroutine.
func (l *deltaLoader) isKnown(key support.FileKey) bool {
	if key == (support.FileKey{}) {
		return false
	}
	l.keysMu.RLock()
	defer l.keysMu.RUnlock()
	_, ok := l.keyOwner[key]
	return ok
}

func (l *deltaLoader) unload(fileID uint64, f *loadedFile) {
	for _, k := range f.keys {
		if l.keyOwner[k] == fileID {
			_ = l.maps.DeleteKnownFile(k)
			l.keysMu.Lock()
			delete(l.keyOwner, k)
			l.keysMu.Unlock()
		}
	}
	for _, page := range f.pages {
		_ = l.maps.DeleteDeltaPage(support.DeltaPageKey{FileID: fileID, Page: page})
	}
	l.pool.free(f.span)
}

// intern returns the rule table index of a rule, writing new rules to BPF.
// Index 0 is the zero rule (CFA unknown). Rules are few and shared by all
// files, so they are never freed.
func (l *deltaLoader) intern(r nativeunwind.Rule) (uint16, error) {
	if r.CFA == nativeunwind.CFAUnknown {
		return 0, nil
	}
	if id, ok := l.rules[r]; ok {
		return id, nil
	}
	id := len(l.rules) + 1
	if id >= l.maxRules || id > 0xffff {
		return 0, errTooManyRules
	}
	rule := support.UnwindRule{
		CFABase: uint8(r.CFA), Runtime: r.Runtime, CFAOffset: r.CFAOffset, FPOffset: r.FPOffset, RAOffset: r.RAOffset,
	}
	if r.RASigned {
		rule.Flags |= l.flagRASigned
	}
	if r.StackSwitch {
		rule.Flags |= l.flagStackSwitch
	}
	err := l.maps.SetUnwindRule(uint16(id), rule)
	if err != nil {
		return 0, fmt.Errorf("writing unwind rule: %w", err)
	}
	l.rules[r] = uint16(id)
	return uint16(id), nil
}

// rangePrefixes covers [start, end) with aligned power-of-two blocks, each
// given as its first address and the number of leading address bits that
// identify it: the keys of an LPM trie.
func rangePrefixes(start, end uint64) [][2]uint64 {
	var out [][2]uint64
	for start < end {
		size := uint64(1) << 63
		if start != 0 {
			size = start & -start
		}
		for size > end-start {
			size >>= 1
		}
		out = append(out, [2]uint64{start, uint64(64 - bits.TrailingZeros64(size))})
		start += size
		if start == 0 {
			break
		}
	}
	return out
}

// span is a run of slots in the delta pool.
type span struct{ start, len uint32 }

// spanAllocator hands out runs of pool slots, first fit.
type spanAllocator struct {
	holes []span // free runs, sorted by start, never adjacent
}

func newSpanAllocator(size uint32) spanAllocator {
	return spanAllocator{holes: []span{{0, size}}}
}

func (a *spanAllocator) alloc(n uint32) (span, bool) {
	if n == 0 {
		return span{}, true
	}
	for i, f := range a.holes {
		if f.len < n {
			continue
		}
		got := span{f.start, n}
		if f.len == n {
			a.holes = append(a.holes[:i], a.holes[i+1:]...)
		} else {
			a.holes[i] = span{f.start + n, f.len - n}
		}
		return got, true
	}
	return span{}, false
}

func (a *spanAllocator) free(s span) {
	if s.len == 0 {
		return
	}
	i := 0
	for i < len(a.holes) && a.holes[i].start < s.start {
		i++
	}
	a.holes = append(a.holes, span{})
	copy(a.holes[i+1:], a.holes[i:])
	a.holes[i] = s
	// Merge with the neighbours.
	if i+1 < len(a.holes) && a.holes[i].start+a.holes[i].len == a.holes[i+1].start {
		a.holes[i].len += a.holes[i+1].len
		a.holes = append(a.holes[:i+1], a.holes[i+2:]...)
	}
	if i > 0 && a.holes[i-1].start+a.holes[i-1].len == a.holes[i].start {
		a.holes[i-1].len += a.holes[i].len
		a.holes = append(a.holes[:i], a.holes[i+1:]...)
	}
}

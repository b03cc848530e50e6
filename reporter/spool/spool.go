// Package spool is a bounded first-in first-out queue of records on disk:
// what the exporter could not deliver, kept across collector outages and
// daemon restarts.
//
// The queue is a directory of segment files, NNNNNNNNNNNNNNNNNNNN.seg, read
// in the order of their numbers. Records are only ever appended, to the
// newest segment, and each is written with one write and synced before
// Append returns; a daemon that opens the directory writes to a new
// segment, never after a tail it did not write. A record is a header (its
// length, a CRC-32C of the rest, its time and two counts the caller gives)
// and the payload, so a crash or power cut mid-write leaves a torn tail
// that reading detects and skips (counted), not a queue that cannot be
// read. What was read and acknowledged is kept in the file "cursor"
// (checksummed, written in place); whole segments read are deleted. Once
// the queue holds its bound, the oldest segment goes (its records counted as
// dropped).
package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// Record is one queued record.
type Record struct {
	// Time is when the record was made (the caller's, not the write's).
	Time time.Time
	// Samples and Items are the caller's counts of what the payload holds.
	Samples, Items uint32
	Payload        []byte

	// Where Peek read it: its segment and index there, for Ack.
	seq uint64
	idx int
}

// ErrTooLarge is Append's error for a record larger than the bound (or
// 1 GiB): it is dropped, counted.
var ErrTooLarge = errors.New("spool: record larger than the bound")

// Stats are a spool's counters since Open, and what it holds.
type Stats struct {
	// Records and Bytes are what the queue holds now, unread.
	Records int
	Bytes   int64
	// Appended counts records written; Replayed records acknowledged.
	Appended, Replayed uint64
	// Dropped counts records lost unread: the oldest, pushed out by the
	// bound, one larger than the bound, or those after a damaged record in
	// its segment; DroppedSamples sums their Samples (a damaged record's
	// are not known).
	Dropped, DroppedSamples uint64
	// Torn counts damaged records found reading (a torn tail or a bad
	// checksum): the rest of their segment is skipped.
	Torn uint64
	// WriteErrors counts appends that failed (a full disk, an I/O error).
	WriteErrors uint64
}

// headerSize is a record header's length: payload length, CRC-32C (of the
// rest of the header and the payload), unix nanoseconds, the two counts.
const headerSize = 4 + 4 + 8 + 4 + 4

// maxRecord bounds one record's payload, whatever the header says.
const maxRecord = 1 << 30

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segment is one file of the queue.
type segment struct {
	seq uint64
	// size is the file's length up to its last whole record (the writer's
	// segment grows; a damaged one ends before the damage).
	size int64
	// offsets are where its records start (and size where the last ends),
	// samples their Samples.
	offsets []int64
	samples []uint32
}

// Spool is an open queue directory. Its methods are safe for concurrent
// use.
type Spool struct {
	dir      string
	lock     *os.File
	cursor   *os.File // opened at the first Ack
	maxBytes int64
	segBytes int64

	mu   sync.Mutex
	segs []*segment // oldest first; the last is written to
	w    *os.File   // the last segment, open for appending
	// readIdx is the index in segs[0].offsets of the next record to read.
	readIdx int
	stats   Stats
}

// Open opens the queue in dir (created if missing), bounded to maxBytes of
// segment files. The records an earlier daemon left unread are read first.
func Open(dir string, maxBytes int64) (*Spool, error) {
	if maxBytes < 2*headerSize {
		return nil, fmt.Errorf("spool %s: bound %d bytes is too small", dir, maxBytes)
	}
	// Its records are sent to the collector as the daemon's.
	if err := libpf.OwnDirectory(dir); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s := &Spool{dir: dir, lock: lock, maxBytes: maxBytes, segBytes: min(max(maxBytes/8, 64<<10), 32<<20, maxBytes)}
	seqs, err := s.listSegments()
	if err != nil {
		s.Close()
		return nil, err
	}
	curSeq, curOff := s.readCursor()
	// The cursor's block, taken now: acknowledging must work on a disk
	// that filled up since.
	if f, err := os.OpenFile(filepath.Join(dir, "cursor"), os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		s.cursor = f
		if fi, err := f.Stat(); err == nil && fi.Size() < 20 {
			f.WriteAt(make([]byte, 20), 0)
		}
	}
	for _, seq := range seqs {
		if seq < curSeq {
			// Read before the daemon stopped, not deleted yet.
			_ = os.Remove(s.segPath(seq))
			continue
		}
		seg, err := s.scan(seq)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.segs = append(s.segs, seg)
	}
	if len(s.segs) > 0 && s.segs[0].seq == curSeq {
		s.readIdx = len(s.segs[0].offsets)
		for i, off := range s.segs[0].offsets {
			if off >= curOff {
				s.readIdx = i
				break
			}
		}
	}
	// After the cursor's too: segments below it are taken as read.
	next := curSeq + 1
	if n := len(s.segs); n > 0 {
		next = max(next, s.segs[n-1].seq+1)
	}
	if err := s.newSegment(next); err != nil {
		s.Close()
		return nil, err
	}
	s.trimLocked(0)
	return s, nil
}

// lockDir takes the directory's lock file, so that two daemons never
// share a spool; the lock goes with the process.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("spool %s is in use by another process", dir)
		}
		return nil, fmt.Errorf("spool: locking %s: %w", dir, err)
	}
	return f, nil
}

func (s *Spool) segPath(seq uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%020d.seg", seq))
}

func (s *Spool) listSegments() ([]uint64, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var seqs []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if seq, err := strconv.ParseUint(name, 10, 64); err == nil && seq > 0 {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// scan walks the headers of a segment another daemon wrote: its records
// end at the first header that does not fit in the file (a torn tail,
// counted). Checksums are checked when a record is read.
func (s *Spool) scan(seq uint64) (*segment, error) {
	f, err := os.Open(s.segPath(seq))
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	seg := &segment{seq: seq}
	var hdr [headerSize]byte
	for off := int64(0); off < fi.Size(); {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			s.stats.Torn++
			break
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:]))
		if n > maxRecord || off+headerSize+n > fi.Size() {
			s.stats.Torn++
			break
		}
		seg.offsets = append(seg.offsets, off)
		seg.samples = append(seg.samples, binary.LittleEndian.Uint32(hdr[16:]))
		off += headerSize + n
		seg.size = off
	}
	return seg, nil
}

// newSegment starts segment seq for appending.
func (s *Spool) newSegment(seq uint64) error {
	f, err := os.OpenFile(s.segPath(seq), os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if s.w != nil {
		s.w.Close()
	}
	s.w = f
	s.segs = append(s.segs, &segment{seq: seq})
	return nil
}

// Append queues r, written and synced when it returns. Beyond the bound
// the oldest records are dropped (counted); a record that could never fit
// is dropped itself.
func (s *Spool) Append(r Record) error {
	if len(r.Payload) > maxRecord || int64(headerSize+len(r.Payload)) > s.maxBytes {
		s.mu.Lock()
		s.stats.Dropped++
		s.stats.DroppedSamples += uint64(r.Samples)
		s.mu.Unlock()
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, len(r.Payload))
	}
	buf := make([]byte, headerSize+len(r.Payload))
	binary.LittleEndian.PutUint32(buf[0:], uint32(len(r.Payload)))
	binary.LittleEndian.PutUint64(buf[8:], uint64(r.Time.UnixNano()))
	binary.LittleEndian.PutUint32(buf[16:], r.Samples)
	binary.LittleEndian.PutUint32(buf[20:], r.Items)
	copy(buf[headerSize:], r.Payload)
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(buf[8:], castagnoli))

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return errors.New("spool: closed")
	}
	cur := s.segs[len(s.segs)-1]
	// A new segment when this one is full, or when writing to it failed
	// or it was found damaged (no writer).
	if s.w == nil || (cur.size > 0 && cur.size+int64(len(buf)) > s.segBytes) {
		if err := s.newSegment(cur.seq + 1); err != nil {
			s.stats.WriteErrors++
			return err
		}
		cur = s.segs[len(s.segs)-1]
	}
	s.trimLocked(int64(len(buf)))
	_, err := s.w.Write(buf)
	if err == nil {
		err = s.w.Sync()
	}
	if err != nil {
		s.stats.WriteErrors++
		// Cut what was written off, so that the file ends where its
		// index does; failing that, the next record goes to a new
		// segment.
		if terr := s.w.Truncate(cur.size); terr != nil {
			s.w.Close()
			s.w = nil
			return fmt.Errorf("spool: %w (and truncating after it: %v)", err, terr)
		}
		return fmt.Errorf("spool: %w", err)
	}
	cur.offsets = append(cur.offsets, cur.size)
	cur.samples = append(cur.samples, r.Samples)
	cur.size += int64(len(buf))
	s.stats.Appended++
	return nil
}

// trimLocked drops the oldest segments until extra more bytes fit in the
// bound (never the one written to).
func (s *Spool) trimLocked(extra int64) {
	for len(s.segs) > 1 && s.totalLocked()+extra > s.maxBytes {
		old := s.segs[0]
		s.dropLocked(old, s.readIdx)
		_ = os.Remove(s.segPath(old.seq))
		s.segs = s.segs[1:]
		s.readIdx = 0
	}
}

// dropLocked counts seg's records from index from on as dropped.
func (s *Spool) dropLocked(seg *segment, from int) {
	for _, n := range seg.samples[min(from, len(seg.samples)):] {
		s.stats.Dropped++
		s.stats.DroppedSamples += uint64(n)
	}
}

func (s *Spool) totalLocked() int64 {
	var n int64
	for _, seg := range s.segs {
		n += seg.size
	}
	return n
}

// Peek returns the oldest unread record, or false when there is none. A
// damaged record is skipped with the rest of its segment (counted).
func (s *Spool) Peek() (Record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		s.dropReadLocked()
		if len(s.segs) == 0 || s.readIdx >= len(s.segs[0].offsets) {
			return Record{}, false, nil
		}
		seg := s.segs[0]
		r, err := s.readLocked(seg, s.readIdx)
		if err == nil {
			r.seq, r.idx = seg.seq, s.readIdx
			return r, true, nil
		}
		if !errors.Is(err, errDamaged) {
			return Record{}, false, err
		}
		// The rest of the segment cannot be trusted: record lengths
		// chain through it.
		s.stats.Torn++
		s.dropLocked(seg, s.readIdx+1)
		seg.size = seg.offsets[s.readIdx]
		seg.offsets = seg.offsets[:s.readIdx]
		seg.samples = seg.samples[:s.readIdx]
		if len(s.segs) == 1 && s.w != nil {
			// Damaged under the writer: the next record goes to a new
			// segment.
			s.w.Close()
			s.w = nil
		}
	}
}

var errDamaged = errors.New("damaged record")

func (s *Spool) readLocked(seg *segment, idx int) (Record, error) {
	f, err := os.Open(s.segPath(seg.seq))
	if err != nil {
		return Record{}, fmt.Errorf("spool: %w", err)
	}
	defer f.Close()
	start := seg.offsets[idx]
	end := seg.size
	if idx+1 < len(seg.offsets) {
		end = seg.offsets[idx+1]
	}
	buf := make([]byte, end-start)
	if _, err := f.ReadAt(buf, start); err != nil {
		if errors.Is(err, io.EOF) {
			return Record{}, errDamaged
		}
		return Record{}, fmt.Errorf("spool: %w", err)
	}
	le := binary.LittleEndian
	if len(buf) < headerSize || int(le.Uint32(buf[0:])) != len(buf)-headerSize ||
		le.Uint32(buf[4:]) != crc32.Checksum(buf[8:], castagnoli) {
		return Record{}, errDamaged
	}
	return Record{
		Time:    time.Unix(0, int64(le.Uint64(buf[8:]))),
		Samples: le.Uint32(buf[16:]),
		Items:   le.Uint32(buf[20:]),
		Payload: buf[headerSize:],
	}, nil
}

// dropReadLocked deletes the oldest segments once read, except the one
// written to.
func (s *Spool) dropReadLocked() {
	for len(s.segs) > 1 && s.readIdx >= len(s.segs[0].offsets) {
		_ = os.Remove(s.segPath(s.segs[0].seq))
		s.segs = s.segs[1:]
		s.readIdx = 0
	}
}

// Ack marks r, which Peek returned, as read, for good: a daemon started
// later does not read it again. If the bound dropped r meanwhile (an
// Append while it was being sent), it is counted as replayed, not
// dropped.
func (s *Spool) Ack(r Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.segs) == 0 || r.seq < s.segs[0].seq {
		s.stats.Dropped--
		s.stats.DroppedSamples -= uint64(r.Samples)
		s.stats.Replayed++
		return nil
	}
	if r.seq != s.segs[0].seq || r.idx != s.readIdx || s.readIdx >= len(s.segs[0].offsets) {
		return errors.New("spool: acknowledging a record that is not the one to read")
	}
	s.readIdx++
	s.stats.Replayed++
	s.dropReadLocked()
	seg := s.segs[0]
	off := seg.size
	if s.readIdx < len(seg.offsets) {
		off = seg.offsets[s.readIdx]
	}
	return s.writeCursor(seg.seq, off)
}

// writeCursor records that everything before offset off of segment seq
// was read: 20 bytes written in place (no new block, so it works on a full
// disk), checksummed, so that a torn one is seen and everything is read
// again rather than skipped.
func (s *Spool) writeCursor(seq uint64, off int64) error {
	var b [20]byte
	binary.LittleEndian.PutUint64(b[0:], seq)
	binary.LittleEndian.PutUint64(b[8:], uint64(off))
	binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
	if s.cursor == nil {
		f, err := os.OpenFile(filepath.Join(s.dir, "cursor"), os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		s.cursor = f
	}
	if _, err := s.cursor.WriteAt(b[:], 0); err != nil {
		return fmt.Errorf("spool: recording what was read: %w", err)
	}
	return nil
}

// readCursor returns where reading stopped; a missing or damaged cursor
// reads everything again.
func (s *Spool) readCursor() (seq uint64, off int64) {
	b, err := os.ReadFile(filepath.Join(s.dir, "cursor"))
	if err != nil || len(b) != 20 || binary.LittleEndian.Uint32(b[16:]) != crc32.Checksum(b[:16], castagnoli) {
		return 0, 0
	}
	return binary.LittleEndian.Uint64(b[0:]), int64(binary.LittleEndian.Uint64(b[8:]))
}

// Stats returns the counters and what the queue holds.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	for i, seg := range s.segs {
		from := 0
		var fromOff int64
		if i == 0 {
			from = s.readIdx
			if from < len(seg.offsets) {
				fromOff = seg.offsets[from]
			} else {
				fromOff = seg.size
			}
		}
		st.Records += len(seg.offsets) - from
		st.Bytes += seg.size - fromOff
	}
	return st
}

// Close closes the segment written to; the queue stays on disk.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return nil
	}
	var err error
	if s.w != nil {
		err = s.w.Close()
		s.w = nil
	}
	if s.cursor != nil {
		s.cursor.Close()
		s.cursor = nil
	}
	s.lock.Close()
	s.lock = nil
	return err
}
